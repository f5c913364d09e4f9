"""The end of a run: ``sched_finish`` for batches of ended runs (one statement in flight at a
time, retried on a lost connection) and ``sched_running`` for runs that outlive
:data:`RUNNING_ROW_AFTER`. An ended run counts against the worker's ``finish_backlog`` (not
its concurrency: its body slot is free) until its end is recorded (or given up); then it
leaves the worker's table of runs and the claim loop wakes.

Kept jobs: a run that ended done, whose job's next slot comes within
:data:`~.claim.KEEP_AHEAD`, is sent with ``keep`` when the worker has room for its next run
(its :class:`Keeper`, the claim loop, says how much): the finish releases the lease as for
any run and leaves the job to this worker (not due for others until
:data:`~.claim.RESERVE` after that slot), and the job's row goes to the keeper as a claim
whose start takes the lease over (``sched_start``'s ``take``). A run costs two statements
per batch instead of three (no claim), and no claim race for a job this worker runs anyway.
A worker keeps at most its share of the app's keepable jobs (:meth:`Finisher.fleet`, from
each presence beat: their count over the live workers, plus :data:`SHARE_SLACK`): over it,
a run lets its job go, and the first worker's claim at its slot takes it. So a worker that
joins gets its share once the others' next beat has counted it, and a fleet in balance
sends no claim for these jobs at all."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
from typing import Protocol

from .. import metrics
from .._acompat import monotonic
from ..errors import DatabaseUnavailable, TenureError
from .attached import OnClient
from .claim import KEEP_AHEAD, Finished, finish_params, run_fields, running_params
from .execution import Run
from .identity import WorkerIdentity
from .rows import ClaimRow, FinishedRow

log = logging.getLogger("tenure.scheduler")

#: Most runs one finish statement records (a batch is whatever ended while the last was sent).
FINISH_BATCH = 1000
#: Seconds: under load, the finisher sends at most one statement this often.
FINISH_EVERY = 0.05
#: Seconds: a run still going this long after its start gets its history row now (outcome
#: 'running', completed by its finish), so that history and the dashboard show it; a shorter
#: run's row is written once, at its end (migration 12).
RUNNING_ROW_AFTER = 1.0
#: A worker keeps up to this much more than an even share of the app's keepable jobs (and
#: one more), so that small differences in the count do not make jobs go back and forth.
SHARE_SLACK = 0.1
#: Seconds after its last kept run that a job stops counting toward the worker's share (a
#: kept job's next start refused, or given back): kept jobs run at least every KEEP_AHEAD.
KEPT_FOR = 2 * KEEP_AHEAD + 1


class Keeper(Protocol):
    """Where the jobs a finish kept go (the worker's claim loop)."""

    def reserve(self, wanted: int) -> int:
        """Room for up to ``wanted`` next runs, taken now: how many the finish may keep."""
        ...

    def may_keep(self, job_key: str) -> bool:
        """Whether a run of ``job_key`` may be kept for its next slot at all."""
        ...

    def kept(self, rows: list[ClaimRow], reserved: int, received: float) -> None:
        """The jobs a finish kept (``reserved`` is given back, ``rows`` are taken as claims
        whose answer arrived at ``received``)."""
        ...

    def due(self, seconds: float) -> None:
        """A job the finish did not keep is due in ``seconds`` (0: now): claim it then."""
        ...


class Finisher(OnClient):
    """Records the ends of one worker's runs. ``running``: the worker's runs in flight, keyed
    by (job, token), which an ended run leaves once recorded; ``wake``: the claim loop's."""

    def __init__(
        self,
        who: WorkerIdentity,
        *,
        channel: str,
        backlog: int,
        running: dict[tuple[str, int], Run],
        wake: asyncio.Event,
    ) -> None:
        self.who = who
        self.channel = channel
        self.running = running
        self.wake = wake
        # Ended runs that make the finisher send at once (see _finish_batches).
        self._full = max(1, backlog // 4)
        #: Ended runs whose end is not recorded yet (queued or being sent).
        self.backlog = 0
        # Ended runs waiting for the finisher, and the finisher task while it runs.
        self._finishing: list[tuple[Finished, Run, float]] = []
        self.task: asyncio.Task[None] | None = None
        self._finish_wake = asyncio.Event()
        self._stopping = False
        self.runs = 0
        self.handed_over = 0
        #: Jobs kept for this worker's next run of them (their rows went to the keeper).
        self.kept = 0
        #: Set by the claim loop when the finish backlog left it no room: the next end wakes it.
        self.wake_claims = False
        #: Most jobs this worker keeps (None: as many as it has room for, a worker alone).
        self.share: int | None = None
        #: Other live workers of the app that were not saturated at their last beat.
        self.spare = 0
        #: The jobs it keeps, and when each was last kept (monotonic).
        self.keeping: dict[str, float] = {}
        #: Per job, the token and slot of this worker's last run whose body ended
        #: (succeeded or failed), from the moment it ended: that slot ran, whatever the
        #: database says of it later. Its end may be on its way, given up on, or recorded
        #: and then lost (a failover with asynchronous replication loses the last commits);
        #: meanwhile another claim may have taken the job and left the slot unfinished
        #: under its own token. One entry per job this worker ran.
        self.last_done: dict[str, tuple[int, dt.datetime]] = {}
        #: Takes the jobs a finish kept; None: none is kept (set by the worker).
        self.keeper: Keeper | None = None

    def ran(self, job_key: str, token: int, slot: dt.datetime) -> bool:
        """Whether the unfinished run ``token`` of ``slot`` that a claim found is one this
        worker ran to its end, or is a later attempt at the slot such a run ran."""
        done = self.last_done.get(job_key)
        return done is not None and (done[0] == token or done[1] == slot)

    def fleet(self, workers: int, keepable: int, spare: int = 0) -> None:
        """The app's live workers and keepable jobs now (each presence beat): this worker's
        share of those jobs; and how many other live workers are not saturated (``spare``)."""
        self.spare = spare
        if workers <= 1:
            self.share = None
        else:
            self.share = math.ceil(keepable / workers * (1 + SHARE_SLACK)) + 1

    def stop(self) -> None:
        """The worker is stopping: send what is queued without pausing."""
        self._stopping = True
        self._finish_wake.set()

    def finish(self, run: Run, outcome: str, error: str | None, duration: float) -> None:
        """Queue the run's end for the finisher, which ends the run once it is recorded (or
        given up): the run counts against the finish backlog until then, and a stopping worker
        waits for the finisher. No future and task step per run wait for it."""
        done = outcome in ("succeeded", "failed")
        item = Finished(run.ident, done, outcome, error)
        run.ended = True
        if done:
            self.last_done[run.ident.job_key] = (run.ident.token, run.ident.slot)
        self.backlog += 1
        self._finishing.append((item, run, duration))
        if len(self._finishing) >= self._full:
            self._finish_wake.set()
        if self.task is None:
            self.task = asyncio.create_task(self._finish_batches(), name="tenure-finish")

    async def _finish_batches(self) -> None:
        """The single finisher: one ``sched_finish`` for whatever runs ended while the previous
        batch was in flight. Batches grow with the load and are single runs when idle, so an
        idle worker adds no latency, and finishing takes one pooled connection at a time
        instead of one per run."""
        batch: list[tuple[Finished, Run, float]] = []
        try:
            while self._finishing:
                batch = self._finishing[:FINISH_BATCH]
                del self._finishing[:FINISH_BATCH]
                sent = monotonic()
                items, reserved = self._keep(
                    [item for item, _, _ in batch], [r for _, r, _ in batch]
                )
                claims: list[ClaimRow] = []
                try:
                    outcomes, claims, due = await self._record_finished(items)
                    if due is not None and self.keeper is not None:
                        self.keeper.due(due)
                except Exception:
                    log.exception("recording the end of %d runs failed unexpectedly", len(batch))
                    outcomes = {}
                finally:
                    if reserved:
                        assert self.keeper is not None
                        self.kept += len(claims)
                        self._not_kept(items, claims)
                        self.keeper.kept(claims, reserved, monotonic())
                ended, batch = batch, []
                for item, run, duration in ended:
                    ident = item.ident
                    recorded = outcomes.get((ident.job_key, ident.token), item.outcome)
                    self._ended(run, item.done, recorded, item.error, duration)
                # Under load, at most one finish per FINISH_EVERY, unless a quarter of the
                # finish backlog is waiting for it: bigger batches cost the server less per run,
                # and the starts (a run's lateness) meet fewer statements competing for its
                # CPUs. An idle worker's lone finish is sent at once (this loop has ended).
                pause = sent + FINISH_EVERY - monotonic()
                if pause > 0 and not self._stopping and 0 < len(self._finishing) < self._full:
                    self._finish_wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(pause):
                            await self._finish_wake.wait()
        finally:
            self.task = None
            # Cancelled while recording (the loop is closing): the runs end with what their
            # bodies did.
            for item, run, duration in batch:
                self._ended(run, item.done, item.outcome, item.error, duration)

    def _keep(self, items: list[Finished], runs: list[Run]) -> tuple[list[Finished], int]:
        """The batch with ``keep`` on the runs whose jobs may be kept (done, not long here,
        next slot within :data:`~.claim.KEEP_AHEAD` by the run's own estimate of the
        database's clock), within this worker's share and as many as the keeper has room for;
        and that room, reserved. A job beyond the share is let go, one the worker kept before
        first."""
        keeper, keeping = self.keeper, self.keeping
        now = monotonic()
        for key in [k for k, at in keeping.items() if now - at > KEPT_FOR]:
            del keeping[key]
        if keeper is None or self._stopping:
            return items, 0
        share = self.share
        wanted = []
        for i, (item, run) in enumerate(zip(items, runs, strict=True)):
            key = item.ident.job_key
            keepable = (
                item.done
                and not run.lease.marked_lost  # its renewals failed: nothing to keep it on
                and keeper.may_keep(key)
                and run.next_slot is not None
                and (run.next_slot - item.ident.started_at).total_seconds() - (now - run.launched)
                <= KEEP_AHEAD
            )
            if keepable and (
                share is None or len(keeping) < share or (key in keeping and len(keeping) == share)
            ):
                keeping[key] = now
                wanted.append(i)
            else:
                keeping.pop(key, None)
        reserved = keeper.reserve(len(wanted)) if wanted else 0
        for i in wanted[reserved:]:
            keeping.pop(items[i].ident.job_key, None)
        if reserved:
            items = list(items)
            for i in wanted[:reserved]:
                f = items[i]
                items[i] = Finished(f.ident, f.done, f.outcome, f.error, True)
        return items, reserved

    def _not_kept(self, items: list[Finished], claims: list[ClaimRow]) -> None:
        """Jobs sent with ``keep`` that the finish did not keep (paused, triggered, taken
        over meanwhile) do not count toward the share."""
        kept = {c.job_key for c in claims}
        for f in items:
            if f.keep and f.ident.job_key not in kept:
                self.keeping.pop(f.ident.job_key, None)

    async def _record_finished(
        self, batch: list[Finished]
    ) -> tuple[dict[tuple[str, int], str], list[ClaimRow], float | None]:
        """Send one batch (retried on a lost connection); returns each run's recorded outcome,
        the rows of the jobs it kept, and in how many seconds the earliest of the others is
        due (None: no job of the batch is this worker's to claim)."""
        ordered = sorted(batch, key=lambda f: (f.ident.job_key, f.ident.token))  # one lock order
        who = self.who
        for attempt in range(3):
            try:
                rows = await self.client.fetch(
                    "sched_finish",
                    finish_params(
                        ordered,
                        channel=self.channel,
                        worker=who.id,
                        host=who.host,
                        pid=who.pid,
                        retry=attempt > 0,
                    ),
                    doing=f"finishing {len(ordered)} runs",
                    wrote=True,
                    row=FinishedRow,
                )
                break
            except DatabaseUnavailable as exc:
                if attempt == 2:
                    for f in ordered:
                        log.warning(
                            "job %r: recording the end of slot %s failed (%s); its lease "
                            "expires and the slot will be retried",
                            f.ident.job_key,
                            f.ident.slot.isoformat(),
                            exc,
                            extra=run_fields(f.ident.job_key, f.ident.token, f.ident.slot),
                        )
                    return {}, [], None
                await asyncio.sleep(0.5)
            except TenureError as exc:
                for f in ordered:
                    log.warning(
                        "job %r: recording the end of a run failed: %s",
                        f.ident.job_key,
                        exc,
                        extra=run_fields(f.ident.job_key, f.ident.token, f.ident.slot),
                    )
                return {}, [], None
        recorded: dict[tuple[str, int], str] = {}
        due: float | None = None
        claims: list[ClaimRow] = []
        by_key = {(f.ident.job_key, f.ident.token): f for f in ordered}
        for row in rows:
            key, token, matched, current = row.job_key, row.token, row.matched, row.current
            if token is None:  # a job kept for this worker's next run of it
                claims.append(row.claim())
                continue
            if due is None and row.ready_at is not None:
                due = (row.ready_at - row.now).total_seconds()
            f = by_key[(key, token)]
            outcome = row.outcome or f.outcome
            recorded[(key, token)] = outcome
            if not matched and f.outcome in ("succeeded", "failed"):
                log.warning(
                    "job %r slot %s finished with token %s after the job was taken over "
                    "(token %s): recorded as %s",
                    key,
                    f.ident.slot.isoformat(),
                    token,
                    current,
                    outcome,
                    extra=run_fields(key, token, f.ident.slot),
                )
        return recorded, claims, due

    async def rows_in_progress(self) -> None:
        """Write the 'running' history rows of runs that outlived :data:`RUNNING_ROW_AFTER`,
        one statement for all that came due since the last look (until cancelled)."""
        who = self.who
        while True:
            await asyncio.sleep(RUNNING_ROW_AFTER / 2)
            due = monotonic() - RUNNING_ROW_AFTER
            runs = [
                r
                for r in self.running.values()
                if not (r.row_written or r.ended) and r.launched <= due
            ]
            if not runs:
                continue
            try:
                await self.client.fetch(
                    "sched_running",
                    running_params(
                        [r.ident for r in runs], worker=who.id, host=who.host, pid=who.pid
                    ),
                    doing=f"recording {len(runs)} runs in progress",
                    wrote=True,
                )
            except TenureError as exc:
                log.warning("recording %d runs in progress failed (retried): %s", len(runs), exc)
                continue
            for r in runs:
                r.row_written = True

    def _ended(
        self, run: Run, done: bool, recorded: str, error: str | None, duration: float
    ) -> None:
        ident = run.ident
        key, token = ident.job_key, ident.token
        self.backlog -= 1
        # A lease marked lost has already been counted out of tenure_leases_held.
        counted_out = run.lease.marked_lost  # without evaluating the deadline
        run.lease.mark_released()
        self.runs += 1
        if not done:
            self.handed_over += 1
        if not counted_out:
            metrics.emit(metrics.RELEASE, key, value=duration)
        metrics.emit(metrics.JOB, key, recorded, duration)
        if recorded in ("lease_lost", "stale_rejected", "cancelled"):
            log.warning(
                "job %r slot %s token %s: %s (%s)",
                key,
                ident.slot.isoformat(),
                token,
                recorded,
                error,
                extra=run_fields(key, token, ident.slot, outcome=recorded),
            )
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job %r slot %s token %s: %s in %.3fs",
                key,
                ident.slot.isoformat(),
                token,
                recorded,
                duration,
                extra=run_fields(key, token, ident.slot, outcome=recorded),
            )
        self.running.pop((key, token), None)
        # The claim loop wakes when this end may let it claim: its finish backlog was full,
        # the slot was handed over (peers hear of it too), or the worker is stopping (it
        # waits for its runs). Not at every end: a busy worker's claim loop then sent a claim
        # after each batch, mostly for nothing, and won every claim race against idler
        # workers for the jobs let go.
        if self.wake_claims or not done or self._stopping:
            self.wake_claims = False
            self.wake.set()
