"""@tenure.once in one process: slots, busy, failures, the context, lost leases."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import tenure
from tenure import metrics
from tenure.exec.slots import slot_state
from tenure.guard import OnceContext

from ..support.examples import parse_slot


@pytest.fixture
def events() -> Iterator[list[metrics.Event]]:
    seen: list[metrics.Event] = []
    unsubscribe = metrics.subscribe(lambda e: seen.append(e) if e.name == metrics.JOB else None)
    yield seen
    unsubscribe()


def test_runs_once_per_slot_then_returns_none(
    client: tenure.Client, events: list[metrics.Event]
) -> None:
    calls: list[int] = []

    @tenure.once("hourly", every="1h", client=client)
    def job(n: int) -> int:
        calls.append(n)
        return n * 2

    assert job(21) == 42
    assert job(5) is None  # same hour: already done
    assert calls == [21]
    assert [e.outcome for e in events] == ["succeeded", "already_done"]
    assert slot_state(client, "hourly", None, 3600).done  # marked done in exec_slots


def test_a_slot_never_runs_more_than_the_early_tolerance_before_its_time(
    client: tenure.Client,
) -> None:
    # At 13:00 a daily job's slot is today's, not tomorrow's (the nearest multiple, which
    # ran up to 12 hours early); in December a yearly cron job's is this year's.
    seen: list[str] = []

    @tenure.once("daily", every="1d", client=client, pass_context=True)
    def daily(ctx: OnceContext) -> None:
        seen.append(ctx.slot)

    @tenure.once("yearly", cron="@yearly", client=client, pass_context=True)
    def yearly(ctx: OnceContext) -> None:
        seen.append(ctx.slot)

    daily()
    yearly()
    assert yearly() is None  # done
    now = client.now().astimezone(dt.UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if now - midnight < dt.timedelta(seconds=5):
        pytest.skip("within the early tolerance of midnight")  # either slot is right then
    assert parse_slot(seen[0]) == midnight
    assert seen[1] == dt.datetime(now.year, 1, 1, tzinfo=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_call_just_before_the_boundary_runs_the_coming_slot(client: tenure.Client) -> None:
    from tenure.guard import slot_tick
    from tenure.scheduler.schedules import Schedule

    every_5m = Schedule.build("k", cron="*/5 * * * *", timezone=None)
    at = dt.datetime(2026, 12, 4, 10, 4, 59, tzinfo=dt.UTC)
    tick, named_until = slot_tick(every_5m, at, 2.0)
    assert tick == dt.datetime(2026, 12, 4, 10, 5, tzinfo=dt.UTC)  # a second early: shared
    assert named_until == dt.datetime(2026, 12, 4, 10, 9, 58, tzinfo=dt.UTC)
    tick, named_until = slot_tick(every_5m, at.replace(second=57), 2.0)
    assert tick == dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.UTC)  # 3 s early: not yet
    assert named_until == dt.datetime(2026, 12, 4, 10, 4, 58, tzinfo=dt.UTC)
    # Exactly on a tick, that tick; with a tolerance over half the gap, half the gap.
    assert slot_tick(every_5m, at.replace(minute=5, second=0), 2.0)[0] == at.replace(
        minute=5, second=0
    )
    assert slot_tick(every_5m, at.replace(minute=2, second=31), 600.0)[0] == at.replace(
        minute=5, second=0
    )
    assert slot_tick(every_5m, at.replace(minute=2, second=29), 600.0)[0] == at.replace(
        minute=0, second=0
    )


def test_a_call_while_another_runs_is_skipped_as_busy(
    client: tenure.Client, events: list[metrics.Event]
) -> None:
    inside, release = threading.Event(), threading.Event()
    calls: list[str] = []

    @tenure.once("slow", every="1h", client=client)
    def job(who: str) -> None:
        calls.append(who)
        inside.set()
        release.wait(10)

    first = threading.Thread(target=job, args=("first",))
    first.start()
    assert inside.wait(10)
    assert job("second") is None
    release.set()
    first.join(10)
    assert calls == ["first"]
    assert sorted(e.outcome for e in events) == ["busy", "succeeded"]


def test_a_failed_run_leaves_the_slot_open(
    client: tenure.Client, events: list[metrics.Event]
) -> None:
    attempts: list[int] = []

    @tenure.once("flaky", every="1h", client=client)
    def job() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("boom")
        return "ok"

    with pytest.raises(RuntimeError, match="boom"):
        job()
    assert job() == "ok"
    assert job() is None
    assert [e.outcome for e in events] == ["failed", "succeeded", "already_done"]


def test_context_gives_token_and_fenced_results(client: tenure.Client) -> None:
    @tenure.once("report", every="1h", client=client, pass_context=True)
    def job(ctx: OnceContext, rows: int) -> int:
        ctx.check()
        ctx.results.put({"rows": rows})
        return ctx.token

    token = job(rows=7)
    assert token is not None
    stored = client.results.get("report")
    assert stored is not None and stored.token == token and stored.payload == {"rows": 7}


def test_lease_lost_while_running_raises_and_leaves_the_slot_open(
    client: tenure.Client, events: list[metrics.Event]
) -> None:
    runs: list[int] = []

    @tenure.once("lost", every="1h", ttl="1s", client=client, pass_context=True)
    def job(ctx: OnceContext) -> None:
        runs.append(ctx.token)
        if len(runs) == 1:
            client.release("lost")  # an operator's forced release: renewals are refused
            for _ in range(100):
                if ctx.cancelled:
                    break
                threading.Event().wait(0.05)
            with pytest.raises(tenure.StaleTokenError):
                ctx.results.put("late")

    with pytest.raises(tenure.LeaseLost):
        job()
    job()  # the slot was not marked done: it runs again, with a higher token
    assert len(runs) == 2 and runs[1] > runs[0]
    assert [e.outcome for e in events] == ["lease_lost", "succeeded"]


def test_signature_hides_the_context() -> None:
    import inspect

    @tenure.once("sig", every="1m", pass_context=True)
    def job(ctx: Any, a: int, b: int = 2) -> None:
        pass

    assert list(inspect.signature(job).parameters) == ["a", "b"]
    assert job.__name__ == "job"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of every"),
        ({"every": "1m", "cron": "* * * * *"}, "exactly one of every"),
        ({"every": "1.5s"}, "whole number of seconds"),
        ({"every": "500ms"}, "at least 1s"),
        ({"cron": "* * *"}, "fields"),
        ({"every": "1m", "timezone": "Europe/Berlin"}, "timezone applies to cron"),
        ({"every": "1m", "ttl": "0s"}, "ttl"),
    ],
)
def test_bad_arguments_say_what_to_do(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(tenure.InvalidArgument, match=message):
        tenure.once("bad", **kwargs)


def test_coroutine_functions_run_on_the_loop_once_per_slot(
    client: tenure.Client, dsn: str, events: list[metrics.Event]
) -> None:
    import asyncio

    import psycopg

    ran: list[int] = []

    @tenure.once("async-job", every="1h", client=client, pass_context=True)
    async def job(ctx: OnceContext, n: int) -> int:
        await asyncio.sleep(0.3)  # the other call arrives while this one holds the lease
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            await ctx.fence_async(conn)
        ran.append(n)
        return n

    async def scenario() -> list[int | None]:
        first = asyncio.create_task(job(1))
        await asyncio.sleep(0.1)
        return [await job(2), await first, await job(3)]

    assert asyncio.run(scenario()) == [None, 1, None]
    assert ran == [1]
    assert sorted(e.outcome for e in events) == ["already_done", "busy", "succeeded"]


def test_the_old_module_is_a_deprecated_alias() -> None:
    """``tenure.contrib.once`` moved to ``tenure.guard`` (it needs no extra); the old import
    still works, with a DeprecationWarning, and names the same objects."""
    import importlib
    import sys

    import tenure.guard

    sys.modules.pop("tenure.contrib.once", None)
    with pytest.warns(DeprecationWarning, match="tenure.guard"):
        old = importlib.import_module("tenure.contrib.once")
    assert old.once is tenure.guard.once is tenure.once
    assert old.OnceContext is tenure.OnceContext
