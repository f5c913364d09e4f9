"""The worker side of ``isolation="process"``: run one body in a child process
(:mod:`.child`), so that a crash (segfault in a C extension, ``os._exit``, the OOM killer) or
a leak stays there: the run is recorded as failed and the worker carries on.

The child runs in its own session (process group); the worker keeps and renews the lease.
Cancelling the awaiting task (lost lease, shutdown) sends the group SIGTERM, then SIGKILL
after :data:`GRACE` seconds, and lets the cancellation through.

The child reports how its body ended as soon as it has, and the run ends with that report:
a child that has not exited :data:`GRACE` seconds after it (a thread its body left running)
is stopped the same way, with a warning. Waiting for its exit alone held such a run, and its
renewed lease, for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from .claim import run_fields

if TYPE_CHECKING:
    from .context import JobContext
    from .spec import JobSpec

log = logging.getLogger("tenure.scheduler")

#: Seconds a cancelled child gets between SIGTERM and SIGKILL, and a child that reported
#: gets to exit before it is stopped.
GRACE = 5.0


class ChildFailed(Exception):
    """The isolated body failed, or its process died; ``error`` is what run history shows."""

    def __init__(self, error: str, *, stale: bool = False) -> None:
        super().__init__(error)
        self.error = error
        self.stale = stale


def importable(spec_fn: Any) -> str | None:
    """Why ``spec_fn`` cannot be imported by a child process by module and name, or None."""
    module = getattr(spec_fn, "__module__", None)
    qualname = getattr(spec_fn, "__qualname__", "")
    if not module or module == "__main__":
        return "it is defined in the script being run (__main__); move it into a module"
    if "<locals>" in qualname or "<lambda>" in qualname:
        return "it is a local function or a lambda; define it at a module's top level"
    return None


async def run_isolated(spec: JobSpec, ctx: JobContext, conninfo: str | None) -> None:
    """Run ``spec``'s body in a child process; raise :class:`ChildFailed` if it failed."""
    read_fd, write_fd = os.pipe()
    request = {
        "module": spec.fn.__module__,
        "qualname": spec.fn.__qualname__,
        "is_async": spec.is_async,
        "path": sys.path,
        "dsn": conninfo,
        "schema": ctx._client.schema,
        "job_key": ctx.job_key,
        "token": ctx.token,
        "slot": ctx.slot.isoformat(),
        "kind": ctx.kind,
        "attempt": ctx.attempt,
        "worker_id": ctx.worker_id,
        "args": ctx.args,
        "task": ctx.task,
        "report_fd": write_fd,
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tenure.scheduler.child",
            stdin=asyncio.subprocess.PIPE,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    finally:
        os.close(write_fd)
    report = _Report(read_fd)
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode())
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        proc.stdin.close()
        if await report.or_exit(proc) and proc.returncode is None:
            try:
                async with asyncio.timeout(GRACE):
                    await proc.wait()
            except TimeoutError:
                extra = run_fields(ctx.job_key, ctx.token, ctx.slot)
                log.warning(
                    "job %r slot %s: its process did not exit within %s s after its body "
                    "ended (something it started is still running); stopping it",
                    ctx.job_key,
                    extra["slot"],
                    GRACE,
                    extra=extra,
                )
                await _stop(proc)
        code = await proc.wait()
        report.read()
    except asyncio.CancelledError:
        await _stop(proc)
        raise
    finally:
        report.close()
    outcome = report.outcome()
    if outcome is None:
        if code < 0:
            raise ChildFailed(f"the job's process was killed by {_signal_name(-code)}")
        raise ChildFailed(f"the job's process exited with status {code} before reporting")
    if outcome.get("outcome") != "succeeded":
        raise ChildFailed(str(outcome.get("error")), stale=bool(outcome.get("stale")))
    if outcome.get("stale"):
        ctx._stale = True  # a fenced write was rejected and the body caught it


class _Report:
    """The child's one JSON line on the pipe ``fd``, read as it comes (the pipe is never
    waited on to close: a grandchild that inherited it must not hold the worker)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._data = bytearray()
        self._loop = asyncio.get_running_loop()
        self._ended = self._loop.create_future()  # the line has come, or the pipe closed
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self.read)

    def read(self) -> None:
        """Take what the pipe holds now, up to the line's end or the pipe's close."""
        try:
            while b"\n" not in self._data and (chunk := os.read(self._fd, 65536)):
                self._data += chunk
        except BlockingIOError:
            return  # more to come
        self._end()

    def _end(self) -> None:
        if not self._ended.done():
            self._ended.set_result(None)
        self._loop.remove_reader(self._fd)

    async def or_exit(self, proc: asyncio.subprocess.Process) -> bool:
        """Wait for the report or the process's exit; True if the report came."""
        exited = asyncio.ensure_future(proc.wait())
        try:
            await asyncio.wait((self._ended, exited), return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        return b"\n" in self._data

    def outcome(self) -> dict[str, Any] | None:
        try:
            report = json.loads(self._data.decode("utf-8", "replace").splitlines()[0])
        except (ValueError, IndexError):
            return None
        return report if isinstance(report, dict) else None

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the child's process group, SIGKILL it after the grace."""
    for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, GRACE)):
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await proc.wait()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
