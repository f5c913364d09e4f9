# WARNING: this file is generated from src/tenure/leases/_async/lease.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""A held lease: its token, its renewal, and the local deadline after which it is lost.

The holder considers its lease lost at ``send time of the last successful acquire/renew +
ttl - safety_margin`` on its own monotonic clock. The database computed the expiry from its
own clock *after* the request was sent, so this local deadline is never later than the real
expiry (up to clock-rate drift, which the margin absorbs): the holder stops before any
successor can start, even when the database cannot be reached to tell it so.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ... import metrics
from ..._compat import (
    CancelledError,
    Event,
    Worker,
    cancel_task,
    current_task,
    join,
    monotonic,
    spawn,
    uncancel,
    wait_event,
)
from ...db.timeouts import lock_timeout_ms
from ...errors import InvalidArgumentType, LeaseBusy, LeaseLost, TenureError
from ..models import Grant

if TYPE_CHECKING:
    from .client import Client
log = logging.getLogger("tenure.lease")
OnLost = Callable[["Lease"], Any]
_UNSET_RENEW_PARAMS = (dt.timedelta(0), "")


class Lease:
    """One execution's hold on a job. ``owner`` is a fresh UUID for this execution only."""

    def __init__(
        self,
        client: Client,
        job_key: str,
        owner: uuid.UUID,
        grant: Grant,
        *,
        ttl: float,
        safety_margin: float,
        sent_at: float,
    ) -> None:
        self._client = client
        self.job_key = job_key
        self.owner = owner
        self.token = grant.token
        self.ttl = ttl
        self.safety_margin = safety_margin
        self._expires_at = grant.expires_at
        #: When the takeover happened, by the database clock.
        self.acquired_at = grant.acquired_at
        self._acquired_mono = sent_at
        self._deadline = sent_at + ttl - safety_margin
        self._lost_reason: str | None = None
        self._released = False
        self._callbacks: list[OnLost] = []
        self._lock = threading.Lock()
        self._stop = Event()
        self._workers: list[Worker] = []
        self._body_task: Any = None
        self._cancelled_body = False
        # The renewal's parameters, made at the first renewal (a short run never renews).
        self._renew_for = -1.0
        self._renew_params = _UNSET_RENEW_PARAMS

    def __repr__(self) -> str:
        state = "lost" if self._lost_reason else "released" if self._released else "held"
        return f"<Lease {self.job_key!r} token={self.token} owner={self.owner} {state}>"

    @property
    def expires_at(self) -> dt.datetime:
        """Expiry by the database clock, as of the last successful acquire or renew."""
        return self._expires_at

    @property
    def deadline_in(self) -> float:
        """Seconds until the local deadline (negative once it has passed)."""
        return self._deadline - monotonic()

    @property
    def lost(self) -> bool:
        """True once the lease is lost: renewal refused, local deadline passed, or released."""
        if self._lost_reason is None and monotonic() >= self._deadline:
            self._mark_lost("deadline", "no successful renewal before the local deadline")
        return self._lost_reason is not None

    @property
    def lost_reason(self) -> str | None:
        return self._lost_reason if self.lost else None

    @property
    def marked_lost(self) -> bool:
        """True once the lease has been marked lost, without looking at the deadline now
        (:attr:`lost` marks it lost when the deadline has passed): the metric of held
        leases has already counted it out then."""
        return self._lost_reason is not None

    def _log_extra(self) -> dict[str, Any]:
        return {"job": self.job_key, "token": self.token, "owner": str(self.owner)}

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost. Call it before each unit of work."""
        if self.lost:
            raise LeaseLost(self.job_key, self.token, self._lost_reason or "lost")

    def on_lost(self, callback: OnLost) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is).

        With background renewal it runs in the renewal thread (sync) or task (asyncio).
        """
        if not callable(callback):
            raise InvalidArgumentType(
                f"on_lost() takes a callable (it receives the lease), got {callback!r}"
            )
        with self._lock:
            if self._lost_reason is None:
                self._callbacks.append(callback)
                return
        callback(self)

    def _mark_lost(self, kind: str, reason: str) -> None:
        with self._lock:
            if self._lost_reason is not None:
                return
            self._lost_reason = reason
            callbacks, self._callbacks = (self._callbacks, [])
        if not self._released:
            metrics.emit(metrics.LOST, self.job_key, kind)
            log.warning(
                "lease %r token %s lost: %s; starting no new work",
                self.job_key,
                self.token,
                reason,
                extra=self._log_extra(),
            )
        self._stop.set()
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("on_lost callback %r failed", callback, extra=self._log_extra())
        if self._body_task is not None and (not self._released):
            self._cancelled_body = True
            cancel_task(self._body_task)

    def renew(self) -> dt.datetime:
        """Extend the lease by its TTL from now (database clock) and return the new expiry.

        Raises :class:`LeaseLost` when the database refuses (expired or taken over) or the
        local deadline has passed, and a :class:`~tenure.DatabaseError` when the database
        cannot be asked (the lease is then still held until its local deadline). A renewal
        whose connection was lost after it was sent is a
        :class:`~tenure.DatabaseUnavailable` with ``outcome_unknown``: the database may have
        extended the lease, but the local deadline stays where the last known renewal put it.
        """
        self.check()
        ttl = self.ttl
        if ttl != self._renew_for:  # made once per TTL, not per renewal
            self._renew_for = ttl
            self._renew_params = (dt.timedelta(seconds=ttl), lock_timeout_ms(ttl / 3))
        ttl_param, lock_timeout = self._renew_params
        sent = monotonic()
        try:
            rows = self._client.fetch(
                "renew",
                {
                    "job_key": self.job_key,
                    "owner": self.owner,
                    "token": self.token,
                    "ttl": ttl_param,
                    "lock_timeout": lock_timeout,
                },
                doing=f"renewing lease {self.job_key!r}",
                wrote=True,
            )
        except TenureError:
            metrics.emit(metrics.RENEW, self.job_key, "error")
            raise
        if not rows:
            metrics.emit(metrics.RENEW, self.job_key, "lost")
            self._mark_lost("refused", "renewal refused: the lease expired or was taken over")
            self.check()
        self._expires_at = rows[0][0]
        self._deadline = max(self._deadline, sent + self.ttl - self.safety_margin)
        metrics.emit(metrics.RENEW, self.job_key, "renewed")
        return self._expires_at

    def release(self) -> bool:
        """Expire the lease now so a successor can take over at once. The row and its token
        stay: tokens never go back. Returns False if the lease was already gone."""
        self._stop_keeper()
        if self._released:
            return False
        was_lost = self._lost_reason is not None
        self.mark_released()
        if was_lost:
            return False
        rows = self._client.fetch(
            "release",
            {
                "job_key": self.job_key,
                "owner": self.owner,
                "token": self.token,
                "channel": self._client.lease_channel,
            },
            doing=f"releasing lease {self.job_key!r}",
            wrote=True,
        )
        metrics.emit(metrics.RELEASE, self.job_key, value=monotonic() - self._acquired_mono)
        log.info("lease %r token %s released", self.job_key, self.token, extra=self._log_extra())
        return bool(rows)

    def mark_released(self) -> None:
        """Record that the lease row was released by another statement (the scheduler's
        finish statement releases it together with the run's outcome). No SQL runs."""
        with self._lock:
            self._released = True
            if self._lost_reason is None:
                self._lost_reason = "released"
            self._callbacks = []

    # -- background renewal ---------------------------------------------------------------
    def keep(self, body: Any = None) -> None:
        """Renew in the background every ttl/3 and mark the lease lost at its local deadline
        (what ``client.lease()`` does). ``body``: an asyncio task or future to cancel when the
        lease is lost (asyncio only). Stop with :meth:`stop_keeping` or :meth:`release`."""
        if body is not None:
            self._body_task = body
        self._start_keeper()

    def stop_keeping(self) -> None:
        """Stop the background renewal without releasing the lease."""
        self._stop_keeper()

    def _start_keeper(self) -> None:
        self._workers = [
            spawn(self._renew_loop, f"tenure-renew-{self.job_key}"),
            spawn(self._watch_loop, f"tenure-watch-{self.job_key}"),
        ]

    def _stop_keeper(self) -> None:
        self._stop.set()
        workers, self._workers = (self._workers, [])
        for worker in workers:
            join(worker)

    def _renew_loop(self) -> None:
        """Renew every ttl/3 from the acquire; after an error, retry sooner until the local
        deadline. Counting from the acquire lets a holder start the keeper late (the
        scheduler does, for runs that outlive ttl/3): the first renewal is then due at once."""
        interval = self.ttl / 3
        next_at = self._acquired_mono + interval
        while not wait_event(self._stop, next_at - monotonic()):
            try:
                self.renew()
                next_at = monotonic() + interval
            except LeaseLost:
                return
            except TenureError as exc:
                log.warning(
                    "renewing lease %r token %s failed, retrying until the local deadline "
                    "(%.1fs left): %s",
                    self.job_key,
                    self.token,
                    self.deadline_in,
                    exc,
                    extra=self._log_extra(),
                )
                next_at = monotonic() + min(interval, 0.5)
            except Exception:
                log.exception("renewing lease %r failed unexpectedly", self.job_key)
                next_at = monotonic() + min(interval, 0.5)

    def _watch_loop(self) -> None:
        """Mark the lease lost at the local deadline, even while a renewal hangs."""
        while not wait_event(self._stop, self._deadline - monotonic()):
            if self.lost:
                return


class LeaseContext:
    """``with client.lease(key) as lease:``: acquire (or wait), renew in the background,
    release on exit. When the lease is lost, the on-lost callbacks run and ``check()``
    raises; the asyncio flavour also cancels the body's task and raises
    :class:`LeaseLost` from the ``async with``."""

    def __init__(
        self,
        client: Client,
        job_key: str,
        *,
        ttl: float,
        wait: float | None,
        safety_margin: float | None,
    ) -> None:
        self._client = client
        self._job_key = job_key
        self._ttl = ttl
        self._wait = wait
        self._margin = safety_margin
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        deadline = monotonic() + (self._wait or 0.0)
        waiter = None
        try:
            while True:
                outcome = self._client._attempt(self._job_key, self._ttl, self._margin)
                if isinstance(outcome, Lease):
                    break
                left = deadline - monotonic()
                if left <= 0:
                    raise outcome
                if waiter is None:
                    # Listen first, then ask again: a release between the busy answer and
                    # the LISTEN would otherwise go unnoticed until the lease's expiry.
                    waiter = self._client._release_waiter(self._job_key)
                    continue
                waiter.wait(min(left, waiter.pause(outcome.retry_after)))
        finally:
            if waiter is not None:
                waiter.close()
        outcome.keep(current_task())
        self._lease = outcome
        return outcome

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._lease
        assert lease is not None
        try:
            lease.release()
        except TenureError as err:
            log.warning(
                "could not release lease %r token %s (it will expire by itself): %s",
                lease.job_key,
                lease.token,
                err,
                extra=lease._log_extra(),
            )
        if lease._cancelled_body and isinstance(exc, CancelledError):
            uncancel(lease._body_task)
            raise LeaseLost(lease.job_key, lease.token, lease._lost_reason or "lost") from exc


__all__ = ["Lease", "LeaseBusy", "LeaseContext"]
