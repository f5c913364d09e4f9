"""Is this worker keeping up? A worker is saturated when slots that came due while it was
running are skipped (misfire) or start more than :data:`LAG` late. It then logs a warning
(once, and again every :data:`REPEAT` seconds while it lasts, with the counts) and emits the
``worker_saturated`` metric event (1.0; 0.0 once :data:`WINDOW` seconds pass without
either). Slots older than the worker's start do not count: a backlog left by workers that
were all down is not this worker falling behind. Nor do slots that came due while another
holder's lease kept the job (it overran, froze or died): a run's lateness counts from that
lease's end, and slots skipped before it do not count (``Claim.held_elsewhere``)."""

from __future__ import annotations

import datetime as dt
import logging

from .. import metrics

log = logging.getLogger("tenure.scheduler")

#: A scheduled run that starts later than this after its slot (database clock) is behind.
LAG = 1.0
#: Saturated until this long passes with no skipped slot and no run over LAG.
WINDOW = 10.0
#: While saturated, the warning is repeated this often, with the counts since the last one.
REPEAT = 60.0


class Saturation:
    """Tracks one worker's skipped slots and lateness (fed by its start of each batch)."""

    def __init__(self, worker: str, app: str) -> None:
        self.worker = worker
        self.app = app
        self.saturated = False
        self._since: dt.datetime | None = None  # database time of the worker's first claim
        self._last_bad = 0.0
        self._last_log = 0.0
        self._skipped = 0
        self._late = 0
        self._worst = 0.0

    def started(self, db_now: dt.datetime) -> None:
        if self._since is None:
            self._since = db_now

    def counts(self, slot: dt.datetime) -> bool:
        """Whether a slot came due while this worker was running."""
        return self._since is not None and slot >= self._since

    def observe(self, skipped: int, lateness: list[float], now: float) -> None:
        """``skipped``: slots this worker skipped that came due while it ran; ``lateness``:
        seconds late of the scheduled runs it started (same condition); ``now``: monotonic."""
        late = [x for x in lateness if x > LAG]
        if skipped or late:
            self._last_bad = now
            self._skipped += skipped
            self._late += len(late)
            self._worst = max(self._worst, *late) if late else self._worst
            if not self.saturated:
                self.saturated = True
                self._report(now, "is saturated")
                metrics.emit(metrics.SATURATED, self.app, "saturated", 1.0)
            elif now - self._last_log >= REPEAT:
                self._report(now, "is still saturated")
        elif self.saturated and now - self._last_bad >= WINDOW:
            self.saturated = False
            log.info(
                "tenure worker %s keeps up again: no slot skipped or started over %.1fs late "
                "in the last %.0fs",
                self.worker,
                LAG,
                WINDOW,
                extra={"worker": self.worker, "saturated": False},
            )
            metrics.emit(metrics.SATURATED, self.app, "ok", 0.0)

    def _report(self, now: float, what: str) -> None:
        log.warning(
            "tenure worker %s %s: it cannot keep up with the due jobs (%d slots skipped, "
            "%d runs started over %.1fs late, up to %.1fs, since the last report); add "
            "workers, raise --concurrency, or spread the schedules",
            self.worker,
            what,
            self._skipped,
            self._late,
            LAG,
            self._worst,
            extra={"worker": self.worker, "saturated": True},
        )
        self._last_log = now
        self._skipped = self._late = 0
        self._worst = 0.0
