"""The operator actions the dashboard can run when started with actions enabled: the same
functions as ``tenure jobs pause|resume|trigger``, ``tenure release`` and ``tenure outbox
retry|purge``, and cancelling a running run (:func:`tenure.scheduler.jobs.cancel`), on a sync
client of their own (run in a worker thread)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..db import channels
from ..scheduler import jobs as ops

if TYPE_CHECKING:
    from ..leases._sync.client import Client

ACTIONS = (
    "pause",
    "resume",
    "trigger",
    "cancel",
    "release",
    "retry",
    "purge",
    "schedule-save",
    "schedule-pause",
    "schedule-resume",
    "schedule-remove",
    "bulk-pause",
    "bulk-resume",
)
#: Most jobs one bulk action changes (a page of the jobs list).
BULK_LIMIT = 50
#: The trigger kinds of the schedule form.
TRIGGERS = ("every", "cron", "at")


class Actions:
    def __init__(self, conninfo: str, schema: str) -> None:
        self._conninfo = conninfo
        self.schema = schema
        self._client: Client | None = None
        self._lock = threading.Lock()

    def _get(self) -> Client:
        with self._lock:
            if self._client is None:
                import tenure

                self._client = tenure.connect(
                    self._conninfo, schema=self.schema, pool_size=2, application_name="tenure ui"
                )
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def run_bulk(self, action: str, targets: list[str]) -> str:
        """``bulk-pause`` / ``bulk-resume``: the single action on each of ``targets`` (the
        jobs ticked on a page of the list), what happened to each, in words."""
        if not targets:
            return "no job selected: tick the jobs to change first"
        if len(targets) > BULK_LIMIT:
            return f"{len(targets)} jobs selected: at most {BULK_LIMIT} at a time"
        single = action.removeprefix("bulk-")
        done = [self.run(single, target) for target in dict.fromkeys(targets)]
        text = f"{len(done)} job(s): " + "; ".join(done)
        # The notice travels in the address of the page the browser is sent back to.
        return text if len(text) <= 800 else text[:800] + "…"

    def run(self, action: str, target: str, form: Mapping[str, str] | None = None) -> str:
        """Do ``action`` on ``target`` (a job key, or an outbox message id; ``form``: the
        schedule form's other fields); returns what happened, in words."""
        client = self._get()
        if action.startswith("schedule-"):
            return _schedule_action(client, action, target, form or {})
        channel = channels.channel("jobs", self.schema)
        if action == "pause":
            changed = ops.pause(client, target, channel=channel)
            return f"{target}: paused" if changed else f"{target}: was already paused"
        if action == "resume":
            resumed = ops.resume(client, target, channel=channel)
            if resumed is None:
                return f"{target}: was not paused"
            lifted = "quarantine lifted, " if resumed.quarantine is not None else ""
            return f"{target}: {lifted}resumed; next slot {resumed.next_slot.isoformat()}"
        if action == "trigger":
            done = ops.trigger(client, target, channel=channel)
            note = " (the job is paused: it runs once resumed)" if done.paused else ""
            if done.already_pending:
                return f"{target}: a run was already pending{note}"
            return f"{target}: triggered{note}"
        if action == "cancel":
            given = (form or {}).get("token", "")
            if not given.isdigit():
                raise ValueError("the run's token is missing: reload the job's page")
            run_token = int(given)
            cancelled = ops.cancel(client, target, run_token, by="from the dashboard")
            if not cancelled.cancelled:
                now = cancelled.running_token
                running = f"; the run in progress has token {now}" if now else ""
                return f"{target}: no run with token {run_token} in progress{running}"
            how = (
                "its lease ended, its worker is told to stop"
                if cancelled.lease_ended
                else "its lease had already expired"
            )
            return f"{target}: run with token {run_token} cancelled ({how}); not retried"
        if action == "release":
            token = client.release(target)
            return f"{target}: expired token {token}" if token else f"{target}: no live lease"
        from .. import outbox

        message_id = int(target)
        if action == "retry":
            ids = outbox.retry(client, ids=[message_id])
            return f"message {message_id}: re-driven" if ids else f"message {message_id}: not dead"
        if action == "purge":
            n = outbox.purge(client, older_than=0, state="dead", ids=[message_id])
            return f"message {message_id}: purged" if n else f"message {message_id}: not dead"
        raise ValueError(f"unknown action {action!r}")


def _schedule_action(client: Client, action: str, key: str, form: Mapping[str, str]) -> str:
    """The schedule pages' actions: the same functions as `tenure schedules`."""
    import tenure

    if action == "schedule-remove":
        removed = tenure.remove_schedule(client, key)
        return f"{key}: removed" if removed else f"{key}: no such schedule"
    if action == "schedule-pause":
        note = form.get("note", "").strip() or None
        was = tenure.pause_schedule(client, key, note=note)
        return f"{key}: note changed (was paused)" if was else f"{key}: paused"
    if action == "schedule-resume":
        slot = tenure.resume_schedule(client, key)
        return f"{key}: was not paused" if slot is None else f"{key}: resumed; next {slot}"
    # schedule-save: the create form (mode=create) or the edit form.
    trigger = form.get("trigger", "")
    if trigger not in TRIGGERS:
        raise tenure.InvalidArgument(f"trigger must be one of {', '.join(TRIGGERS)}")
    fields: dict[str, Any] = {trigger: form.get("value", "").strip()}
    if form.get("tz", "").strip():
        fields["timezone"] = form["tz"].strip()
    if form.get("task", "").strip():
        fields["task"] = form["task"].strip()
    fields["args"] = form.get("args", "").strip() or "{}"
    if form.get("mode") == "create":
        if "task" not in fields:
            raise tenure.InvalidArgument("a task is required")
        outcome = tenure.add_schedule(client, key, **fields)
    else:
        outcome = tenure.update_schedule(client, key, **fields)
    return f"{key}: {outcome}"
