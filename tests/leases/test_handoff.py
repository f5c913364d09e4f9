"""A waiter takes over when the holder releases or its lease expires, without polling.

Counted in statements, not timed: every attempt of the waiter emits one acquire event
(busy or acquired). A polling waiter (the old behaviour: backoff 0.05 s doubling to 0.5 s)
makes six or more attempts in 1.5 s; a waiter that listens for releases and sleeps until the
expiry it was told makes two busy attempts (the first answer, and one right after it starts
listening) and then one that succeeds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

import tenure
from tenure import metrics


@pytest.fixture
def attempts() -> Iterator[dict[str, list[str]]]:
    """Acquire outcomes per job key, as the client reports them."""
    seen: dict[str, list[str]] = {}
    lock = threading.Lock()

    def listener(event: metrics.Event) -> None:
        if event.name == metrics.ACQUIRE:
            with lock:
                seen.setdefault(event.job, []).append(event.outcome)

    unsubscribe = metrics.subscribe(listener)
    yield seen
    unsubscribe()


def _listening(dsn: str, channel: str) -> bool:
    """Whether some session is waiting in LISTEN on ``channel`` (the waiter started)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s",
            (f'LISTEN "{channel}"',),
        ).fetchone()
    return bool(row and row[0])


def _wait_in_thread(
    client: tenure.Client, key: str, wait: float, got: list[tenure.Lease]
) -> threading.Thread:
    def body() -> None:
        with client.lease(key, ttl=30, wait=wait) as lease:
            got.append(lease)

    thread = threading.Thread(target=body, name="waiter")
    thread.start()
    return thread


def _until(check: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_release_wakes_the_waiter(
    dsn: str, schema: str, client: tenure.Client, attempts: dict[str, list[str]]
) -> None:
    with tenure.connect(dsn, schema=schema) as holder_client:
        holder = holder_client.acquire("job", ttl=60)
        assert holder is not None
        got: list[tenure.Lease] = []
        thread = _wait_in_thread(client, "job", 30, got)
        _until(lambda: _listening(dsn, client.lease_channel), "the waiter to listen")
        time.sleep(1.5)  # a polling waiter would ask five more times meanwhile
        assert holder.release()
        thread.join(20)
    assert got and got[0].token == holder.token + 1
    waiter = attempts["job"][1:]  # the holder's own acquire comes first
    assert waiter == ["busy", "busy", "acquired"], waiter


def test_the_waiter_wakes_at_the_expiry_it_was_told(
    dsn: str, schema: str, client: tenure.Client, attempts: dict[str, list[str]]
) -> None:
    """A holder that stops renewing (a killed process): the waiter asks again at the
    expiry the busy answer named, not one poll interval after it."""
    with tenure.connect(dsn, schema=schema) as holder_client:
        holder = holder_client.acquire("job", ttl=2)  # never renewed
        assert holder is not None
        got: list[tenure.Lease] = []
        thread = _wait_in_thread(client, "job", 30, got)
        thread.join(20)
    assert got and got[0].token == holder.token + 1
    waiter = attempts["job"][1:]
    # Two busy answers (before and after LISTEN), then the attempt at the expiry; one more
    # busy answer is tolerated should the wake-up land a hair before the database's expiry.
    assert waiter[-1] == "acquired" and 2 <= waiter.count("busy") <= 3, waiter


def test_a_release_of_another_key_does_not_wake_the_waiter(
    dsn: str, schema: str, client: tenure.Client, attempts: dict[str, list[str]]
) -> None:
    with tenure.connect(dsn, schema=schema) as holder_client:
        mine = holder_client.acquire("mine", ttl=60)
        other = holder_client.acquire("other", ttl=60)
        assert mine is not None and other is not None
        got: list[tenure.Lease] = []
        thread = _wait_in_thread(client, "mine", 30, got)
        _until(lambda: _listening(dsn, client.lease_channel), "the waiter to listen")
        assert other.release()
        time.sleep(0.5)  # room for a wrong wake-up to show as a third busy answer
        assert mine.release()
        thread.join(20)
    assert got and got[0].token == mine.token + 1
    # No third busy answer from the other key's release (["busy", "acquired"]: on a loaded
    # machine the question after LISTEN came after both releases).
    waiter = attempts["mine"][1:]
    assert waiter in (["busy", "busy", "acquired"], ["busy", "acquired"]), waiter


def test_an_operator_release_wakes_the_waiter(
    dsn: str, schema: str, client: tenure.Client, attempts: dict[str, list[str]]
) -> None:
    with tenure.connect(dsn, schema=schema) as holder_client:
        holder = holder_client.acquire("job", ttl=60)
        assert holder is not None
        got: list[tenure.Lease] = []
        thread = _wait_in_thread(client, "job", 30, got)
        _until(lambda: _listening(dsn, client.lease_channel), "the waiter to listen")
        assert holder_client.release("job") == holder.token
        thread.join(20)
    assert got and got[0].token == holder.token + 1
    # The waiter asks once more right after LISTEN; the release can land before that second
    # question (seen under load), which then acquires. Either way: no polling, and woken by
    # the release (not the 60 s lease or the 30 s wait).
    waiter = attempts["job"][1:]
    assert waiter in (["busy", "busy", "acquired"], ["busy", "acquired"]), waiter


def test_busy_answers_say_how_long_the_lease_has_left(client: tenure.Client) -> None:
    holder = client.acquire("job", ttl=30)
    assert holder is not None
    with pytest.raises(tenure.LeaseBusy) as busy, client.lease("job", ttl=5):
        pass
    assert busy.value.retry_after is not None and 25 < busy.value.retry_after <= 30


def test_the_async_waiter_wakes_on_release(
    dsn: str, schema: str, client: tenure.Client, attempts: dict[str, list[str]]
) -> None:
    holder_token, waiter_token = asyncio.run(asyncio.wait_for(_async_handoff(dsn, schema), 30))
    assert waiter_token == holder_token + 1
    assert attempts["job"][1:] == ["busy", "busy", "acquired"], attempts["job"]


async def _async_handoff(dsn: str, schema: str) -> tuple[int, int]:
    async with await tenure.connect_async(dsn, schema=schema) as client:
        holder = await client.acquire("job", ttl=60)
        assert holder is not None

        async def waiter() -> int:
            async with client.lease("job", ttl=30, wait=30) as lease:
                return lease.token

        task = asyncio.create_task(waiter())
        deadline = time.monotonic() + 20
        while not _listening(dsn, client.lease_channel) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.0)
        assert await holder.release()
        return holder.token, await asyncio.wait_for(task, 20)
