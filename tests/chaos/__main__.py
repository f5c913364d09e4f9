"""``python -m tests.chaos``: the fault-injection run (see tests/chaos/__init__.py).

Exit status: 0 when the checker found no violation (with ``--expect-violations``: when it
found at least one), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .runner import ALL_FAULTS, Config, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="Workers on a few keys with short TTLs under a nemesis; then a checker.",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long faults run")
    parser.add_argument("--workers", type=int, default=6, help="worker processes")
    parser.add_argument("--keys", type=int, default=3, help="job keys they compete for")
    parser.add_argument("--ttl", type=float, default=1.0, help="lease TTL in seconds")
    parser.add_argument(
        "--no-fence",
        action="store_true",
        help="write without tenure.fence and with an unconditional result upsert (must fail)",
    )
    parser.add_argument(
        "--faults",
        default=",".join(ALL_FAULTS),
        help=f"comma-separated subset of {','.join(ALL_FAULTS)}",
    )
    parser.add_argument(
        "--dsn",
        default=None,
        help="use this server instead of starting a throwaway one (it is never restarted)",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="directory for logs")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    parser.add_argument("--expect-violations", action="store_true")
    args = parser.parse_args(argv)
    cfg = Config(
        seconds=args.seconds,
        workers=args.workers,
        keys=args.keys,
        ttl=args.ttl,
        fenced=not args.no_fence,
        faults=tuple(f for f in args.faults.split(",") if f),
        dsn=args.dsn,
        seed=args.seed,
        out=args.out,
    )
    summary = run(cfg)
    print(summary.text())
    if args.json is not None:
        args.json.write_text(summary.to_json())
    found = summary.total_violations > 0
    return 0 if found == args.expect_violations else 1


if __name__ == "__main__":
    sys.exit(main())
