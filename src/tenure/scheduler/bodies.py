"""How many job bodies run at once on a worker (``concurrency``), and only that.

A run takes a body slot when its body is about to begin and gives it back when the body
returns: a sync body's thread gives it back itself, the moment the function returns, so the
next run does not wait for the outcome to reach the event loop. A claimed job waiting for its
slot (fire-ahead) and a run waiting for its end to be recorded hold none (the claimer bounds
those with ``claim_ahead`` and ``finish_backlog``). A run whose scheduled slot came while
every body slot was busy waits, in order, with its lease renewed; a stop or a lost lease
ends the wait and the body never runs.

**Slow bodies do not hold every slot.** A job whose last body on this worker ran
:data:`LONG_BODY` or more, or used :data:`LONG_BODY_CPU` of CPU, is *long*; one whose last body
here was shorter is *quick*; one this worker has not run yet is *new*, unless another job of
the same function has (a function's jobs for many tenants or many runtime schedules of one task
are mostly alike): it is then long or quick as that function's last body here was, until its
own first body here says. While the worker also runs quick bodies (one ended in the last
:data:`QUICK_RECENT` seconds), long bodies hold at most :attr:`BodyLimit.long_cap` slots (three
quarters, rounded up: 6 of the default 8), and long and new bodies together at most
:attr:`BodyLimit.new_cap` (half of the other slots more, rounded down: 7 of 8), so the rest
stay free for the quick ones. Without that, slow jobs whose demand exceeds the slots (ten jobs
sleeping 2 s every second need 20) fill every slot and every other job on the worker waits
behind them; with it, slow jobs delay the quick ones by no more than their share of the slots.
New jobs have a share of their own because the worker learns a job's length from its own runs
(and, as it starts, from how long each job ran lately, :meth:`BodyLimit.seed`: after a restart
its jobs are long or quick from their first run, and from the first body of each function): on
several workers of a fresh fleet each slow job was new to each worker for a while, and two new
jobs that turned out slow took both slots kept for quick ones (bench/README.md, "Eleventh
pass"). A worker that runs no quick bodies keeps no slot back. A long or new run over its share
waits in a line of its own, behind which quick runs pass; new runs go before long ones.

**A fresh worker does not give every slot to the first function it meets.** Before any body
has ended here nothing is known, and the claim's order decides which runs begin first (CI
once gave a fresh worker 24 sleepers' first runs before 40 quick jobs': the sleepers took all
8 slots and two quick runs began 2 s late). So a function none of whose bodies has ended here
runs at most ``new_cap`` bodies; its other runs wait aside (held) and the last slot goes to
another function's run, whose quick body then tells the worker what its function is. A
function is known when one of its bodies ends, or long once its first bodies have run
:data:`LONG_BODY` without one ending: a worker that runs only one function leaves a slot
idle for a second at most. Runs that waited as new go on to the quick or the long line
(in the order they came) as soon as their function is known.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import threading
import time
from collections.abc import Mapping

#: A body that ran this many seconds makes its job long (``long_cap`` applies to it).
LONG_BODY = 1.0
#: A sync body that used this much of its thread's CPU makes its job long too: CPU-bound
#: bodies hold their slot for longer than they take alone, as they share the process's GIL.
#: CPU time, not wall time, so that a quick body that waited for the GIL is not taken for
#: a slow one (a no-op's body uses a few microseconds).
LONG_BODY_CPU = 0.02
#: Seconds since the last quick body ended during which slots are kept for quick bodies.
QUICK_RECENT = 10.0


#: What jobs of one function have in common here: the function's ``id()`` (the app keeps
#: its job and task functions alive while a worker runs them).
Family = int | None


class Slot:
    """A body slot taken for one run: returned to :meth:`BodyLimit.release`. ``long``: its job
    is long here; ``new``: nothing is known of its job here yet; ``family``: its function's."""

    __slots__ = ("began", "family", "job_key", "long", "new")

    def __init__(self, job_key: str, long: bool, new: bool = False, family: Family = None) -> None:
        self.job_key = job_key
        self.long = long
        self.new = new
        self.family = family
        self.began = time.monotonic()


#: Runs waiting for a slot, in order: each one's future and the slot it will get.
Line = collections.deque[tuple[asyncio.Future[Slot], Slot]]


def _count_up(counts: dict[int, int], key: int) -> int:
    """One more of ``key`` in ``counts``; returns how many there were before."""
    before = counts.get(key, 0)
    counts[key] = before + 1
    return before


def _count_down(counts: dict[int, int], key: int) -> None:
    """One fewer of ``key`` in ``counts``, which forgets it at none."""
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


class BodyLimit:
    """At most ``limit`` bodies at once, of which at most ``long_cap`` of long jobs and
    ``new_cap`` of long and new ones together. ``wake`` (the claim loop's) is set when a slot
    frees after the claim loop found none (:meth:`room`)."""

    def __init__(self, limit: int, wake: asyncio.Event) -> None:
        self.limit = limit
        # One slot in four kept for quick bodies (none with a single slot: a long job must
        # still be able to run), of which new jobs may take half, rounded down.
        kept = max(1, limit // 4) if limit >= 2 else 0
        self.long_cap = limit - kept
        self.new_cap = self.long_cap + kept // 2
        self._wake = wake
        self._lock = threading.Lock()  # bodies end in their own threads
        self._busy = 0
        self._long = 0  # slots held by long bodies
        self._new = 0  # slots held by bodies of new jobs
        self._long_jobs: set[str] = set()  # jobs whose last body here was long
        self._quick_jobs: set[str] = set()  # jobs whose last body here was quick
        self._families: dict[int, bool] = {}  # whether a function's last body here was long
        # Bodies running of functions none of whose bodies ended here yet (the first ones of
        # each function), since when they run without a pause (monotonic), and the runs of
        # such functions waiting, by function (new line and held line together).
        self._unknown: dict[int, int] = {}
        self._unknown_since: dict[int, float] = {}
        self._unknown_waiting: dict[int, int] = {}
        # Functions whose waiting runs may have to be sorted again (a body of theirs ended, or
        # they ran LONG_BODY): appended under the lock from any thread, read by :meth:`grant`.
        self._recheck: list[int] = []
        self._quick_at = -QUICK_RECENT  # when a quick body last ended (monotonic)
        self._waiters: Line = collections.deque()
        self._new_waiters: Line = collections.deque()
        self._long_waiters: Line = collections.deque()
        self._held: Line = collections.deque()  # new runs of a function at its cap
        self._wanted = False
        self._wanted_since = 0.0  # when the claim loop found no room (monotonic)
        self.closed = False

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def waiting(self) -> int:
        """Runs waiting for a slot."""
        lines = (self._waiters, self._new_waiters, self._long_waiters, self._held)
        return sum(map(len, lines))

    def is_long(self, job_key: str) -> bool:
        return job_key in self._long_jobs

    def backed_up(self, seconds: float) -> bool:
        """Whether a run of a quick or a new job has been waiting ``seconds`` or more for a
        body slot (a start batch's runs wait a moment for one at thousands of runs a second;
        this long, the worker does not keep up with its bodies). Long jobs waiting for their
        share do not count: that is their share."""
        now = time.monotonic()
        return any(line and now - line[0][1].began >= seconds
                   for line in (self._waiters, self._new_waiters))  # fmt: skip

    def seed(
        self, lengths: Mapping[str, float], families: Mapping[str, Family] | None = None
    ) -> None:
        """What the history says of jobs not run here yet (``lengths``: seconds, from
        ``sched_body_lengths``): long or quick by the same :data:`LONG_BODY` as a body run
        here, and the slots kept for quick bodies from now on if any is quick. Without it a
        worker that starts knows none of its jobs: their first runs wait in one line, and
        quick ones queued behind slow ones waited up to 18 s (bench/README.md, "Fourteenth
        pass"). A job's runs here relearn it. ``families``: the jobs' functions, which learn
        from them as from a body run here."""
        now = time.monotonic()
        with self._lock:
            for job_key, took in lengths.items():
                if self.is_new(job_key):
                    family = None if families is None else families.get(job_key)
                    self._learn(job_key, took >= LONG_BODY, now, family)

    def is_new(self, job_key: str) -> bool:
        return job_key not in self._long_jobs and job_key not in self._quick_jobs

    def room(self) -> bool:
        """Whether a claimed quick run could begin its body now: a slot free and no quick run
        waiting (long or new runs waiting for their share do not stop the claims: they wait
        behind the long and new bodies, not behind the slots). If not, the claim loop is
        woken when there is."""
        if self._waiters or self._busy >= self.limit:
            if not self._wanted:
                self._wanted = True
                self._wanted_since = time.monotonic()
            return False
        return True

    def shut_out(self, seconds: float) -> bool:
        """Whether the claim loop has waited ``seconds`` or more for :meth:`room` (it found
        none, and no slot has freed for it since): runs already on the worker take every
        slot that frees, and jobs that need a claim wait unseen."""
        return self._wanted and time.monotonic() - self._wanted_since >= seconds

    def _slot(self, job_key: str, family: Family) -> tuple[Slot, Line]:
        """An untaken slot for ``job_key``'s body (of function ``family``), and the line its
        kind waits in."""
        if job_key in self._long_jobs:
            long: bool | None = True
        elif job_key in self._quick_jobs:
            long = False
        else:  # new here: as its function's last body here, if one ran
            long = None if family is None else self._families.get(family)
        if long is None:
            slot = Slot(job_key, False, True, family)
            return slot, self._held if self._capped(slot) else self._new_waiters
        return Slot(job_key, long, False, family), self._long_waiters if long else self._waiters

    def take(self, job_key: str, family: Family = None) -> Slot | None:
        """A slot for ``job_key``'s body (of function ``family``) if one is free and no run of
        its kind waits for one (event loop only)."""
        slot, line = self._slot(job_key, family)
        if self.closed or line or line is self._held:  # held: its function is at its cap
            return None
        with self._lock:
            if self._fits(slot):
                self._count(slot)
                return slot
        return None

    def wait(self, job_key: str, family: Family = None) -> asyncio.Future[Slot]:
        """A future done with a slot taken for the caller (cancelled by :meth:`close`)."""
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.cancel()
            return future
        slot, line = self._slot(job_key, family)
        line.append((future, slot))
        if slot.new and family is not None:
            _count_up(self._unknown_waiting, family)
        return future

    def forget(self, future: asyncio.Future[Slot]) -> None:
        """A waiter that stopped waiting (its lease was lost, the worker stops, its task was
        cancelled): out of the line, and the slot given on if one was taken for it."""
        for line in (self._waiters, self._new_waiters, self._long_waiters, self._held):
            for entry in line:
                if entry[0] is future:
                    line.remove(entry)
                    self._left_new(entry[1])
                    break
        if future.done() and not future.cancelled():
            self.release(future.result(), learn=False)  # granted as it was cancelled
        self.grant()  # and the claim loop may have room again

    def release(self, slot: Slot, cpu: float | None = None, *, learn: bool = True) -> None:
        """A body returned (from any thread): its job is long or quick by how long it ran and,
        for a sync body, the CPU its thread used (``cpu``). :meth:`grant` hands the slot on."""
        now = time.monotonic()
        took = now - slot.began
        with self._lock:
            self._busy -= 1
            self._long -= slot.long
            self._new -= slot.new
            if slot.new and slot.family is not None:
                self._uncount_unknown(slot.family)
            if learn:
                long = took >= LONG_BODY or (cpu is not None and cpu >= LONG_BODY_CPU)
                self._learn(slot.job_key, long, now, slot.family)

    def _uncount_unknown(self, family: int) -> None:
        """A first body of ``family`` ended (under the lock): its waiting runs may go on."""
        _count_down(self._unknown, family)
        if family not in self._unknown:
            self._unknown_since.pop(family, None)
        self._recheck.append(family)

    def _long_by_now(self, family: int, since: float) -> None:
        """``LONG_BODY`` after the first bodies of ``family`` began, none has ended: the
        function is long (timer, event loop), so its runs waiting aside need not wait for
        one to end (a worker that runs only that function then takes every slot)."""
        with self._lock:
            if family in self._families or self._unknown_since.get(family) != since:
                return
            self._families[family] = True
            self._recheck.append(family)
        self.grant()

    def _learn(self, job_key: str, long: bool, now: float, family: Family = None) -> None:
        """``job_key`` (and its function's jobs not run here yet) is long or quick here from
        now on (under the lock); a quick one keeps the slots for quick bodies."""
        if family is not None:
            if family not in self._families:
                self._recheck.append(family)  # its runs waiting as new now know what it is
            self._families[family] = long
        if long:
            self._long_jobs.add(job_key)
            self._quick_jobs.discard(job_key)
        else:
            self._quick_at = now
            self._quick_jobs.add(job_key)
            self._long_jobs.discard(job_key)

    def _capped(self, slot: Slot) -> bool:
        """Whether ``slot`` is a new run of a function none of whose bodies ended here yet
        that runs ``new_cap`` bodies already: nothing says it is not slow, and its runs
        claimed first must not take every slot from the other functions' (whose bodies may
        be quick, and may tell so first)."""
        family = slot.family
        return (
            slot.new
            and family is not None
            and family not in self._families
            and self._unknown.get(family, 0) >= self.new_cap
        )

    def _fits(self, slot: Slot) -> bool:
        """Whether ``slot``'s body may begin now (under the lock): a slot free and, for a long
        or new job, its share not full. The shares apply while quick bodies run here. (A
        function's first bodies have a share of their own, :meth:`_capped`, which
        :meth:`take` and :meth:`_grant` look at first.)"""
        if self._busy >= self.limit:
            return False
        if not (slot.long or slot.new) or time.monotonic() - self._quick_at >= QUICK_RECENT:
            return True
        return self._long + self._new < self.new_cap and (
            not slot.long or self._long < self.long_cap
        )

    def _count(self, slot: Slot) -> None:
        """``slot`` taken (under the lock, event loop)."""
        self._busy += 1
        self._long += slot.long
        self._new += slot.new
        family = slot.family
        if slot.new and family is not None:
            running = _count_up(self._unknown, family)
            if not running and family not in self._families:
                since = time.monotonic()
                self._unknown_since[family] = since
                asyncio.get_running_loop().call_later(LONG_BODY, self._long_by_now, family, since)

    def _left_new(self, slot: Slot) -> None:
        """A new run left the new or the held line (event loop)."""
        if slot.new and slot.family is not None:
            _count_down(self._unknown_waiting, slot.family)

    def _regroup(self) -> None:
        """Sort the new and held lines again (event loop): runs whose function is now known
        join the long or the quick line, in the order they came; runs of a function whose
        first bodies left room go back to the new line. Without it, quick runs queued while
        their function was unknown waited behind the slow function's first runs."""
        entries = sorted((*self._held, *self._new_waiters), key=lambda entry: entry[1].began)
        self._held.clear()
        self._new_waiters.clear()
        quick: list[tuple[asyncio.Future[Slot], Slot]] = []
        long: list[tuple[asyncio.Future[Slot], Slot]] = []
        for entry in entries:
            slot = entry[1]
            known = None if slot.family is None else self._families.get(slot.family)
            if known is None:
                (self._held if self._capped(slot) else self._new_waiters).append(entry)
                continue
            self._left_new(slot)
            slot.new, slot.long = False, known
            (long if known else quick).append(entry)
        if quick:
            self._waiters = self._merged(self._waiters, quick)
        if long:
            self._long_waiters = self._merged(self._long_waiters, long)

    @staticmethod
    def _merged(line: Line, entries: list[tuple[asyncio.Future[Slot], Slot]]) -> Line:
        """``line`` with ``entries`` (both in the order they came) in the order they came."""
        return collections.deque(heapq.merge(line, entries, key=lambda entry: entry[1].began))

    def grant(self) -> None:
        """Hand free slots to waiting runs (event loop only): quick runs first, in order,
        then new ones, then long ones, each in order and within its share."""
        if self._recheck:
            with self._lock:
                families, self._recheck = self._recheck, []
            if any(family in self._unknown_waiting for family in families):
                self._regroup()
        for line in (self._waiters, self._new_waiters, self._long_waiters):
            if line:
                self._grant(line)
        if self._wanted and self._busy < self.limit and not self._waiters:
            self._wanted = False
            self._wake.set()

    def _grant(self, waiters: Line) -> None:
        while waiters:
            future, slot = waiters[0]
            if future.done():  # cancelled while waiting
                waiters.popleft()
                self._left_new(slot)
                continue
            with self._lock:
                if self._capped(slot):  # its function's first bodies are at their cap
                    self._held.append(waiters.popleft())
                    continue
                if not self._fits(slot):
                    return
                self._count(slot)
            waiters.popleft()
            self._left_new(slot)
            slot.began = time.monotonic()
            future.set_result(slot)

    def close(self) -> None:
        """The worker stops: every wait ends (those runs are handed over, bodies not run)."""
        self.closed = True
        lines = (self._waiters, self._new_waiters, self._long_waiters, self._held)
        self._waiters = collections.deque()
        self._new_waiters = collections.deque()
        self._long_waiters = collections.deque()
        self._held = collections.deque()
        self._unknown_waiting.clear()
        for line in lines:
            for future, _slot in line:
                future.cancel()
