"""Concurrency primitives for the threaded (sync) flavour: the twin of ``_acompat``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

SYNC = True

Event = threading.Event
Worker = threading.Thread
monotonic = time.monotonic


class CancelledError(BaseException):
    """Never raised in the sync flavour: a sync lease cannot cancel its body, it calls the
    on-lost callbacks and makes ``check()`` raise instead."""


def spawn(fn: Callable[[], None], name: str) -> Worker:
    worker = threading.Thread(target=fn, name=name, daemon=True)
    worker.start()
    return worker


def join(worker: Worker | None) -> None:
    """Wait briefly for a worker thread. A thread blocked on an unreachable database cannot be
    interrupted; it is a daemon, its late renewal fails harmlessly after release."""
    if worker is not None and worker is not threading.current_thread():
        worker.join(timeout=2.0)


def wait_event(event: Event, timeout: float) -> bool:
    if timeout <= 0:
        return event.is_set()
    return event.wait(timeout)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def current_task() -> Any:
    return None


def cancel_task(task: Any) -> None:
    return None


def uncancel(task: Any) -> None:
    return None
