"""Benchmark the hand-off of a lease to a waiting execution.

Two ways a lease ends, each measured on the database clock (no client clock involved):

* **release**: the holder releases; latency = the waiter's ``acquired_at`` minus the release
  time the release statement returned;
* **expiry**: the holder stops renewing (as a SIGKILLed process does); latency = the waiter's
  ``acquired_at`` minus the expiry the holder was granted.

Side by side, in one run, for the same scenario:

* ``poll``: the previous waiting loop, re-created here (ask, sleep 0.05 s doubling to
  0.5 s, ask again): what ``client.lease(wait=...)`` did before it listened for releases;
* ``notify``: ``client.lease(key, wait=...)`` as shipped: LISTEN for the release, sleep until
  the expiry the busy answer named.

Also the statements the waiter sent per second while it waited (its acquire attempts).

    python bench/bench_handoff.py            # 20 rounds of each
    python bench/bench_handoff.py --rounds 5

DSN: --dsn, else $TENURE_DSN, else postgresql://postgres@127.0.0.1:5432/postgres. Works in a
fresh schema, dropped at the end. Figures depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql

import tenure
from tenure import metrics

LOCAL = "postgresql://postgres@127.0.0.1:5432/postgres"
HOLD = (0.5, 1.0)  # how long the waiter waits before the lease ends, seconds (random)


@dataclass
class Round:
    latency_ms: float
    waited_s: float
    attempts: int


def poll_wait(client: tenure.Client, key: str, wait: float) -> tenure.Lease:
    """The previous waiting loop of client.lease(wait=...), for comparison."""
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        lease = client.acquire(key, ttl=30)
        if lease is not None:
            return lease
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(key)
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.5)


def notify_wait(client: tenure.Client, key: str, wait: float) -> tenure.Lease:
    with client.lease(key, ttl=30, wait=wait) as lease:
        return lease  # released on the way out; acquired_at is what the bench reads


def one_round(
    holder_client: tenure.Client,
    waiter_client: tenure.Client,
    waiter: Callable[[tenure.Client, str, float], tenure.Lease],
    how: str,
) -> Round:
    key = f"k-{uuid.uuid4().hex[:8]}"
    hold = random.uniform(*HOLD)
    holder = holder_client.acquire(key, ttl=hold if how == "expiry" else 60)
    assert holder is not None
    attempts = 0

    def count(event: metrics.Event) -> None:
        nonlocal attempts
        if event.name == metrics.ACQUIRE and event.job == key:
            attempts += 1

    unsubscribe = metrics.subscribe(count)
    got: list[tenure.Lease] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: got.append(waiter(waiter_client, key, 30)))
    thread.start()
    try:
        if how == "release":
            time.sleep(hold)
            ended = holder_client.fetch(
                "release",
                {
                    "job_key": key,
                    "owner": holder.owner,
                    "token": holder.token,
                    "channel": holder_client.lease_channel,
                },
                doing="release",
                wrote=True,
            )[0][1]
        else:
            ended = holder.expires_at
        thread.join(30)
    finally:
        unsubscribe()
    waited = time.monotonic() - started
    lease = got[0]
    assert lease.acquired_at is not None
    return Round((lease.acquired_at - ended).total_seconds() * 1000, waited, attempts)


def summarize(rounds: list[Round]) -> tuple[float, float, float, float]:
    lat = sorted(r.latency_ms for r in rounds)
    p50 = statistics.median(lat)
    p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]
    # Attempts while waiting: all but the one that succeeded.
    rate = statistics.mean((r.attempts - 1) / r.waited_s for r in rounds)
    return p50, p95, max(lat), rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TENURE_DSN") or LOCAL)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    schema = f"bench_handoff_{uuid.uuid4().hex[:8]}"
    try:
        with (
            tenure.connect(args.dsn, schema=schema, migrate=True) as holder_client,
            tenure.connect(args.dsn, schema=schema) as waiter_client,
        ):
            rows = []
            for how in ("release", "expiry"):
                for name, waiter in (("poll", poll_wait), ("notify", notify_wait)):
                    rounds = [
                        one_round(holder_client, waiter_client, waiter, how)
                        for _ in range(args.rounds)
                    ]
                    rows.append((how, name, *summarize(rounds)))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print(f"hand-off to a waiter, {args.rounds} rounds each, database clock")
    head = ("lease ends by", "waiter", "p50 ms", "p95 ms", "max ms", "stmts/s waiting")
    print(f"{head[0]:<14} {head[1]:<7} {head[2]:>8} {head[3]:>8} {head[4]:>8} {head[5]:>16}")
    for how, name, p50, p95, worst, rate in rows:
        print(f"{how:<14} {name:<7} {p50:>8.1f} {p95:>8.1f} {worst:>8.1f} {rate:>16.2f}")


if __name__ == "__main__":
    main()
