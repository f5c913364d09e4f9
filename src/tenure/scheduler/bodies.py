"""How many job bodies run at once on a worker (``concurrency``), and only that.

A run takes a body slot when its body is about to begin and gives it back when the body
returns: a sync body's thread gives it back itself, the moment the function returns, so the
next run does not wait for the outcome to reach the event loop. A claimed job waiting for its
slot (fire-ahead) and a run waiting for its end to be recorded hold none (the claimer bounds
those with ``claim_ahead`` and ``finish_backlog``). A run whose scheduled slot came while
every body slot was busy waits, in order, with its lease renewed; a stop or a lost lease
ends the wait and the body never runs."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading


class BodyLimit:
    """At most ``limit`` bodies at once. ``wake`` (the claim loop's) is set when a slot frees
    after the claim loop found none (:meth:`room`)."""

    def __init__(self, limit: int, wake: asyncio.Event) -> None:
        self.limit = limit
        self._wake = wake
        self._lock = threading.Lock()  # bodies end in their own threads
        self._busy = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._wanted = False
        self.closed = False

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def waiting(self) -> int:
        """Runs waiting for a slot."""
        return len(self._waiters)

    def room(self) -> bool:
        """Whether a claimed run could begin its body now: a slot free and no run waiting.
        If not, the claim loop is woken when there is."""
        if self._waiters or self._busy >= self.limit:
            self._wanted = True
            return False
        return True

    def take(self) -> bool:
        """Take a slot if one is free and no run waits for one (event loop only)."""
        if self._waiters or self.closed:
            return False
        with self._lock:
            if self._busy < self.limit:
                self._busy += 1
                return True
        return False

    def wait(self) -> asyncio.Future[None]:
        """A future done when a slot is taken for the caller (cancelled by :meth:`close`)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.cancel()
        else:
            self._waiters.append(future)
        return future

    def forget(self, future: asyncio.Future[None]) -> None:
        """A waiter that stopped waiting (its lease was lost, the worker stops, its task was
        cancelled): out of the line, and the slot given on if one was taken for it."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(future)
        if future.done() and not future.cancelled():
            self.release()  # granted as it was cancelled: give the slot on
        self.grant()  # and the claim loop may have room again

    def release(self) -> None:
        """A body returned (from any thread). :meth:`grant` hands the slot on."""
        with self._lock:
            self._busy -= 1

    def grant(self) -> None:
        """Hand free slots to waiting runs, in order (event loop only)."""
        waiters = self._waiters
        while waiters:
            first = waiters[0]
            if first.done():  # cancelled while waiting
                waiters.popleft()
                continue
            with self._lock:
                if self._busy >= self.limit:
                    return
                self._busy += 1
            waiters.popleft()
            first.set_result(None)
        if self._wanted and self._busy < self.limit:
            self._wanted = False
            self._wake.set()

    def close(self) -> None:
        """The worker stops: every wait ends (those runs are handed over, bodies not run)."""
        self.closed = True
        waiters, self._waiters = self._waiters, collections.deque()
        for future in waiters:
            future.cancel()
