"""Concurrency primitives for the asyncio flavour. ``_compat`` has the same names for threads;
tools/async_to_sync.py swaps the import when it generates ``_sync`` from ``_async``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

SYNC = False

Event = asyncio.Event
Worker = asyncio.Task[None]
CancelledError = asyncio.CancelledError
monotonic = time.monotonic


def spawn(fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> Worker:
    return asyncio.create_task(fn(), name=name)


async def join(worker: Worker | None) -> None:
    """Stop a worker: cancel it (it may be waiting on the database) and wait for it."""
    if worker is not None and worker is not asyncio.current_task():
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker


async def wait_event(event: Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True if it was set."""
    if timeout <= 0:
        return event.is_set()
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def current_task() -> asyncio.Task[Any] | None:
    return asyncio.current_task()


def cancel_task(task: asyncio.Task[Any] | None) -> None:
    if task is not None and not task.done():
        task.cancel("tenure: lease lost")


def uncancel(task: asyncio.Task[Any] | None) -> None:
    if task is not None:
        task.uncancel()
