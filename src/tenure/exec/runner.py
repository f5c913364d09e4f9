"""``tenure exec``: run any command under a fenced lease (cron, Kubernetes, systemd timers).

The command runs in its own session and process group, with the lease's token in its
environment, while a background thread renews the lease. When the lease is lost (renewal
refused, or the local deadline passes while the database cannot be reached), the whole group
gets SIGTERM, then SIGKILL after ``--grace``, and ``tenure exec`` exits with
:data:`EXIT_LEASE_LOST`. A SIGTERM, SIGINT or SIGQUIT sent to ``tenure exec`` is passed on the
same way: SIGKILL follows after ``--grace`` if the command has not exited, at once on a
second one. Writes the command makes with ``$TENURE_FENCING_TOKEN`` (``tenure
result put``, or its own fenced transactions) are rejected once a successor has taken over,
so even a command that outlives its lease cannot commit anything older than its successor.

Exit codes (also in ``tenure exec --help``):

* 0: the command exited 0; or the lease is busy (``--busy-exit`` changes that); or the
  ``--slot``/``--every`` slot already completed on some host.
* N: the command's own exit code; 128+N when it died of signal N (like a shell).
* 1: tenure could not do its part (database unreachable, schema not migrated, ...); or the
  command succeeded but its ``--slot``/``--every`` slot could not be marked done.
* 2: bad usage (missing ``--``, unknown option, bad duration).
* 75 (:data:`EXIT_LEASE_LOST`, EX_TEMPFAIL): the lease was lost while the command ran and
  the command was stopped (or, when it had exited 0, its slot was not marked done).
* 126: the command was found but could not be executed; 127: it was not found.

The command line is :mod:`tenure.cli.exec`; this module runs one request. The command's
process group is :mod:`.supervisor`, once-per-slot is :mod:`.slots`. Only the standard
library is imported at module level: ``tenure exec`` in a crontab must start fast.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import tracing
from .history import prune_history, record_finish, record_start
from .output import say
from .slots import EARLY_TOLERANCE, SlotState, record_slot, slot_state
from .supervisor import Interrupted, Supervisor, exit_code

if TYPE_CHECKING:
    import datetime as dt

    from ..errors import LeaseBusy
    from ..leases._sync.client import Client
    from ..leases._sync.lease import Lease

log = logging.getLogger("tenure.exec")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_LEASE_LOST = 75  # EX_TEMPFAIL from sysexits.h: "try again later"
EXIT_NOT_EXECUTABLE = 126  # the shell's codes for a command it cannot run
EXIT_NOT_FOUND = 127

#: The outcome (metrics, textfile) of a run whose slot could not be marked done.
SLOT_UNRECORDED = "slot_unrecorded"
#: Prefix of ``tenure exec``'s option twins, kept out of the command's environment.
ENV_PREFIX = "TENURE_EXEC_"


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """What one ``tenure exec`` invocation was asked to do (validated)."""

    key: str
    command: tuple[str, ...]
    ttl: float
    wait: float | None
    grace: float
    busy_exit: int
    slot: str | None
    every: int | None
    quiet: bool
    dsn: str | None
    schema: str
    #: Exec history older than this (seconds) is pruned, a bounded amount, after each run.
    retention: float = 7 * 86400.0
    #: With ``every``: how far before its time (seconds) a slot may already run.
    early: float = EARLY_TOLERANCE


def run_with_textfile(request: ExecRequest, path: str) -> int:
    """Run, then record this run's gauges in ``path`` (see :mod:`tenure.exec.textfile`)."""
    from .. import metrics
    from . import textfile

    runs: list[metrics.Event] = []
    unsubscribe = metrics.subscribe(
        lambda e: runs.append(e) if e.name == metrics.JOB and e.job == request.key else None
    )
    try:
        code = main(request)
    finally:
        unsubscribe()
    outcome = runs[-1].outcome if runs else "error"
    try:
        textfile.write_last_run(path, request.key, outcome, code, runs[-1].value if runs else None)
    except OSError as exc:
        say(f"warning: could not write --metrics-textfile {path}: {exc}")
    return code


def main(request: ExecRequest) -> int:
    """Run one ``tenure exec``; returns the exit code. Prints one line per problem."""
    from ..errors import TenureError

    # Signals are handled from the start, so that SIGTERM while connecting or waiting for the
    # lease ends tenure cleanly (even as a container's PID 1, where an unhandled SIGTERM
    # would be ignored); once the command runs they are passed on to it instead.
    child = Supervisor(request.grace, request.key)
    child.install_signal_handlers()
    try:
        return _run(request, child)
    except TenureError as exc:
        say(f"error: {exc}")
        return EXIT_ERROR
    except Interrupted as exc:
        say(f"{signal.Signals(exc.signum).name} before the command started; not running it")
        return 128 + exc.signum
    except KeyboardInterrupt:  # SIGINT before our handler was installed
        say("interrupted before the command started; not running it")
        return 128 + signal.SIGINT
    finally:
        child.restore_signal_handlers()


def _run(req: ExecRequest, child: Supervisor) -> int:
    from ..db.dsn import resolve
    from ..leases._sync.client import connect

    conninfo, _source = resolve(req.dsn)
    client = connect(conninfo, schema=req.schema, pool_size=2)
    try:
        return _run_connected(client, conninfo, req, child)
    finally:
        # Bounded: with the database gone, the pool must not hold the exit for long.
        client.close(timeout=1.0)


def _run_connected(client: Client, conninfo: str, req: ExecRequest, child: Supervisor) -> int:
    from .. import metrics
    from ..errors import LeaseBusy

    slot: str | None = None
    open_until: dt.datetime | None = None
    if req.slot is not None or req.every is not None:
        # A slot already done needs no token: answer before taking the lease.
        state = slot_state(client, req.key, req.slot, req.every, req.early)
        slot, open_until = state.slot, state.open_until
        if state.done:
            metrics.emit(metrics.JOB, req.key, "already_done")
            _already_done(req, state)
            return EXIT_OK
        if not state.can_record:
            # It could never be marked done: every host would run it again. Refuse it
            # before anything runs.
            metrics.emit(metrics.JOB, req.key, SLOT_UNRECORDED)
            say(f"error: {state.not_recordable(client.schema, req.key)}")
            return EXIT_ERROR
    started = time.monotonic()
    try:
        with client.lease(req.key, ttl=req.ttl, wait=req.wait) as lease:
            attributes = {
                "tenure.job_key": req.key,
                "tenure.token": lease.token,
                "tenure.slot": slot,
            }
            with tracing.span("tenure.exec", attributes) as span:
                code, outcome = _run_leased(client, lease, conninfo, req, slot, child, open_until)
                span.set("process.exit.code", code)
                span.outcome(outcome)
    except LeaseBusy as busy:
        metrics.emit(metrics.JOB, req.key, "busy")
        if not req.quiet:
            say(_busy_line(busy, req))
        return req.busy_exit
    # Lease released: each run pays for the history it leaves (docs/retention.md).
    prune_history(client, req.retention)
    metrics.emit(metrics.JOB, req.key, outcome, time.monotonic() - started)
    return code


def _run_leased(
    client: Client,
    lease: Lease,
    conninfo: str,
    req: ExecRequest,
    slot: str | None,
    child: Supervisor,
    open_until: dt.datetime | None = None,
) -> tuple[int, str]:
    """With the lease held: start the command, supervise it, record the slot."""
    extra = {"job": req.key, "token": lease.token, "slot": slot}
    if slot is not None:
        # Checked again under the lease, in a new statement: a predecessor that completed
        # the slot while our takeover waited for its fenced transaction is visible now.
        state = slot_state(client, req.key, slot, None)
        if state.done:
            _already_done(req, state)
            return EXIT_OK, "already_done"
    # This exec's own settings (its options' TENURE_EXEC_* twins) stay here: a nested
    # `tenure exec` in the command must take only the options it is given.
    env = {name: value for name, value in os.environ.items() if not name.startswith(ENV_PREFIX)}
    env.update(
        TENURE_JOB_KEY=req.key,
        TENURE_FENCING_TOKEN=str(lease.token),
        TENURE_LEASE_OWNER=str(lease.owner),
        TENURE_DSN=conninfo,
        TENURE_SCHEMA=req.schema,
    )
    if slot is not None:
        env["TENURE_SLOT"] = slot
    else:  # not an outer exec's slot either
        env.pop("TENURE_SLOT", None)
    # The command's own spans can join this run's trace (OpenTelemetry's TRACEPARENT
    # environment convention for processes).
    parent = tracing.traceparent()
    if parent is not None:
        env["TRACEPARENT"] = parent
    child.token = lease.token
    lease.on_lost(child.lease_lost)
    record_start(client, req.key, lease.token, slot)

    def finish(outcome: str, code: int, error: str | None = None) -> None:
        record_finish(client, req.key, lease.token, outcome, code, error)

    try:
        started = child.spawn(req.command, env)
    except OSError as exc:
        code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        why = "not found" if code == EXIT_NOT_FOUND else "cannot be executed"
        say(f"error: command {req.command[0]!r} {why} ({exc.strerror}); lease released")
        finish("failed", code, f"command {req.command[0]!r} {why} ({exc.strerror})")
        return code, "not_started"
    if not started:
        say(f"lease {req.key!r} token {lease.token} was lost before the command started")
        finish("lease_lost", EXIT_LEASE_LOST, "the lease was lost before the command started")
        return EXIT_LEASE_LOST, "lease_lost"
    try:
        log.info("started %s as pid %s", req.command[0], child.pid, extra=extra)
        status = child.wait()
    except BaseException:
        # tenure itself is failing: never leave the command running unsupervised.
        child.abort()
        raise
    code = exit_code(status)
    if child.killed is not None:
        say(child.killed)
    if child.lost_reason is not None:
        say(
            f"lease {req.key!r} token {lease.token} lost while the command ran "
            f"({child.lost_reason}); the command was stopped (its exit status: {code})"
        )
        finish("lease_lost", code, child.lost_reason)
        return EXIT_LEASE_LOST, "lease_lost"
    if code != 0:
        finish("failed", code, f"exit status {code}")
        return code, "failed"
    if slot is not None:
        code, outcome = _record(client, lease, slot, extra, open_until)
        if outcome != "succeeded":
            # The command succeeded, its slot was not marked done: the run failed its
            # promise of once per slot (or lost its lease first).
            recorded = "lease_lost" if outcome == "lease_lost" else "failed"
            finish(recorded, code, f"exit status 0, but the slot was not marked done ({outcome})")
            return code, outcome
    finish("succeeded", code)
    return code, "succeeded"


def _record(
    client: Client,
    lease: Lease,
    slot: str,
    extra: dict[str, Any],
    open_until: dt.datetime | None,
) -> tuple[int, str]:
    """Mark the slot done after the command succeeded. A slot that cannot be marked will run
    again: never a silent success."""
    from ..errors import DatabaseUnavailable, StaleTokenError, TenureError

    try:
        record_slot(client, lease, slot, extra, open_until=open_until)
    except StaleTokenError:
        say(
            f"lease {lease.job_key!r} token {lease.token} was lost before slot {slot!r} could "
            "be marked done (the command succeeded); the slot may run again"
        )
        return EXIT_LEASE_LOST, "lease_lost"
    except TenureError as exc:
        # A lost commit acknowledgement leaves it unknown; anything else was rolled back.
        unknown = isinstance(exc, DatabaseUnavailable) and exc.outcome_unknown
        say(
            f"error: the command succeeded but slot {slot!r} "
            f"{'may not have been' if unknown else 'was not'} marked done, so it may run "
            f"again: {exc}"
        )
        return EXIT_ERROR, SLOT_UNRECORDED
    return EXIT_OK, "succeeded"


def _busy_line(busy: LeaseBusy, req: ExecRequest) -> str:
    if busy.token is not None and busy.expires_at is not None:
        holder = (
            f"held with token {busy.token} until {busy.expires_at.isoformat()} (database clock)"
        )
    else:
        holder = "another execution won the race for it"
    waited = f" after waiting {req.wait:g}s" if req.wait else ""
    return f"{req.key!r} is busy{waited}: {holder}; not running {req.command[0]!r}"


def _already_done(req: ExecRequest, state: SlotState) -> None:
    if not req.quiet:
        done_at = state.done_at.isoformat() if state.done_at is not None else "?"
        say(
            f"{req.key!r} slot {state.slot!r} already done (token {state.done_token}, "
            f"{done_at}); not running {req.command[0]!r}"
        )
