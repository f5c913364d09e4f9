"""Which job keys the live workers define (issue 31: a job removed from the code lingered
for ever, shown running or due, its dead run still 'running', claimed by every new worker
only to be given back, a token each time).

A worker writes a row in ``scheduler_workers`` when it starts (its app and the job keys its
code defines), before it registers its jobs, and pushes the row's ``seen_until`` forward
every :data:`PRESENCE_EVERY` seconds, :data:`PRESENCE_TTL` ahead; it deletes the row when it
stops. A SIGKILLed worker's row counts until ``seen_until`` has passed. Each beat
(``sched_presence_beat``):

* tells the worker which job keys of its app (or not stamped with one) its code does not
  define: its claims exclude them from then on (the claim's ``exclude``), so a worker never
  takes a token for a job it cannot run. The claim statement itself is unchanged: nothing
  is added to its hot path;
* records as lost (``lease_lost``) the unfinished run of a job of its app that no live worker
  of the app defines, once that run's lease has expired: nobody will claim the job to record
  it as the next start would;
* writes how the worker is doing, for the dashboard's workers page (migration 17): the longest
  its event loop was blocked since the previous beat (:mod:`.looplag`) and whether it is
  saturated (:mod:`.saturation`). In the same statement: no write is added;
* counts the app's live workers and its jobs whose slots come at most
  :data:`~.claim.KEEP_AHEAD` apart, so that each worker keeps no more than its share of
  them from one run to the next (:mod:`.finisher`, "kept jobs").

"No worker defines it" is computed where it is shown (``sched_undefined``: ``tenure jobs
list``, ``tenure status``, the dashboard): a job of an app that has a live worker, none of
whose live workers defines it. ``tenure jobs remove KEY`` deletes such a definition
(:func:`tenure.scheduler.jobs.remove`); its lease row stays, so its tokens never go back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..errors import TenureError
from .claim import KEEP_AHEAD
from .rows import PresenceRow

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient
    from .identity import WorkerIdentity
    from .looplag import LoopLag
    from .saturation import Saturation

log = logging.getLogger("tenure.scheduler")

#: Seconds a worker's row counts after its last beat (a SIGKILLed worker's job keys count as
#: defined this long after its death).
PRESENCE_TTL = 30.0
#: Seconds between beats.
PRESENCE_EVERY = 10.0
#: Up to this many newly excluded keys are logged one line each, more as one summary.
EXCLUDED_LOGGED = 20


class Presence:
    """One worker's row in ``scheduler_workers``: ``keys``, the job keys its code defines, for
    app ``app``; ``exclude``, the set its claims leave out (the claimer's), which each beat
    adds the app's other keys to; ``loop_lag`` and ``saturation``, the worker's, which each
    beat reports."""

    def __init__(
        self,
        who: WorkerIdentity,
        app: str,
        keys: Iterable[str],
        exclude: set[str],
        *,
        loop_lag: LoopLag | None = None,
        saturation: Saturation | None = None,
        fleet: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.who = who
        self.app = app
        self.keys = sorted(keys)
        self.exclude = exclude
        self.loop_lag = loop_lag
        self.saturation = saturation
        #: Told each beat's count of the app's live workers, of its keepable jobs, and of
        #: the other live workers that are not saturated.
        self.fleet = fleet

    async def enter(self, client: AsyncClient) -> None:
        """Write the row (app and job keys) and take the first beat. Called before the worker
        registers its jobs: a `tenure jobs remove` that runs after the registration (they
        are serialized) sees the row and refuses."""
        await client.fetch(
            "sched_presence_enter",
            {
                "worker": self.who.id,
                "app": self.app,
                "keys": self.keys,
                "host": self.who.host,
                "pid": self.who.pid,
                "ttl": dt.timedelta(seconds=PRESENCE_TTL),
            },
            doing="announcing the worker's job keys",
            wrote=True,
        )
        await self.beat(client)

    async def beat(self, client: AsyncClient) -> None:
        """One beat: the row's ``seen_until``, the keys the claims exclude, the dead runs of
        jobs nobody defines recorded as lost, the worker's loop lag and saturation."""
        rows = await client.fetch(
            "sched_presence_beat",
            {
                "worker": self.who.id,
                "app": self.app,
                "ttl": dt.timedelta(seconds=PRESENCE_TTL),
                "loop_lag": None if self.loop_lag is None else self.loop_lag.take(),
                "saturated": None if self.saturation is None else self.saturation.saturated,
                "keep_ahead": KEEP_AHEAD,
            },
            doing="renewing the worker's presence",
            wrote=True,
            row=PresenceRow,
        )
        if not any(r.kind == "me" for r in rows):
            # The row is gone (deleted by hand, or this worker was frozen for a day): write
            # it again, so that this worker's jobs count as defined.
            log.warning("%s: its presence row was missing; writing it again", self.who.label)
            await self.enter(client)
            return
        new = [
            r.job_key
            for r in rows
            if r.kind == "excluded" and r.job_key is not None and r.job_key not in self.exclude
        ]
        self.exclude.update(new)
        for key in new[:EXCLUDED_LOGGED]:
            log.info(
                "job %r is scheduled for app %r but this worker does not define it: left to "
                "the workers that do (`tenure jobs remove` deletes a job nobody defines)",
                key,
                self.app,
                extra={"job": key},
            )
        if len(new) > EXCLUDED_LOGGED:
            log.info(
                "%d more jobs of app %r left to the workers that define them",
                len(new) - EXCLUDED_LOGGED,
                self.app,
            )
        counts = {r.kind: r.n for r in rows if r.kind in ("workers", "keepable", "spare")}
        workers, keepable = counts.get("workers"), counts.get("keepable")
        spare = counts.get("spare")
        if self.fleet is not None and workers is not None and keepable is not None:
            self.fleet(workers, keepable, spare or 0)
        for r in rows:
            if r.kind == "lost":
                log.warning(
                    "job %r: its unfinished run is recorded as lease_lost: its worker is gone "
                    "and no live worker of app %r defines the job",
                    r.job_key,
                    self.app,
                    extra={"job": r.job_key},
                )

    async def beat_forever(self, client: AsyncClient) -> None:
        """Beat every :data:`PRESENCE_EVERY` seconds until cancelled; a failed beat is retried
        at the next (the row counts for :data:`PRESENCE_TTL`)."""
        while True:
            await asyncio.sleep(PRESENCE_EVERY)
            try:
                await self.beat(client)
            except TenureError as exc:
                log.warning("renewing %s's presence failed (retried): %s", self.who.label, exc)

    async def leave(self, client: AsyncClient) -> None:
        """Delete the row: the worker's job keys stop counting at once."""
        with contextlib.suppress(TenureError):
            await client.fetch(
                "sched_presence_leave",
                {"worker": self.who.id},
                doing="removing the worker's presence",
                wrote=True,
            )
