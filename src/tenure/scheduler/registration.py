"""Registering job definitions: upsert every job of an app, log new and changed ones.

A definition belongs to the app that registered it (``Scheduler.name``): a worker of another
app that defines the same key is refused (:class:`~tenure.JobOwnedByAnotherApp`) unless it
adopts the job, so two apps sharing a schema cannot flip a definition on each deploy."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from ..db.channels import channel
from ..errors import JobOwnedByAnotherApp
from .rows import RegisteredRow
from .schedules import schedule_from_row

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient
    from .spec import JobSpec

log = logging.getLogger("tenure.scheduler")

#: Up to this many newly registered jobs are logged one line each, more as one summary.
NEW_JOBS_LOGGED = 20


#: Registrations run one at a time per schema under this lock (and so does `tenure jobs
#: remove`, which must see the presence row of every worker that registered before it).
REGISTER_LOCK = "register"

#: A refusal names up to this many conflicting job keys.
CONFLICTS_NAMED = 3

#: The registration's statement and lock timeouts: the pool's 5 s, or 1 ms per job when that
#: is longer (120,000 jobs took 3.2-3.5 s on an idle 2-core machine, over 5 s beside running
#: workers, and the workers of a deploy wait for each other's registrations).
MIN_SECONDS = 5.0
SECONDS_PER_JOB = 0.001


async def register(
    client: AsyncClient,
    specs: list[JobSpec],
    *,
    defined_by: str,
    app: str,
    adopt: bool = False,
) -> None:
    """Upsert app ``app``'s job definitions; log new, changed and adopted ones.

    Raises :class:`JobOwnedByAnotherApp`, writing nothing, if another app owns one of the
    keys and ``adopt`` is false.
    """
    if not specs:
        return
    now = await client.now()
    ordered = sorted(specs, key=lambda s: s.key)
    params = {
        "keys": [s.key for s in ordered],
        "crons": [s.schedule.cron for s in ordered],
        "everys": [s.schedule.every for s in ordered],
        "timezones": [s.schedule.timezone for s in ordered],
        "ttls": [dt.timedelta(seconds=s.ttl) for s in ordered],
        "misfires": [s.policy.misfire for s in ordered],
        "graces": [
            None if s.policy.misfire_grace is None else dt.timedelta(seconds=s.policy.misfire_grace)
            for s in ordered
        ],
        "on_crashes": [s.policy.on_crash for s in ordered],
        "quarantine_afters": [s.policy.quarantine_after for s in ordered],
        "next_slots": [s.schedule.next_after(now) for s in ordered],
        "defined_by": defined_by,
        "app": app,
        "adopt": adopt,
        "channel": channel("jobs", client.schema),
    }
    rows = await client.fetch_sized(
        "sched_register",
        params,
        doing="registering job definitions",
        seconds=max(MIN_SECONDS, len(ordered) * SECONDS_PER_JOB),
        serialize=REGISTER_LOCK,
        wrote=True,
        row=RegisteredRow,
    )
    scheduled = {row.job_key: row.task for row in rows if row.conflict and row.task is not None}
    if scheduled:
        raise _scheduled_refusal(scheduled, client.schema)
    conflicts = {row.job_key: row.app for row in rows if row.conflict and row.app is not None}
    if conflicts:
        raise _refusal(conflicts, app, client.schema)
    by_key = {s.key: s for s in ordered}
    new = [row.job_key for row in rows if row.defined_by is None]
    if len(new) > NEW_JOBS_LOGGED:
        # Thousands of "registered" lines would drown the startup line.
        log.info("%d new jobs registered (%s, ...)", len(new), ", ".join(map(repr, new[:3])))
    for row in rows:
        key, revision, next_slot = row.job_key, row.revision, row.next_slot
        old_defined_by, old_app, redefined = row.defined_by, row.app, row.redefined
        spec = by_key[key]
        if old_app is not None and old_app != app:
            log.warning(
                "job %r adopted from app %r (was defined by %s): app %r owns it now; workers "
                "of %r no longer run it and refuse to start until they stop defining it",
                key,
                old_app,
                old_defined_by,
                app,
                old_app,
                extra={"job": key},
            )
        if old_defined_by is not None and not redefined:
            continue  # only the owner was stamped or changed: the definition is the same
        if old_defined_by is None:
            if len(new) > NEW_JOBS_LOGGED:
                continue
            log.info(
                "job %r registered: %s, first slot %s",
                key,
                spec.schedule.describe(),
                next_slot.isoformat(),
                extra={"job": key},
            )
        else:
            before = schedule_from_row(key, row.cron, row.every, row.timezone).describe()
            log.warning(
                "job %r definition changed by this deploy (revision %d, was defined by %s): "
                "%s -> %s, ttl %gs, misfire %s, on_crash %s; next slot %s",
                key,
                revision,
                old_defined_by,
                before,
                spec.schedule.describe(),
                spec.ttl,
                spec.policy.misfire,
                spec.policy.on_crash,
                next_slot.isoformat(),
                extra={"job": key},
            )


def _scheduled_refusal(keys: dict[str, str], schema: str) -> JobOwnedByAnotherApp:
    named = ", ".join(repr(k) for k in sorted(keys)[:CONFLICTS_NAMED])
    if len(keys) > CONFLICTS_NAMED:
        named += f" and {len(keys) - CONFLICTS_NAMED} more"
    message = (
        f"job key {named} is a runtime schedule in schema {schema!r} (added with "
        "`tenure schedules add`), not a coded job; nothing was registered. Rename the job "
        "in code, or remove the schedule first with `tenure schedules remove KEY`"
    )
    return JobOwnedByAnotherApp(message, {k: f"schedule of task {t!r}" for k, t in keys.items()})


async def register_tasks(
    client: AsyncClient, tasks: list[str], *, app: str, registered_by: str
) -> None:
    """Record the tasks app ``app``'s workers run (``@app.task``), so that a schedule naming
    a task no worker of the app has is refused when it is added."""
    if not tasks:
        return
    await client.fetch(
        "sched_register_tasks",
        {"app": app, "tasks": sorted(tasks), "registered_by": registered_by},
        doing="registering tasks",
        wrote=True,
    )


def _refusal(conflicts: dict[str, str], app: str, schema: str) -> JobOwnedByAnotherApp:
    keys = sorted(conflicts)
    owners = sorted(set(conflicts.values()))
    named = ", ".join(repr(k) for k in keys[:CONFLICTS_NAMED])
    if len(keys) > CONFLICTS_NAMED:
        named += f" and {len(keys) - CONFLICTS_NAMED} more"
    subject = f"job {named}" if len(keys) == 1 else f"jobs {named}"
    verb = "belongs" if len(keys) == 1 else "belong"
    owner = " and ".join(repr(o) for o in owners)
    message = (
        f"{subject} {verb} to app {owner} in schema {schema!r}, not to this app {app!r}; "
        "nothing was registered. Rename the job in this app, or take it over on purpose "
        "with `tenure worker --adopt` ($TENURE_WORKER_ADOPT=1, or Scheduler.run(adopt=True))"
    )
    return JobOwnedByAnotherApp(message, {k: conflicts[k] for k in keys})
