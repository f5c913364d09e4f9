"""One claimed job, as ``sched_claim`` returned it, and the parameters that record a batch
of plans with ``sched_start`` (one array element per claimed job or skipped slot)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .schedules import JobState, Plan, Policy

if TYPE_CHECKING:
    from .spec import JobSpec

#: The array parameters of sched_start, one element per claimed job or skipped slot.
START_ARRAYS = (
    *("keys", "tokens", "owners", "revisions", "run_slots", "run_kinds", "attempts"),
    *("next_slots", "done_slots", "triggers", "prior_tokens", "prior_errors"),
    *("crash_streaks", "quarantines"),
    *("skip_keys", "skip_slots", "skip_tokens", "skip_kinds", "skip_outcomes", "skip_errors"),
)


@dataclass(frozen=True, slots=True)
class Claim:
    """One claimed job, as the claim statement returned it."""

    job_key: str
    owner: uuid.UUID
    token: int
    lease_until: dt.datetime
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    ttl: dt.timedelta
    misfire: str
    misfire_grace: dt.timedelta | None
    on_crash: str
    revision: int
    state: JobState
    now: dt.datetime
    quarantine_after: int | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Claim:
        (
            key,
            owner,
            token,
            until,
            cron,
            every,
            tz,
            ttl,
            misfire,
            grace,
            on_crash,
            revision,
            next_slot,
            done_slot,
            running_slot,
            running_kind,
            running_token,
            running_attempt,
            trigger_at,
            now,
            _ready,
            prior_gone,
            crash_streak,
            quarantine_after,
        ) = row
        state = JobState(
            next_slot,
            done_slot,
            running_slot,
            running_kind,
            running_token,
            running_attempt,
            trigger_at,
            bool(prior_gone),
            crash_streak,
        )
        return cls(
            key,
            owner,
            token,
            until,
            cron,
            every,
            tz,
            ttl,
            misfire,
            grace,
            on_crash,
            revision,
            state,
            now,
            quarantine_after,
        )

    def policy(self) -> Policy:
        grace = None if self.misfire_grace is None else self.misfire_grace.total_seconds()
        return Policy(self.misfire, grace, self.on_crash, self.quarantine_after)

    def differs_from(self, spec: JobSpec) -> bool:
        mine = (
            spec.schedule.cron,
            spec.schedule.every,
            spec.schedule.timezone,
            spec.ttl,
            spec.policy.misfire,
            spec.policy.misfire_grace,
            spec.policy.on_crash,
            spec.policy.quarantine_after,
        )
        theirs = (
            self.cron,
            self.every,
            self.timezone,
            self.ttl.total_seconds(),
            self.misfire,
            None if self.misfire_grace is None else self.misfire_grace.total_seconds(),
            self.on_crash,
            self.quarantine_after,
        )
        return mine != theirs


def start_params(
    planned: Sequence[tuple[Claim, Plan]], *, worker: str, host: str, pid: int
) -> dict[str, Any]:
    """The parameters of ``sched_start`` for a batch of claims and their plans."""
    p: dict[str, list[Any]] = {name: [] for name in START_ARRAYS}
    for claim, d in planned:
        p["keys"].append(claim.job_key)
        p["tokens"].append(claim.token)
        p["owners"].append(claim.owner)
        p["revisions"].append(claim.revision)
        p["run_slots"].append(d.run_slot)
        p["run_kinds"].append(d.run_kind)
        p["attempts"].append(d.attempt)
        p["next_slots"].append(d.next_slot)
        p["done_slots"].append(d.done_slot)
        p["triggers"].append(d.trigger_at)
        p["prior_tokens"].append(d.prior_token)
        p["prior_errors"].append(d.prior_error)
        p["crash_streaks"].append(d.crash_streak)
        p["quarantines"].append(d.quarantine)
        for s in d.skipped:
            p["skip_keys"].append(claim.job_key)
            p["skip_slots"].append(s.slot)
            p["skip_tokens"].append(claim.token)
            p["skip_kinds"].append(s.kind)
            p["skip_outcomes"].append(s.outcome)
            p["skip_errors"].append(s.error)
    params: dict[str, Any] = dict(p)
    params.update(worker=worker, host=host, pid=pid)
    return params
