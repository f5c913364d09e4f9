"""The command's process group under ``tenure exec``: started in its own session, signals
passed on, stopped (SIGTERM, then SIGKILL after the grace) when the lease is lost or when a
stop signal passed on is not obeyed."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..leases._sync.lease import Lease

log = logging.getLogger("tenure.exec")

#: Signals passed on to the command's process group (unless ignored when tenure started).
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
#: Forwarded signals that ask the command to stop: the first is passed on and the group gets
#: SIGKILL after the grace period unless the command has exited; a second one SIGKILLs the
#: group at once. (SIGHUP, SIGUSR1 and SIGUSR2 are only passed on: daemons reload on them.)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


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
        #: Why tenure SIGKILLed the group after a stop signal it passed on (for a message).
        self.killed: str | None = None
        self._stop_signal: int | None = None  # the first stop signal passed on

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
            self._deliver(signum)
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
        self._deliver(signum)

    def _deliver(self, signum: int) -> None:
        """Pass ``signum`` on. A stop signal is obeyed within the grace period or ends in
        SIGKILL; a second one while the command is being stopped (by a signal or a lost
        lease) is SIGKILL at once: a command that ignores SIGTERM must not outlive tenure's
        supervision, nor hold the lease for ever."""
        with self._lock:
            if signum not in STOPPING or self.pid is None or self._reaping:
                self.signal_group(signum)
                return
            if self._stop_signal is not None or self.lost_reason is not None:
                first = signal.Signals(self._stop_signal or signal.SIGTERM).name
                self.killed = (
                    f"{signal.Signals(signum).name} while the command was being stopped "
                    f"(after {first}): SIGKILL to its process group at once"
                )
                self.signal_group(signal.SIGKILL)
                return
            self._stop_signal = signum
            self.signal_group(signum)
            self._arm_killer(self._kill_ignored_stop)

    def _kill_ignored_stop(self) -> None:
        with self._lock:
            if self.pid is None or self._reaping:
                return
            name = signal.Signals(self._stop_signal or signal.SIGTERM).name
            self.killed = (
                f"the command did not exit within --grace {self.grace:g}s of {name}: "
                "SIGKILL to its process group"
            )
            self.signal_group(signal.SIGKILL)

    def _arm_killer(self, kill: Any) -> None:
        if self._killer is not None:
            return  # already stopping: the earlier deadline stands
        self._killer = threading.Timer(self.grace, kill)
        self._killer.daemon = True
        self._killer.start()

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
            self._arm_killer(functools.partial(self.signal_group, signal.SIGKILL))

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
        # Wait without reaping: the zombie keeps the group id reserved.
        _wait_handling_signals(pid)
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


def _wait_handling_signals(pid: int) -> None:
    """Block until child ``pid`` has exited (without reaping it), running signal handlers as
    signals arrive.

    A signal sent to tenure may be delivered to any of its threads (the lease's renewal
    thread, the pool's): then it does not interrupt a blocking wait of the main thread, and
    the Python handler, which only the main thread runs, would wait for the command to exit.
    So the main thread sleeps in ``select`` on signal's wakeup fd, which the C-level handler
    writes to from whichever thread took the signal, and on a pidfd of the child."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    previous = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        watched = [wake_r] if pidfd is None else [wake_r, pidfd]
        while not _exited(pid):
            # Without a pidfd, look again every 0.1 s.
            select.select(watched, [], [], 0.1 if pidfd is None else None)
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
            # Returning to Python code here runs the handlers of what woke us.
    finally:
        signal.set_wakeup_fd(previous)
        for fd in (wake_r, wake_w, pidfd):
            if fd is not None:
                os.close(fd)


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
