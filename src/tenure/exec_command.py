"""``tenure exec``: run any command under a fenced lease (cron, Kubernetes, systemd timers).

The command runs in its own session and process group, with the lease's token in its
environment, while a background thread renews the lease. When the lease is lost (renewal
refused, or the local deadline passes while the database cannot be reached), the whole group
gets SIGTERM, then SIGKILL after ``--grace``, and ``tenure exec`` exits with
:data:`EXIT_LEASE_LOST`. Writes the command makes with ``$TENURE_FENCING_TOKEN`` (``tenure
result put``, or its own fenced transactions) are rejected once a successor has taken over,
so even a command that outlives its lease cannot commit anything older than its successor.

Exit codes (also in ``tenure exec --help``):

* 0: the command exited 0; or the lease is busy (``--busy-exit`` changes that); or the
  ``--slot``/``--every`` slot already completed on some host.
* N: the command's own exit code; 128+N when it died of signal N (like a shell).
* 1: tenure could not do its part (database unreachable, schema not migrated, ...).
* 2: bad usage (missing ``--``, unknown option, bad duration).
* 75 (:data:`EXIT_LEASE_LOST`, EX_TEMPFAIL): the lease was lost while the command ran and
  the command was stopped.
* 126: the command was found but could not be executed; 127: it was not found.

This module is imported by :mod:`tenure.cli` (which registers the command) and imports only
click, the standard library and ``tenure.cli`` at module level: psycopg comes in with the
``tenure`` package itself, and nothing else heavy is imported on the way to the command.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import click

from .cli import db_options

if TYPE_CHECKING:
    from ._sync.client import Client
    from ._sync.lease import Lease
    from .errors import LeaseBusy

log = logging.getLogger("tenure.exec")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_LEASE_LOST = 75  # EX_TEMPFAIL from sysexits.h: "try again later"
EXIT_NOT_EXECUTABLE = 126  # the shell's codes for a command it cannot run
EXIT_NOT_FOUND = 127

#: Signals passed on to the command's process group (unless ignored when tenure started).
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
MAX_SLOT = 200
PROG = "tenure exec"
# The settings of every tenure command (tenure.cli.CONTEXT), spelled out: mypy cannot infer
# a value imported back from the module that imports this one.
CONTEXT: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
    "show_default": True,
}

EPILOG = f"""\b
Exit codes:
  0    the command exited 0; or the lease is busy (see --busy-exit); or the slot
       (--slot/--every) already completed on some host
  N    the command's own exit code; 128+N if it died of signal N (like a shell)
  1    tenure error: database unreachable, schema not migrated, ... (command not run)
  2    bad usage: missing --, unknown option, bad duration
  {EXIT_LEASE_LOST}   the lease was lost while the command ran (renewal refused, or the
       database unreachable until the local deadline); the command was stopped
  126  the command was found but is not executable
  127  the command was not found

\b
The command's environment also has:
  TENURE_JOB_KEY, TENURE_FENCING_TOKEN   what `tenure result put` reads by default
  TENURE_LEASE_OWNER                     this execution's owner UUID
  TENURE_DSN, TENURE_SCHEMA              where the lease lives (resolved DSN)
  TENURE_SLOT                            the slot, with --slot/--every

\b
Examples:
  tenure exec --key nightly-report -- ./report.sh
  */5 * * * *  tenure exec -q --key sync --every 5m -- /opt/sync/run
  echo '{{"rows": 42}}' | tenure result put      # inside the command: fenced write
"""


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


class UsageProblem(click.ClickException):
    """Bad usage, printed as one line (click's default adds the usage block)."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(f"{PROG}: error: {_one_line(self.message)} (see `{PROG} --help`)", err=True)


class ExecCommand(click.Command):
    """A command whose own options end at ``--``; everything after it is the command to run.

    Requiring ``--`` keeps the child's options (``ls -l``) from being read as ours.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            if not ctx.resilient_parsing and not any(a in ("-h", "--help") for a in args):
                raise UsageProblem(
                    "missing `--` before the command: "
                    "tenure exec --key KEY [OPTIONS] -- COMMAND [ARGS...]"
                )
            own, command = args, []
        else:
            split = args.index("--")
            own, command = args[:split], args[split + 1 :]
        try:
            rest = super().parse_args(ctx, own)
        except click.UsageError as exc:
            raise UsageProblem(exc.format_message()) from None
        if not command and not ctx.resilient_parsing:
            raise UsageProblem("no command after `--`")
        ctx.params["command"] = tuple(command)
        return rest

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[OPTIONS]", "--", "COMMAND", "[ARGS]..."]


class DurationType(click.ParamType):  # type: ignore[type-arg]
    """``30s``, ``250ms``, ``5m``, ``1h`` or plain seconds, in seconds (float)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        from .errors import InvalidArgument
        from .validation import parse_duration

        try:
            seconds = parse_duration(value)
        except InvalidArgument:
            self.fail(f"{value!r} is not a duration: use 250ms, 30s, 5m, 1h or seconds")
        if seconds < 0:
            self.fail(f"{value!r} is negative")
        return seconds


DURATION = DurationType()


def _check_ttl(ctx: click.Context, param: click.Parameter, value: float) -> float:
    from .errors import InvalidArgument
    from .validation import check_ttl

    try:
        return check_ttl(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _check_every(ctx: click.Context, param: click.Parameter, value: float | None) -> int | None:
    if value is None:
        return None
    if value < 1 or value != int(value):
        raise click.BadParameter(
            f"{value:g}s: the period must be a whole number of seconds, at least 1s"
        )
    return int(value)


def _check_slot(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip() or len(value) > MAX_SLOT or "\x00" in value:
        raise click.BadParameter(
            f"a slot is 1 to {MAX_SLOT} characters without NUL, got {value[:40]!r}"
        )
    return value


def _check_key(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from .errors import InvalidArgument
    from .validation import check_job_key

    try:
        return check_job_key(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("exec", cls=ExecCommand, context_settings=CONTEXT, epilog=EPILOG)
@db_options
@click.option(
    "--key",
    required=True,
    envvar="TENURE_JOB_KEY",
    show_envvar=True,
    callback=_check_key,
    help="Job key: one lease (and token sequence) per key.",
)
@click.option(
    "--ttl",
    type=DURATION,
    default="30s",
    envvar="TENURE_EXEC_TTL",
    show_envvar=True,
    callback=_check_ttl,
    help="Lease TTL: how long this host may go silent before another may take over. "
    "Renewed every ttl/3 while the command runs.",
)
@click.option(
    "--wait",
    type=DURATION,
    default=None,
    envvar="TENURE_EXEC_WAIT",
    show_envvar=True,
    help="When busy, keep trying to take the lease for this long (unset: try once).",
)
@click.option(
    "--grace",
    type=DURATION,
    default="10s",
    envvar="TENURE_EXEC_GRACE",
    show_envvar=True,
    help="After the lease is lost: time between SIGTERM and SIGKILL to the command's group.",
)
@click.option(
    "--busy-exit",
    type=click.IntRange(0, 255),
    default=0,
    envvar="TENURE_EXEC_BUSY_EXIT",
    show_envvar=True,
    help="Exit code when another execution holds the lease.",
)
@click.option(
    "--slot",
    default=None,
    envvar="TENURE_EXEC_SLOT",
    show_envvar=True,
    callback=_check_slot,
    help="Run once per slot (e.g. the CronJob's scheduled time): a slot that completed "
    "with exit 0 on any host exits 0 as 'already done'; a failed or lost one runs again.",
)
@click.option(
    "--every",
    type=DURATION,
    default=None,
    envvar="TENURE_EXEC_EVERY",
    show_envvar=True,
    callback=_check_every,
    help="Slot = the database clock rounded to the nearest multiple of this period (UTC, "
    "from the epoch): hosts whose cron fires seconds apart share a slot. Fire near the "
    "period's boundaries (e.g. */5 with 5m).",
)
@click.option(
    "--metrics-textfile",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    envvar="TENURE_EXEC_METRICS_TEXTFILE",
    show_envvar=True,
    help="After the run, write gauges about it (end time, duration, exit code, outcome, last "
    "success) to this file for node_exporter's textfile collector, e.g. "
    "/var/lib/node_exporter/textfile/KEY.prom.",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    envvar="TENURE_EXEC_QUIET",
    show_envvar=True,
    help="Say nothing when busy or already done (errors are still printed).",
)
def exec_command(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    key: str,
    ttl: float,
    wait: float | None,
    grace: float,
    busy_exit: int,
    slot: str | None,
    every: int | None,
    quiet: bool,
    metrics_textfile: str | None,
    command: tuple[str, ...],
) -> NoReturn:
    """Run COMMAND under the lease KEY, once at a time across hosts.

    Takes the lease (or exits as busy), starts COMMAND in its own process group with the
    fencing token in $TENURE_FENCING_TOKEN, renews the lease while it runs, and releases it
    when COMMAND ends, so a successor can start at once. If the lease is lost meanwhile,
    COMMAND's group gets SIGTERM, then SIGKILL after --grace, and tenure exits with 75.
    SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on to the group.
    Processes COMMAND leaves behind in its group are killed when it exits.

    Put `--` before COMMAND. Durations: 250ms, 30s, 5m, 1h.
    """
    from . import logs

    logs.setup(log_level, log_format)
    # psycopg_pool reports each failed reconnection at WARNING, through Python's last-resort
    # handler (multi-line, unformatted) since nothing configures it. tenure's own renewal
    # warnings already say the database is unreachable; keep psycopg's for --log-level debug.
    tenure_logger = logging.getLogger("tenure")
    pg_logger = logging.getLogger("psycopg")
    pg_logger.handlers[:] = tenure_logger.handlers
    pg_logger.setLevel(logging.DEBUG if log_level == "debug" else logging.ERROR)
    pg_logger.propagate = False
    request = ExecRequest(
        key=key,
        command=command,
        ttl=ttl,
        wait=wait,
        grace=grace,
        busy_exit=busy_exit,
        slot=slot,
        every=every,
        quiet=quiet,
        dsn=dsn,
        schema=schema,
    )
    if metrics_textfile is None:
        sys.exit(main(request))
    sys.exit(_main_with_textfile(request, metrics_textfile))


def _main_with_textfile(request: ExecRequest, path: str) -> int:
    """Run, then record this run's gauges in ``path`` (see :mod:`tenure.textfile`)."""
    from . import metrics, textfile

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
        _say(f"warning: could not write --metrics-textfile {path}: {exc}")
    return code


def main(request: ExecRequest) -> int:
    """Run one ``tenure exec``; returns the exit code. Prints one line per problem."""
    from .errors import TenureError

    # Signals are handled from the start, so that SIGTERM while connecting or waiting for the
    # lease ends tenure cleanly (even as a container's PID 1, where an unhandled SIGTERM
    # would be ignored); once the command runs they are passed on to it instead.
    child = Supervisor(request.grace, request.key)
    child.install_signal_handlers()
    try:
        return _run(request, child)
    except TenureError as exc:
        _say(f"error: {exc}")
        return EXIT_ERROR
    except Interrupted as exc:
        _say(f"{signal.Signals(exc.signum).name} before the command started; not running it")
        return 128 + exc.signum
    except KeyboardInterrupt:  # SIGINT before our handler was installed
        _say("interrupted before the command started; not running it")
        return 128 + signal.SIGINT
    finally:
        child.restore_signal_handlers()


def _run(req: ExecRequest, child: Supervisor) -> int:
    from ._sync.client import connect
    from .dsn import resolve

    conninfo, _source = resolve(req.dsn)
    client = connect(conninfo, schema=req.schema, pool_size=2)
    try:
        return _run_connected(client, conninfo, req, child)
    finally:
        # Bounded: with the database gone, the pool must not hold the exit for long.
        client._pool.close(timeout=1.0)


def _run_connected(client: Client, conninfo: str, req: ExecRequest, child: Supervisor) -> int:
    from . import metrics
    from .errors import LeaseBusy

    slot: str | None = None
    if req.slot is not None or req.every is not None:
        # A slot already done needs no token: answer before taking the lease.
        slot, done = _slot_state(client, req.key, req.slot, req.every)
        if done is not None:
            metrics.emit(metrics.JOB, req.key, "already_done")
            _already_done(req, slot, done)
            return EXIT_OK
    started = time.monotonic()
    try:
        with client.lease(req.key, ttl=req.ttl, wait=req.wait) as lease:
            code, outcome = _run_leased(client, lease, conninfo, req, slot, child)
    except LeaseBusy as busy:
        metrics.emit(metrics.JOB, req.key, "busy")
        if not req.quiet:
            _say(_busy_line(busy, req))
        return req.busy_exit
    metrics.emit(metrics.JOB, req.key, outcome, time.monotonic() - started)
    return code


def _run_leased(
    client: Client,
    lease: Lease,
    conninfo: str,
    req: ExecRequest,
    slot: str | None,
    child: Supervisor,
) -> tuple[int, str]:
    """With the lease held: start the command, supervise it, record the slot."""
    extra = {"job": req.key, "token": lease.token, "slot": slot}
    if slot is not None:
        # Checked again under the lease, in a new statement: a predecessor that completed
        # the slot while our takeover waited for its fenced transaction is visible now.
        _, done = _slot_state(client, req.key, slot, None)
        if done is not None:
            _already_done(req, slot, done)
            return EXIT_OK, "already_done"
    env = dict(os.environ)
    env.update(
        TENURE_JOB_KEY=req.key,
        TENURE_FENCING_TOKEN=str(lease.token),
        TENURE_LEASE_OWNER=str(lease.owner),
        TENURE_DSN=conninfo,
        TENURE_SCHEMA=req.schema,
    )
    if slot is not None:
        env["TENURE_SLOT"] = slot
    child.token = lease.token
    lease.on_lost(child.lease_lost)
    try:
        started = child.spawn(req.command, env)
    except OSError as exc:
        code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        why = "not found" if code == EXIT_NOT_FOUND else "cannot be executed"
        _say(f"error: command {req.command[0]!r} {why} ({exc.strerror}); lease released")
        return code, "not_started"
    if not started:
        _say(f"lease {req.key!r} token {lease.token} was lost before the command started")
        return EXIT_LEASE_LOST, "lease_lost"
    try:
        log.info("started %s as pid %s", req.command[0], child.pid, extra=extra)
        status = child.wait()
    except BaseException:
        # tenure itself is failing: never leave the command running unsupervised.
        child.abort()
        raise
    code = exit_code(status)
    if child.lost_reason is not None:
        _say(
            f"lease {req.key!r} token {lease.token} lost while the command ran "
            f"({child.lost_reason}); the command was stopped (its exit status: {code})"
        )
        return EXIT_LEASE_LOST, "lease_lost"
    if code != 0:
        return code, "failed"
    if slot is not None:
        _record_slot(client, lease, slot, extra)
    return code, "succeeded"


class Interrupted(BaseException):
    """A forwarded signal (SIGTERM, SIGINT, ...) arrived before the command was started.

    A BaseException, like KeyboardInterrupt: it unwinds whatever the main thread was doing
    (connecting, waiting for the lease), releasing the lease on the way if it was taken.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Supervisor:
    """The command's process group: start it, pass signals on, stop it when the lease is lost.

    The command is the leader of a new session (so of a new process group, whose id is its
    pid). It is reaped only after ``os.waitid(..., WNOWAIT)`` saw it exit and its leftover
    group members were killed: until reaped, its pid (the group id) cannot be reused, so a
    late SIGKILL can never hit an unrelated process.
    """

    def __init__(self, grace: float, job_key: str) -> None:
        self.grace = grace
        self.job_key = job_key
        self.token: int | None = None  # once the lease is taken (for messages)
        self.pid: int | None = None
        self.lost_reason: str | None = None
        # Re-entrant: a signal handler runs in the main thread, maybe while it holds the lock.
        self._lock = threading.RLock()
        self._reaping = False
        self._spawning = False
        self._pending: list[int] = []
        self._killer: threading.Timer | None = None
        self._saved: dict[int, Any] = {}

    # -- start ---------------------------------------------------------------------------

    def spawn(self, command: Sequence[str], env: dict[str, str]) -> bool:
        """Start the command; False (nothing started) if the lease was lost already.

        Under the lock, so a loss reported meanwhile by the renewal thread either stops the
        start or sees the pid and signals the group.
        """
        with self._lock:
            if self.lost_reason is not None:
                return False
            # A signal arriving now is kept for the command, not raised: raising here could
            # leave a started command unsupervised.
            self._spawning = True
            try:
                # posix_spawnp (vfork + exec) reports exec errors as OSError here, and is the
                # cheapest way to start a process. Python ignores SIGPIPE and SIGXFSZ; the
                # command gets the defaults back, as subprocess' restore_signals does.
                self.pid = os.posix_spawnp(
                    command[0],
                    list(command),
                    env,
                    setsid=True,
                    setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                    setsigmask=(),
                )
            finally:
                self._spawning = False
            pending, self._pending = self._pending, []
        for signum in pending:
            self.signal_group(signum)
        return True

    # -- signals -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for signum in FORWARDED:
            previous = signal.getsignal(signum)
            if previous == signal.SIG_IGN:
                continue  # ignored when we started (e.g. nohup): the command inherits that
            self._saved[signum] = previous
            signal.signal(signum, self._forward)

    def restore_signal_handlers(self) -> None:
        for signum, previous in self._saved.items():
            signal.signal(signum, previous)
        self._saved = {}

    def _forward(self, signum: int, frame: Any) -> None:
        with self._lock:
            if self.pid is None:
                if not self._spawning:
                    raise Interrupted(signum)  # nothing started yet: stop here
                self._pending.append(signum)
                return
        # Once the command has been reaped this does nothing: tenure finishes releasing
        # the lease (briefly) rather than dying half-way.
        self.signal_group(signum)

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the command's group, unless it has been reaped."""
        with self._lock:
            if self.pid is None or self._reaping:
                return
            # ESRCH: the group is gone (a zombie leader still counts as a member).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    # -- lease loss ----------------------------------------------------------------------

    def lease_lost(self, lease: Lease) -> None:
        """``lease.on_lost`` callback (renewal or watchdog thread): SIGTERM now, SIGKILL
        after the grace period."""
        with self._lock:
            if self.lost_reason is not None:
                return
            self.lost_reason = lease.lost_reason or "lost"
            if self.pid is None or self._reaping:
                return
            log.warning(
                "lease %r token %s lost (%s): sending SIGTERM to the command's process group, "
                "SIGKILL in %.1fs",
                self.job_key,
                self.token,
                self.lost_reason,
                self.grace,
                extra={"job": self.job_key, "token": self.token},
            )
            self.signal_group(signal.SIGTERM)
            self._killer = threading.Timer(self.grace, self.signal_group, (signal.SIGKILL,))
            self._killer.daemon = True
            self._killer.start()

    # -- end -----------------------------------------------------------------------------

    def wait(self) -> int:
        """Wait for the command to exit; kill what it left in its group; reap it. Returns
        the raw wait status."""
        pid = self.pid
        assert pid is not None
        if not hasattr(os, "waitid"):  # e.g. macOS: no waiting without reaping
            _, status = os.waitpid(pid, 0)
            with self._lock:
                self._reaping = True
                if self._killer is not None:
                    self._killer.cancel()
            return status
        # Wait without reaping: the zombie keeps the group id reserved. Signals that
        # interrupt the wait run their handler and the wait resumes (PEP 475).
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with self._lock:
            if self._killer is not None:
                self._killer.cancel()
            # Anything still in the group outlives the lease that covered it: end it now.
            # The leader is a zombie by now, so this only reaches leftovers.
            self.signal_group(signal.SIGKILL)
            self._reaping = True
        _, status = os.waitpid(pid, 0)
        return status

    def abort(self) -> None:
        """Stop the command because tenure cannot supervise it any more: SIGTERM to the
        group, SIGKILL after the grace period (or once the command has exited), reap."""
        pid = self.pid
        if pid is None or self._reaping:
            return
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        with contextlib.suppress(ChildProcessError):
            while time.monotonic() < deadline and not _exited(pid):
                time.sleep(0.05)
            with self._lock:
                self.signal_group(signal.SIGKILL)
                self._reaping = True
            os.waitpid(pid, 0)


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it (False where the OS cannot say
    so without reaping: the caller then waits out its grace period)."""
    if not hasattr(os, "waitid"):
        return False
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def exit_code(status: int) -> int:
    """A shell's exit code for a wait status: the exit code, or 128+N for signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _slot_state(
    client: Client, key: str, slot: str | None, every: int | None
) -> tuple[str, tuple[int, Any] | None]:
    """The slot (computed by the database for --every) and, if it completed, its
    ``(token, completed_at)``."""
    rows = client._fetch(
        "exec_slot_check",
        {"job_key": key, "slot": slot, "every": every},
        doing=f"checking the schedule slot of {key!r}",
    )
    name, token, completed_at = rows[0]
    return name, (None if token is None else (token, completed_at))


def _record_slot(client: Client, lease: Lease, slot: str, extra: dict[str, Any]) -> None:
    """Mark the slot done, in a transaction fenced by the run's token."""
    from ._sync.fencing import fence
    from .errors import StaleTokenError, TenureError, mapped
    from .queries import query

    try:
        doing = f"recording slot {slot!r} of {lease.job_key!r} as done"
        with mapped(doing, wrote=True), client._pool.connection() as conn, conn.transaction():
            fence(conn, lease.job_key, lease.token, schema=client.schema)
            conn.execute(
                query(client.schema, "exec_slot_done"),
                {"job_key": lease.job_key, "slot": slot, "token": lease.token},
            )
    except StaleTokenError:
        _say(
            f"warning: the command succeeded but lease {lease.job_key!r} token {lease.token} "
            f"was lost before slot {slot!r} could be marked done; the slot may run again"
        )
    except TenureError as exc:
        _say(f"warning: the command succeeded but slot {slot!r} was not marked done: {exc}")
    else:
        log.info("slot %r marked done", slot, extra=extra)


def _busy_line(busy: LeaseBusy, req: ExecRequest) -> str:
    if busy.token is not None and busy.expires_at is not None:
        holder = (
            f"held with token {busy.token} until {busy.expires_at.isoformat()} (database clock)"
        )
    else:
        holder = "another execution won the race for it"
    waited = f" after waiting {req.wait:g}s" if req.wait else ""
    return f"{req.key!r} is busy{waited}: {holder}; not running {req.command[0]!r}"


def _already_done(req: ExecRequest, slot: str, done: tuple[int, Any]) -> None:
    token, completed_at = done
    if not req.quiet:
        _say(
            f"{req.key!r} slot {slot!r} already done (token {token}, "
            f"{completed_at.isoformat()}); not running {req.command[0]!r}"
        )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _say(text: str) -> None:
    """One line on stderr: the command owns stdout."""
    click.echo(f"{PROG}: {_one_line(text)}", err=True)
