"""``tenure status``: every job as the database sees it, whatever process did the work.

One statement (``db/sql/status.sql``) per call: the lease (holder token, expiry), the schedule
(next slot, paused), the newest run and its outcome, and counts and duration percentiles
over a recent window from the scheduler's run history. Every time is the database clock.
Runs come from the scheduler's history (``job_runs``) and ``tenure exec``'s
(``exec_runs``, kind ``exec``); jobs run by the library alone have a lease and maybe a
result, but no run history: their counts are zero and their percentiles empty.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..scheduler.jobs import undefined_jobs
from .rows import StatusRow

if TYPE_CHECKING:
    import uuid

    from ..leases._sync.client import Client


@dataclass(frozen=True, slots=True)
class LastRun:
    """The newest run. ``kind`` is ``exec`` for a ``tenure exec`` run, whose ``slot`` is its
    ``--slot``/``--every`` text (or None) and which has the command's ``exit_code``."""

    slot: dt.datetime | str | None
    kind: str
    token: int
    outcome: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    error: str | None
    exit_code: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot.isoformat() if isinstance(self.slot, dt.datetime) else self.slot,
            "kind": self.kind,
            "token": self.token,
            "outcome": self.outcome,
            "started_at": self.started_at.isoformat(),
            "finished_at": _iso(self.finished_at),
            "error": self.error,
            "exit_code": self.exit_code,
        }


@dataclass(frozen=True, slots=True)
class JobOverview:
    job_key: str
    token: int | None  # the lease's token (the holder's while held)
    owner: uuid.UUID | None
    expires_at: dt.datetime | None
    held: bool
    seconds_left: float | None
    scheduled: bool
    paused: bool | None
    next_slot: dt.datetime | None
    last_run: LastRun | None
    window: float  # seconds the counts and percentiles cover
    runs: int
    failures: int
    lost_leases: int
    stale_rejections: int
    p50: float | None
    p95: float | None
    p99: float | None
    result_token: int | None
    result_at: dt.datetime | None
    now: dt.datetime
    quarantined: str | None = None  # why the scheduler quarantined (paused) the job
    #: A scheduled job that no live worker of its app defines (scheduler/presence.py).
    undefined: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job_key,
            "token": self.token,
            "held": self.held,
            "owner": None if self.owner is None else str(self.owner),
            "expires_at": _iso(self.expires_at),
            "seconds_left": None if self.seconds_left is None else round(self.seconds_left, 3),
            "scheduled": self.scheduled,
            "paused": self.paused,
            "quarantined": self.quarantined,
            "defined": None if not self.scheduled else not self.undefined,
            "next_slot": _iso(self.next_slot),
            "last_run": None if self.last_run is None else self.last_run.as_json(),
            "window_seconds": self.window,
            "runs": self.runs,
            "failures": self.failures,
            "lost_leases": self.lost_leases,
            "stale_rejections": self.stale_rejections,
            "duration_p50": _round(self.p50),
            "duration_p95": _round(self.p95),
            "duration_p99": _round(self.p99),
            "result_token": self.result_token,
            "result_at": _iso(self.result_at),
            "now": self.now.isoformat(),
        }


def answered_by(address: str | None, port: int) -> str:
    """A server as it sees itself: ``inet_server_addr():inet_server_port()`` over TCP (through
    a proxy or HAProxy, the member behind it), or its port over a Unix socket."""
    return f"{address}:{port}" if address is not None else f"socket, port {port}"


@dataclass(frozen=True, slots=True)
class Server:
    """The server that answered: its address as it sees itself, whether it is a standby, and
    the WAL timeline its tokens are floored on (None on a standby, which issues none)."""

    address: str | None
    port: int
    standby: bool
    timeline: int | None

    @property
    def answered_by(self) -> str:
        return answered_by(self.address, self.port)

    def describe(self) -> str:
        role = "standby" if self.standby else f"primary, timeline {self.timeline}"
        return f"answered by {self.answered_by} ({role})"

    def as_json(self) -> dict[str, Any]:
        return {"answered_by": self.answered_by, "standby": self.standby, "timeline": self.timeline}


def server(client: Client) -> Server:
    """Which server answers this client now, and its timeline."""
    [(_version, standby, _read_only, address, port, timeline)] = client.fetch(
        "observe_server", {}, doing="reading which server answered"
    )
    return Server(address, int(port), bool(standby), None if timeline is None else int(timeline))


def _round(seconds: float | None) -> float | None:
    # Microseconds: what timestamptz resolves; percentile_cont's interpolation adds noise.
    return None if seconds is None else round(seconds, 6)


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def overview(client: Client, *, window: float = 3600.0) -> list[JobOverview]:
    """Every job key with a lease or a schedule, ordered by key."""
    rows = client.fetch(
        "status_jobs",
        {"window": dt.timedelta(seconds=window)},
        doing="reading the status of every job",
        row=StatusRow,
    )
    undefined = undefined_jobs(client) if any(r.scheduled for r in rows) else set()
    found = []
    for r in rows:
        last = None
        if r.started_at is not None:
            last = LastRun(
                r.slot if r.kind != "exec" else r.exec_slot,
                r.kind,
                r.token,
                r.outcome,
                r.started_at,
                r.finished_at,
                r.error,
                r.exit_code,
            )
        p50, p95, p99 = r.durations if r.durations is not None else (None, None, None)
        found.append(
            JobOverview(
                job_key=r.job_key,
                token=r.fencing_token,
                owner=r.lease_owner,
                expires_at=r.lease_until,
                held=r.held,
                seconds_left=r.seconds_left,
                scheduled=r.scheduled,
                paused=r.paused,
                next_slot=r.next_slot,
                last_run=last,
                window=window,
                runs=r.runs,
                failures=r.failures,
                lost_leases=r.lost_leases,
                stale_rejections=r.stale_rejections,
                p50=p50,
                p95=p95,
                p99=p99,
                result_token=r.applied_fencing_token,
                result_at=r.written_at,
                now=r.now,
                quarantined=r.quarantine_reason,
                undefined=r.job_key in undefined,
            )
        )
    return found
