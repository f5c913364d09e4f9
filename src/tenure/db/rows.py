"""Row types: a statement's result rows as named, typed records instead of tuples read by
position.

A row type is a :class:`typing.NamedTuple` whose fields are the statement's result columns,
named and ordered as the statement returns them (``SELECT ... AS name``); each lives in its
package's ``rows.py`` and names its statements with :func:`row_of`. The executor builds them
(``client.fetch("sched_claim", params, doing=..., row=ClaimRow)``), at the cost of a tuple's
construction per row (no lookup by name: they are tuples in the statement's column order).
A frozen dataclass built from a row by position (``Message(*row)``) registers the same way,
so that its fields are checked too.

``tests/db/test_row_types.py`` asks PostgreSQL for each registered statement's result columns
(a prepared statement's description: nothing is executed) and compares them with the row
type's fields, so a column added, dropped or moved in a ``.sql`` file fails a test instead of
shifting every field after it; and it checks that each ``fetch(..., row=X)`` names a statement
registered for ``X``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

#: Every registered statement and its row type (filled as the ``rows`` modules load).
ROW_TYPES: dict[str, type] = {}

T = TypeVar("T", bound=type)


def row_of(*statements: str) -> Callable[[T], T]:
    """Register a row type as the rows of ``statements`` (named queries)."""

    def register(cls: T) -> T:
        for name in statements:
            if ROW_TYPES.setdefault(name, cls) is not cls:
                raise RuntimeError(f"statement {name!r} has two row types")
        return cls

    return register


__all__ = ["ROW_TYPES", "row_of"]
