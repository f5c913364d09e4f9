"""Tables for the list commands: a rich table on a terminal; plain aligned text with whole
values when piped (grep, awk, a file: no width to fit, so nothing is cut or wrapped).

Either way every value goes through :func:`printable`: job keys, topics and error messages
come from users and jobs, and a raw ESC or newline in one would drive the terminal or break
the row. ``--json`` gives the raw values back.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from ..errors import printable as _printable


def printable(value: object) -> str:
    """``value`` as text with control characters shown as escapes (``\\x1b``, ``\\n``)."""
    return _printable("-" if value is None else str(value))


def show(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    title: str | None = None,
    right: Sequence[str] = (),
) -> None:
    """Print a table: rich on a terminal, aligned plain text when piped. ``right``: the
    columns aligned right."""
    cells = [[printable(v) for v in row] for row in rows]
    if sys.stdout.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(
            title=None if title is None else Text(printable(title)),
            title_justify="left",
            box=box.HEAVY_HEAD,
        )
        for name in columns:
            table.add_column(name, justify="right" if name in right else "left")
        for row in cells:
            table.add_row(*(Text(cell) for cell in row))  # Text: no markup in values
        Console(highlight=False).print(table)
        return
    from rich.cells import cell_len

    widths = [cell_len(name) for name in columns]
    for row in cells:
        widths = [max(w, cell_len(cell)) for w, cell in zip(widths, row, strict=True)]
    out = sys.stdout
    if title:
        out.write(printable(title) + "\n")
    for row in [list(columns), *cells]:
        parts = []
        for name, width, cell in zip(columns, widths, row, strict=True):
            pad = " " * (width - cell_len(cell))
            parts.append(pad + cell if name in right else cell + pad)
        out.write("  ".join(parts).rstrip() + "\n")
    out.flush()
