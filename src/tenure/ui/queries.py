"""The dashboard's named queries (``ui/sql/ui.sql``), loaded once, composed per schema.

Same file format and schema substitution as tenure's own named queries; kept apart so that
the dashboard's queries ship (and are loaded) only with the dashboard.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from ..db.queries import compose

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _raw() -> dict[str, str]:
    text = resources.files("tenure.ui").joinpath("sql/ui.sql").read_text("utf-8")
    parts = _NAME.split(text)
    found: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in found:
            raise RuntimeError(f"dashboard query {name!r} is defined twice")
        found[name] = "\n".join(
            line for line in body.strip().splitlines() if not line.lstrip().startswith("--")
        )
    return found


@functools.cache
def ui_queries(schema: str) -> dict[str, bytes]:
    return {name: compose(body, schema) for name, body in _raw().items()}
