"""Registering job definitions: upsert every job of an app, log new and changed ones."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from .jobs import channel_name, schedule_from_row

if TYPE_CHECKING:
    from ..leases._async.client import AsyncClient
    from .spec import JobSpec

log = logging.getLogger("tenure.scheduler")

#: Up to this many newly registered jobs are logged one line each, more as one summary.
NEW_JOBS_LOGGED = 20


async def register(client: AsyncClient, specs: list[JobSpec], *, defined_by: str) -> None:
    """Upsert job definitions; log new ones and changed ones (the newest registration wins)."""
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
        "channel": channel_name(client.schema),
    }
    rows = await client._fetch(
        "sched_register", params, doing="registering job definitions", wrote=True
    )
    by_key = {s.key: s for s in ordered}
    new = [row[0] for row in rows if row[10] is None]
    if len(new) > NEW_JOBS_LOGGED:
        # Thousands of "registered" lines would drown the startup line.
        log.info("%d new jobs registered (%s, ...)", len(new), ", ".join(map(repr, new[:3])))
    for row in rows:
        key, revision, next_slot, old_cron, old_every, old_tz = row[:6]
        old_defined_by = row[10]
        spec = by_key[key]
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
            before = schedule_from_row(key, old_cron, old_every, old_tz).describe()
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
