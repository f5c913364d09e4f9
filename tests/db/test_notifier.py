"""The one reconnecting LISTEN loop (:mod:`tenure.db.notifier`), against a real PostgreSQL:
it hears notifications, and when its backend is terminated (pg_terminate_backend, which a
server restart or failover also does) it reconnects, says so, and hears the next ones."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
from psycopg import Notify

from tenure.db.channels import channel
from tenure.db.notifier import Retry, listen_forever

#: A guard against a hang, not a measurement: every step normally takes milliseconds.
GUARD = 30.0


def _notify(dsn: str, name: str, payload: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (name, payload))


def _terminate(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_loop_reconnects_after_its_backend_is_terminated(dsn: str, schema: str) -> None:
    name = channel("jobs", schema)
    app = f"notifier-test-{schema}"

    async def main() -> tuple[list[bool], list[str], int, list[str]]:
        heard: asyncio.Queue[Notify] = asyncio.Queue()
        listening: asyncio.Queue[bool] = asyncio.Queue()
        lost: list[str] = []
        task = asyncio.create_task(
            listen_forever(
                dsn,
                [name],
                heard.put_nowait,
                application_name=app,
                on_listening=listening.put_nowait,
                on_lost=lambda exc, _pause: lost.append(type(exc).__name__),
                retry=Retry(first=0.05, most=0.2),
            )
        )
        try:
            async with asyncio.timeout(GUARD):
                first = await listening.get()
                await asyncio.to_thread(_notify, dsn, name, "before")
                payloads = [(await heard.get()).payload]
                killed = await asyncio.to_thread(_terminate, dsn, app)
                again = await listening.get()
                await asyncio.to_thread(_notify, dsn, name, "after")
                payloads.append((await heard.get()).payload)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return [first, again], payloads, killed, lost

    states, payloads, killed, lost = asyncio.run(main())
    assert killed == 1  # exactly the listening backend
    assert states == [False, True]  # the second LISTEN is reported as a reconnect
    assert payloads == ["before", "after"]
    assert lost  # the failure was reported before the reconnect


def test_the_loop_retries_until_the_server_answers(dsn: str, schema: str) -> None:
    """A connection that cannot be made (a database that does not exist yet) is retried
    with the given backoff, each failure reported with the pause before the next try."""
    bad = psycopg.conninfo.make_conninfo(dsn, dbname=f"missing_{schema}")

    async def main() -> list[float]:
        pauses: list[float] = []
        done = asyncio.Event()

        def lost(_exc: Exception, pause: float) -> None:
            pauses.append(pause)
            if len(pauses) == 4:
                done.set()

        task = asyncio.create_task(
            listen_forever(
                bad,
                [channel("ui", schema)],
                lambda _note: None,
                application_name="notifier-test",
                on_lost=lost,
                retry=Retry(first=0.01, most=0.04),
            )
        )
        try:
            async with asyncio.timeout(GUARD):
                await done.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return pauses

    assert asyncio.run(main()) == [0.01, 0.02, 0.04, 0.04]
