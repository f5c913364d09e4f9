"""``python -m tests.chaos``: :func:`tenure.verify.run` with the restart fault, on a server it
starts itself (see tests/chaos/__init__.py).

Exit status: 0 when the checker found no violation (with ``--expect-violations``: when it
found at least one), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tenure.verify import FAULTS, VerifyConfig, VerifyResult, run
from tenure.verify.config import RESTART
from tests.support.servers import PgServer


def run_with_restarts(
    *,
    seconds: float,
    workers: int,
    keys: int,
    ttl: float = 1.0,
    fenced: bool = True,
    faults: tuple[str, ...] = (*FAULTS, RESTART),
    seed: int | None = None,
    out: Path | None = None,
) -> VerifyResult:
    """One run on a fresh throwaway server that the nemesis may restart."""
    with PgServer(name="chaos") as server:
        cfg = VerifyConfig(
            dsn=server.dsn,
            duration=seconds,
            workers=workers,
            keys=keys,
            ttl=ttl,
            faults=faults,
            fenced=fenced,
            seed=seed,
            out=out,
            restart=server.restart,
        )
        return run(cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long faults run")
    parser.add_argument("--workers", type=int, default=6, help="worker processes")
    parser.add_argument("--keys", type=int, default=3, help="job keys they compete for")
    parser.add_argument("--ttl", type=float, default=1.0, help="lease TTL in seconds")
    parser.add_argument("--no-fence", action="store_true", help="unfenced writes (must fail)")
    parser.add_argument("--faults", default=",".join((*FAULTS, RESTART)))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="directory for logs (kept)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--expect-violations", action="store_true")
    args = parser.parse_args(argv)
    result = run_with_restarts(
        seconds=args.seconds,
        workers=args.workers,
        keys=args.keys,
        ttl=args.ttl,
        fenced=not args.no_fence,
        faults=tuple(f for f in args.faults.split(",") if f),
        seed=args.seed,
        out=args.out,
    )
    print(result.text())
    if args.json is not None:
        args.json.write_text(result.to_json())
    return 0 if (not result.passed) == args.expect_violations else 1


if __name__ == "__main__":
    sys.exit(main())
