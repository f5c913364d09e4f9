"""A relay's handlers: what one is, how it is called, how they are checked and closed.

Loading handlers from ``MODULE:ATTR`` is the command line's business (``tenure relay
--handlers``, in ``cli/outbox.py``): a library does not edit ``sys.path``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import InvalidArgument
from ._async.store import check_topic
from .message import Message

#: A handler receives the message and returns normally when it was delivered; any exception
#: (or the timeout) is a failed attempt. Coroutine functions are awaited; plain functions
#: run in a worker thread.
Handler = Callable[[Message], Any]


def checked(handlers: Mapping[str, Handler]) -> dict[str, Handler]:
    """``handlers`` as a dict, each topic valid and each handler callable."""
    found: dict[str, Handler] = {}
    for topic, handler in handlers.items():
        check_topic(topic)
        if not callable(handler):
            raise InvalidArgument(f"handler for topic {topic!r} is not callable: {handler!r}")
        found[topic] = handler
    return found


def is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with async __call__
    )


async def aclose_all(handlers: Mapping[str, Handler]) -> None:
    """Close the handlers that hold resources (``aclose()``: the webhook's connections),
    each once however many topics it serves."""
    closed: set[int] = set()
    for handler in handlers.values():
        closer = getattr(handler, "aclose", None)
        if closer is not None and id(handler) not in closed:
            closed.add(id(handler))
            with contextlib.suppress(Exception):
                await closer()
