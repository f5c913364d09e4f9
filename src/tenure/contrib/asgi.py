"""Run a :class:`tenure.Scheduler` inside an ASGI app (FastAPI, Starlette) or any asyncio
program, started and stopped with it.

::

    scheduler = tenure.Scheduler()

    @scheduler.job("refresh-rates", every="1m")
    async def refresh_rates(ctx: tenure.JobContext) -> None: ...

    app = FastAPI(lifespan=tenure.contrib.asgi.lifespan(scheduler))

Every worker process of the web server (``uvicorn --workers 4``, gunicorn) runs a scheduler
worker, and each job still runs once per slot: they claim slots through the database. At
shutdown the scheduler claims nothing more, gives running jobs ``shutdown_grace`` to finish,
then cancels them and hands their slots over, as ``tenure worker`` does on SIGTERM. It leaves
signals to the server (``handle_signals=False``).

With a lifespan of your own, nest :func:`running`::

    @asynccontextmanager
    async def lifespan(app):
        async with db.connect(), tenure.contrib.asgi.running(scheduler):
            yield
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..scheduler import Scheduler

#: How often startup checks whether the worker is ready (registered its jobs) or failed.
_READY_POLL = 0.02


@contextlib.asynccontextmanager
async def running(scheduler: Scheduler) -> AsyncIterator[Scheduler]:
    """Run ``scheduler``'s worker in a background task for the duration of the block.

    Entering waits until the worker has connected and registered its jobs, and raises what
    stopped it if it could not (database unreachable, schema not migrated, no jobs), so the
    app fails to start rather than serving without its jobs. Leaving stops it gracefully.
    """
    task = asyncio.create_task(scheduler.run_async(handle_signals=False), name="tenure-scheduler")
    try:
        while not task.done() and not scheduler.ready:
            await asyncio.sleep(_READY_POLL)
        if task.done():
            task.result()  # raises the startup error
    except BaseException:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise
    try:
        yield scheduler
    finally:
        if not task.done():
            scheduler.stop()
        await task


def lifespan(scheduler: Scheduler) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """A ``lifespan=`` for FastAPI/Starlette that runs ``scheduler`` with the app."""

    @contextlib.asynccontextmanager
    async def app_lifespan(app: Any) -> AsyncIterator[None]:
        async with running(scheduler):
            yield

    return app_lifespan


__all__ = ["lifespan", "running"]
