#!/usr/bin/env python
"""`tenure exec` start-up benchmark: time from starting `tenure exec` to the command's first
instruction, against a warm database, next to what it cannot avoid.

Sides, run in alternating rounds so that load from anything else on the machine hits them
alike; each sample is "parent's clock just before spawning" to "the command's first
instruction", the command being ``date +%s%N`` (a C program: its first instruction is a
clock read), or the equivalent ``print(time.time_ns())`` for the Python-only sides:

* ``python -c``: a bare interpreter start (the floor of any Python CLI).
* ``python + psycopg acquire``: a bare interpreter that imports psycopg, connects and runs
  tenure's acquire statement once (the floor of any PostgreSQL lease from Python).
* ``tenure exec``: the console script, ``tenure exec --key K -- date +%s%N``.
* ``python -m tenure exec``: the same through ``-m``.
* ``tenure exec --slot``: with a (new) schedule slot: two more round trips.

Also the total wall time of each ``tenure exec`` (until it has released the lease and
exited), and the top import costs of ``python -X importtime -m tenure exec --help``.

Byte-code: an installed package has compiled ``.pyc`` files. If the environment sets
``PYTHONDONTWRITEBYTECODE`` (some containers do), every run would recompile tenure's
sources, so the children get a private ``PYTHONPYCACHEPREFIX`` instead (``--no-pyc`` keeps
the environment as it is, to see the difference).

Run ``python bench/bench_exec.py --help``. No assertion on speed: the target (under 150 ms
to the command) is printed next to the numbers.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

import tenure
from tenure.db.dsn import describe

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
TARGET_MS = 150.0

# The seed's acquire statement, on a seed-shaped table in the bench schema: the cost of one
# lease acquire with nothing of tenure loaded.
SEED_TABLE = """
CREATE TABLE {schema}.bare_leases (
  job_key text primary key,
  lease_owner uuid not null,
  lease_until timestamptz not null,
  fencing_token bigint not null
)"""
SEED_ACQUIRE = """
insert into {schema}.bare_leases (job_key, lease_owner, lease_until, fencing_token)
values (%(job_key)s, %(owner)s, clock_timestamp() + interval '30 seconds', 1)
on conflict (job_key) do update
set lease_owner = excluded.lease_owner,
    lease_until = excluded.lease_until,
    fencing_token = bare_leases.fencing_token + 1
where bare_leases.lease_until < clock_timestamp()
returning fencing_token, lease_until"""
BARE_ACQUIRE = """
import os, sys, time, uuid
import psycopg
conn = psycopg.Connection.connect(os.environ["TENURE_DSN"], autocommit=True)
conn.execute(os.environ["BENCH_ACQUIRE_SQL"].encode(),
             {"job_key": sys.argv[1], "owner": uuid.uuid4()}).fetchall()
print(time.time_ns(), flush=True)
"""


@dataclass
class Side:
    name: str
    argv: Callable[[int], list[str]]
    to_first: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _sample(side: Side, run: int, env: dict[str, str]) -> None:
    start = time.time_ns()
    proc = subprocess.run(side.argv(run), env=env, capture_output=True, text=True, check=False)
    end = time.time_ns()
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SystemExit(f"{side.name}: exit {proc.returncode}: {proc.stderr.strip()}")
    first = int(proc.stdout.split()[0])
    side.to_first.append((first - start) / 1e6)
    side.total.append((end - start) / 1e6)


def _importtime(env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, module) of `python -X importtime -m tenure exec --help`:
    the fastest of three runs (the first may still be compiling)."""
    runs: list[list[tuple[int, int, str]]] = []
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "tenure", "exec", "--help"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        rows = []
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            own, cumulative, name = line[len("import time:") :].split("|")
            rows.append((int(own), int(cumulative), name.rstrip()))
        runs.append(rows)
    return min(runs, key=lambda rows: sum(r[0] for r in rows))


def _import_summary(rows: list[tuple[int, int, str]]) -> str:
    """Total import time and the cumulative time of the packages that matter (nested: the
    ``tenure`` package includes psycopg, which it imports first)."""
    total = sum(own for own, _cum, _name in rows)
    cumulative = {name.strip(): cum for _own, cum, name in rows}
    parts = ", ".join(
        f"{name} {cumulative[name] / 1000:.1f}"
        for name in ("tenure", "psycopg", "psycopg_pool", "click", "tenure.cli")
        if name in cumulative
    )
    return f"all imports {total / 1000:.1f} ms; cumulative ms: {parts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TENURE_DSN", DEFAULT_DSN))
    parser.add_argument("--runs", type=int, default=30, help="samples per side")
    parser.add_argument("--warmup", type=int, default=3, help="unrecorded runs per side")
    parser.add_argument("--top", type=int, default=15, help="import-time rows to print")
    parser.add_argument(
        "--no-pyc",
        action="store_true",
        help="leave PYTHONDONTWRITEBYTECODE as it is (recompile tenure on every start)",
    )
    args = parser.parse_args()

    schema = f"bench_exec_{secrets.token_hex(4)}"
    with tenure.connect(args.dsn, schema=schema, migrate=True):
        pass
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(SEED_TABLE).format(schema=sql.Identifier(schema)))
    pycache = tempfile.mkdtemp(prefix="tenure-bench-pyc-")
    env = dict(os.environ, TENURE_DSN=args.dsn, TENURE_SCHEMA=schema)
    env.pop("DATABASE_URL", None)
    if not args.no_pyc:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    env["BENCH_ACQUIRE_SQL"] = (
        sql.SQL(SEED_ACQUIRE).format(schema=sql.Identifier(schema)).as_string()
    )
    py = sys.executable
    script = str(Path(py).with_name("tenure"))
    date = ["date", "+%s%N"]
    sides = [
        Side(
            "python -c (start-up floor)", lambda i: [py, "-c", "import time; print(time.time_ns())"]
        ),
        Side("python + psycopg acquire", lambda i: [py, "-c", BARE_ACQUIRE, f"bare-{i}"]),
        Side("tenure exec", lambda i: [script, "exec", "--key", f"script-{i}", "--", *date]),
        Side(
            "python -m tenure exec",
            lambda i: [py, "-m", "tenure", "exec", "--key", f"module-{i}", "--", *date],
        ),
        Side(
            "tenure exec --slot",
            lambda i: [script, "exec", "--key", "slot", "--slot", f"s{i}", "--", *date],
        ),
    ]
    if not os.path.exists(script):
        sides = [s for s in sides if s.argv(0)[0] != script]
    try:
        for i in range(args.warmup):
            for side in sides:
                _sample(side, -1 - i, env)
        for side in sides:
            side.to_first.clear()
            side.total.clear()
        for i in range(args.runs):
            order = sides if i % 2 == 0 else list(reversed(sides))
            for side in order:
                _sample(side, i, env)
        imports = _importtime(env)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        shutil.rmtree(pycache, ignore_errors=True)

    print(f"tenure exec start-up on {describe(args.dsn)}, {args.runs} runs per side")
    print(f"python {sys.version.split()[0]}, byte-code: {'as env' if args.no_pyc else 'cached'}")
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    head = f"{'side':30} {'to command p50':>15} {'p95':>8} {'min':>8} {'total p50':>10}"
    print(head)
    print("-" * len(head))
    for side in sides:
        print(
            f"{side.name:30} {statistics.median(side.to_first):12.1f} ms"
            f" {_pct(side.to_first, 0.95):8.1f} {min(side.to_first):8.1f}"
            f" {statistics.median(side.total):10.1f}"
        )
    print()
    by_name = {side.name: side for side in sides}
    exec_side = by_name.get("tenure exec") or by_name["python -m tenure exec"]
    bare = by_name["python + psycopg acquire"]
    floor = by_name["python -c (start-up floor)"]
    p50 = statistics.median(exec_side.to_first)
    print(
        f"{exec_side.name}: p50 {p50:.1f} ms to the command (target < {TARGET_MS:.0f} ms: "
        f"{'met' if p50 < TARGET_MS else 'NOT met'}); "
        f"{p50 - statistics.median(bare.to_first):+.1f} ms over a bare psycopg acquire, "
        f"{p50 - statistics.median(floor.to_first):+.1f} ms over a bare interpreter"
    )
    print()
    print("python -X importtime -m tenure exec --help (fastest of 3):")
    print(_import_summary(imports))
    print(f"{'cumulative':>12} {'self':>9}  module (top {args.top} by cumulative time)")
    for own, cumulative, name in sorted(imports, key=lambda r: -r[1])[: args.top]:
        print(f"{cumulative / 1000:9.1f} ms {own / 1000:6.1f} ms  {name}")


if __name__ == "__main__":
    main()
