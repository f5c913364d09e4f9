"""How long the worker's event loop was blocked (issue 29).

A job body that runs sync code inside ``async def`` (``time.sleep``, blocking I/O, a long
computation) stops the whole worker's loop: lease renewals, claims and the other jobs wait.
A block longer than the TTL loses the lease under a live worker. This task sleeps
:data:`INTERVAL` and measures how late it wakes: over the threshold (a third of the
shortest TTL, the renewal period, at most :data:`THRESHOLD`) the worker logs a WARNING
naming the jobs that were running, and the ``worker_loop_lag`` metric carries the longest
lag of the last :data:`WINDOW` seconds (``tenure_worker_loop_lag_seconds{app}``), so a
scrape every 15 s still sees a block that lasted one. The worker's presence beat writes the
longest lag since its previous beat (:meth:`LoopLag.take`) in its row, for the dashboard.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from .. import metrics
from .._acompat import monotonic

log = logging.getLogger("tenure.scheduler")

#: Seconds between measurements.
INTERVAL = 0.25
#: The warning's threshold at most (seconds); lower when a job's TTL is short.
THRESHOLD = 1.0
#: Seconds over which the exported lag is the largest measured.
WINDOW = 60.0


def threshold(ttls: Iterable[float]) -> float:
    """A third of the shortest TTL (a renewal is due that often), at most :data:`THRESHOLD`."""
    return min([THRESHOLD, *(ttl / 3 for ttl in ttls)])


class LoopLag:
    """Measures the lag of the loop it runs on; ``running`` is the worker's runs by
    (job key, token), read for the warning's job keys."""

    def __init__(
        self, worker: str, app: str, running: Mapping[tuple[str, Any], object], limit: float
    ) -> None:
        self.worker = worker
        self.app = app
        self.running = running
        self.limit = limit
        self._recent: deque[tuple[float, float]] = deque()  # (measured at, lag)
        self._since_take = 0.0  # the longest lag since the last take()

    def observe(self, lag: float, jobs: Iterable[str], now: float) -> float:
        """Record one measurement; returns the largest lag of the window (exported)."""
        self._recent.append((now, lag))
        self._since_take = max(self._since_take, lag)
        while self._recent and self._recent[0][0] < now - WINDOW:
            self._recent.popleft()
        worst = max(value for _, value in self._recent)
        metrics.emit(metrics.LOOP_LAG, self.app, "", worst)
        if lag >= self.limit:
            keys = sorted(set(jobs))
            log.warning(
                "tenure worker %s: its event loop was blocked for %.1fs (over %.1fs) while "
                "running %s: a job doing sync work inside `async def` (time.sleep, blocking "
                "I/O) stops lease renewals and loses its lease; make it a plain def (it runs "
                "in a thread) or use asyncio.to_thread",
                self.worker,
                lag,
                self.limit,
                ", ".join(keys) or "no job",
                extra={"worker": self.worker, "app": self.app, "loop_lag": lag, "jobs": keys},
            )
        return worst

    def take(self) -> float:
        """The longest lag measured since the previous call (seconds), and start again."""
        worst, self._since_take = self._since_take, 0.0
        return worst

    async def watch_forever(self) -> None:
        while True:
            # The jobs running before the sleep and after it: the one that blocked the loop
            # may have started or ended in between.
            before = [key for key, _ in self.running]
            start = monotonic()
            await asyncio.sleep(INTERVAL)
            now = monotonic()
            jobs = before + [key for key, _ in self.running]
            self.observe(max(0.0, now - start - INTERVAL), jobs, now)
