#!/usr/bin/env python
"""What the JSON of a batch costs the worker per run (issue 28: "the JSON built per batch,
orjson only if the benchmark shows it").

The start and the finish each send their batch as one JSON text (``sched_start``'s plans,
``sched_finish``'s runs), built by the worker's own code (``scheduler.claim.start_params``,
``finish_params``). This times those builders for a batch of 1,000 runs, and the part of
them that is ``json.dumps``, beside ``orjson.dumps`` of the same objects when orjson is
installed (``pip install orjson``; tenure does not depend on it), in microseconds per run,
with a fixed reference loop's time so that a slow day's figures can be compared:

    python bench/bench_json.py
    python bench/bench_json.py --batch 200 --rounds 50

Compare the µs/run with the worker's CPU per run that ``bench_scale.py --costs`` prints.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from tenure.scheduler.claim import Claim, Finished, RunIdentity, finish_params, start_params
from tenure.scheduler.schedules import JobState, plan

WHO = {"worker": "w", "host": "h", "pid": 1}


def reference_loop() -> float:
    t = time.perf_counter()
    sum(i * i for i in range(10**7))
    return time.perf_counter() - t


def batches(n: int) -> tuple[list[tuple[Claim, Any]], list[Finished]]:
    """A start batch and a finish batch of ``n`` every-second jobs, as a worker builds them."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    slot = now + dt.timedelta(seconds=1)
    planned, finished = [], []
    for i in range(n):
        state = JobState(slot, now)
        claim = Claim(
            f"job-{i:05d}", uuid.uuid4(), i + 1, now + dt.timedelta(seconds=30), None,
            dt.timedelta(seconds=1), "UTC", dt.timedelta(seconds=30), "latest", None, "retry",
            1, state, now,
        )  # fmt: skip
        decided = plan(claim.schedule(), claim.policy(), claim.state, claim.at, claim.token)
        planned.append((claim, decided))
        ident = RunIdentity(claim.job_key, claim.token, claim.owner, slot, "scheduled", 1, slot)
        finished.append(Finished(ident, True, "succeeded", None, uuid.uuid4()))
    return planned, finished


def per_run(fn: Callable[[], object], n: int, rounds: int) -> float:
    """Median µs per run of ``fn`` (one batch of ``n`` runs per call) over ``rounds``."""
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1000, help="runs per batch")
    parser.add_argument("--rounds", type=int, default=30, help="batches timed (median)")
    args = parser.parse_args()
    n, rounds = args.batch, args.rounds
    planned, finished = batches(n)
    try:
        import orjson  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        orjson = None
    start = start_params(planned, **WHO)
    finish = finish_params(finished, channel="c", **WHO)
    start_obj, finish_obj = json.loads(start["plan"]), json.loads(finish["runs"])
    print(f"loop s {reference_loop():.2f} (a fixed Python loop; 0.39 on a fast day here)")
    print(f"| batch of {n:,} | builder µs/run | json.dumps µs/run | orjson.dumps µs/run |")
    print("|---|---|---|---|")
    for name, build, obj in (
        ("start (sched_start)", lambda: start_params(planned, **WHO), start_obj),
        ("finish (sched_finish)", lambda: finish_params(finished, channel="c", **WHO), finish_obj),
    ):
        whole = per_run(build, n, rounds)
        dumps = per_run(lambda obj=obj: json.dumps(obj, separators=(",", ":")), n, rounds)
        fast = (
            "-"
            if orjson is None
            else f"{per_run(lambda obj=obj: orjson.dumps(obj), n, rounds):.2f}"
        )
        print(f"| {name} | {whole:.2f} | {dumps:.2f} | {fast} |")
    print(f"loop s {reference_loop():.2f}")


if __name__ == "__main__":
    main()
