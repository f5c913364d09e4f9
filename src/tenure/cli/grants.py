"""``tenure grants``: the GRANT statements an application role needs (no database needed)."""

from __future__ import annotations

import click

from .common import CONTEXT

#: PostgreSQL truncates longer identifiers (NAMEDATALEN - 1 bytes).
MAX_NAME_BYTES = 63


def _check_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    size = len(value.encode("utf-8", "surrogatepass"))
    if not value or "\x00" in value or size > MAX_NAME_BYTES:
        raise click.BadParameter(
            f"{value[:40]!r} is not a PostgreSQL name: 1 to {MAX_NAME_BYTES} bytes, no NUL"
        )
    return value


@click.command("grants", context_settings=CONTEXT)
@click.option(
    "--role",
    required=True,
    envvar="TENURE_GRANTS_ROLE",
    show_envvar=True,
    callback=_check_name,
    help="The application role to grant to (it must exist: CREATE ROLE app LOGIN ...).",
)
@click.option(
    "--schema",
    default="tenure",
    envvar="TENURE_SCHEMA",
    show_envvar=True,
    callback=_check_name,
    help="PostgreSQL schema holding tenure's tables.",
)
def grants(role: str, schema: str) -> None:
    """Print the GRANT statements that let ROLE run tenure on SCHEMA, and nothing more.

    The schema's owner runs `tenure migrate`; an application role that only runs workers,
    `tenure exec`, relays, `tenure status` and the library needs these privileges, which
    `tenure doctor` checks. Run the output as the schema's owner (or a superuser), after
    each migration that adds tables:

    \b
      tenure grants --role app | psql "$OWNER_DSN" -v ON_ERROR_STOP=1
    """
    from ..db.privileges import grant_statements

    click.echo(f"-- tenure grants: what role {role!r} needs on schema {schema!r}.")
    click.echo("-- Run as the schema's owner; the owner (not this role) runs `tenure migrate`.")
    for statement in grant_statements(schema, role):
        click.echo(statement)
