"""How ``tenure exec`` talks: one line per event on stderr (the command owns stdout)."""

from __future__ import annotations

import click

from ..errors import one_line

PROG = "tenure exec"


def say(text: str) -> None:
    """One line on stderr: the command owns stdout. Never a password (a DSN may be quoted)."""
    from ..db.dsn import redact

    click.echo(f"{PROG}: {redact(one_line(text))}", err=True)
