"""The worker side of ``isolation="process"``: run one body in a child process
(:mod:`.child`), so that a crash (segfault in a C extension, ``os._exit``, the OOM killer) or
a leak stays there: the run is recorded as failed and the worker carries on.

The child runs in its own session (process group); the worker keeps and renews the lease.
Cancelling the awaiting task (lost lease, shutdown) sends the group SIGTERM, then SIGKILL
after :data:`GRACE` seconds, and lets the cancellation through.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import JobContext
    from .spec import JobSpec

#: Seconds a cancelled child gets between SIGTERM and SIGKILL.
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
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode())
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        proc.stdin.close()
        code = await proc.wait()
        report = _read_report(read_fd)
    except asyncio.CancelledError:
        await _stop(proc)
        raise
    finally:
        os.close(read_fd)
    if report is None:
        if code < 0:
            raise ChildFailed(f"the job's process was killed by {_signal_name(-code)}")
        raise ChildFailed(f"the job's process exited with status {code} before reporting")
    if report.get("outcome") != "succeeded":
        raise ChildFailed(str(report.get("error")), stale=bool(report.get("stale")))
    if report.get("stale"):
        ctx._stale = True  # a fenced write was rejected and the body caught it


def _read_report(fd: int) -> dict[str, Any] | None:
    """The child's one JSON line, read after it exited (never blocks: a grandchild that
    inherited the pipe must not hold the worker)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            data += chunk
    try:
        report = json.loads(data.decode("utf-8", "replace").splitlines()[0])
    except (ValueError, IndexError):
        return None
    return report if isinstance(report, dict) else None


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
