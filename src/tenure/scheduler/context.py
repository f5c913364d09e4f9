"""What a job function receives: :class:`JobContext` (slot, token, lease, cancellation) and
``ctx.results``, the fenced result store bound to the run's token. The behaviour is the one
run context of :mod:`tenure.leases.context`; this face adds what a scheduled run knows."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from ..leases.context import LoopStore, RunContext, RunResults

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient
    from ..leases._async.lease import AsyncLease

#: ``ctx.results`` (the name it had before the one run context).
JobResults = RunResults


class JobContext(RunContext):
    """What a job function receives: which slot it runs, its token and lease, and fenced
    writes bound to that token.

    * ``args``: a runtime schedule's JSON arguments (a dict; ``{}`` for a coded job) and
      ``task``: its task's name (None for a coded job).
    * ``job_key``, ``token`` (the fencing token of this run), ``slot`` (the scheduled time, in
      the job's time zone; the trigger time for a manual run), ``kind`` ("scheduled",
      "retry" or "manual"), ``attempt``, ``lease`` (renewed in the background), ``worker_id``.
    * ``check()`` raises :class:`~tenure.LeaseLost` once the lease is lost or the worker is
      shutting down; ``cancelled`` is then True. Call it between units of work.
      ``wait(seconds)`` sleeps in a sync job, waking early when cancelled.
    * ``fence(conn)`` / ``await fence_async(conn)``: fence your own transaction on ``conn``
      with this run's token (see :func:`tenure.fence`).
    * ``results.put(payload)`` (from a sync job's thread) / ``await
      results.put_async(payload)`` (from an async job): the fenced result store.
    """

    def __init__(
        self,
        *,
        job_key: str,
        token: int,
        slot: dt.datetime,
        kind: str,
        attempt: int,
        lease: AsyncLease,
        client: AsyncClient,
        worker_id: str,
        args: dict[str, Any] | None = None,
        task: str | None = None,
        store: LoopStore | None = None,
    ) -> None:
        # ``store``: the worker's one LoopStore for every run (made per run, it cost a run's
        # launch a few percent of the worker's time at 10,000 runs/s).
        super().__init__(
            job_key=job_key,
            token=token,
            schema=client.schema,
            store=LoopStore(client) if store is None else store,
            lease=lease,
        )
        #: A runtime schedule's JSON arguments ({} for a coded job) and its task's name.
        self.args: dict[str, Any] = {} if args is None else args
        self.task = task
        self.slot = slot
        self.kind = kind
        self.attempt = attempt
        self.lease = lease
        self.worker_id = worker_id
        self._client = client
        # Whether the body saw that it must stop (``cancelled`` was True when it looked;
        # ``check()``, ``wait()`` and the fenced writes look too): a sync body that returned
        # without being told did its work whole (scheduler/execution.py).
        self._told = False

    @property
    def cancelled(self) -> bool:
        """True once the lease is lost or the run was stopped: stop working."""
        stopped = super().cancelled
        if stopped:
            self._told = True
        return stopped

    def __repr__(self) -> str:
        return (
            f"<JobContext {self.job_key!r} slot={self.slot.isoformat()} token={self.token} "
            f"{self.kind}{' cancelled' if self._stopped else ''}>"
        )
