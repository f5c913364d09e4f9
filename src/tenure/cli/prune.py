"""``tenure prune``: retention on demand (workers, relays and tenure exec also prune on their
own; see docs/retention.md)."""

from __future__ import annotations

import json

import click

from ..db.retention import NAMES
from .common import CONTEXT, connect, db_options, handle_errors, json_option, setup_logs
from .params import POSITIVE_DURATION, check_inbox_retention


@click.command("prune", context_settings=CONTEXT)
@db_options
@click.option(
    "--older-than",
    type=POSITIVE_DURATION,
    default="7d",
    envvar="TENURE_RETENTION",
    show_envvar=True,
    help="Delete history older than this: finished runs (scheduler and exec), slots no run "
    "can name again, delivered outbox messages.",
)
@click.option(
    "--inbox-older-than",
    type=POSITIVE_DURATION,
    default="30d",
    envvar="TENURE_INBOX_RETENTION",
    show_envvar=True,
    callback=check_inbox_retention,
    help="Delete inbox claims older than this (at least 1d), but none applied after the "
    "oldest undelivered outbox message was created.",
)
@click.option(
    "--table",
    "tables",
    type=click.Choice(NAMES),
    multiple=True,
    envvar="TENURE_PRUNE_TABLES",
    show_envvar=True,
    help="Only this table. Repeatable. [default: all]",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=5000,
    envvar="TENURE_PRUNE_BATCH",
    show_envvar=True,
    help="Rows per DELETE (each its own short transaction).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    envvar="TENURE_PRUNE_DRY_RUN",
    show_envvar=True,
    help="Count what would be deleted; delete nothing.",
)
@json_option
@handle_errors
def prune(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    older_than: float,
    inbox_older_than: float,
    tables: tuple[str, ...],
    batch: int,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete history older than the retention, in short batches, now.

    Workers (all tables), relays (outbox and inbox) and tenure exec (its own history) already
    do this on their own; this is for operators: a first clean-up, a shorter retention, or a
    deployment where none of them runs long. Never deleted: a running run's history, a slot
    that can still be asked for (named by the caller, or not yet past its window), a pending
    or dead outbox message, an inbox claim a redelivery could still need, any lease.
    """
    setup_logs(log_level, log_format)
    from ..db import pruning
    from ..db import retention as rt

    policy = rt.Retention.of(older_than, inbox_older_than)
    chosen = tables or rt.NAMES
    with connect(dsn, schema) as client:
        if dry_run:
            counts = {k: v for k, v in pruning.preview(client, policy).items() if k in chosen}
        else:
            counts = pruning.prune(client, policy, tables=chosen, batch=batch)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "older_than": policy.history,
                    "inbox_older_than": policy.inbox,
                    "deleted" if not dry_run else "would_delete": counts,
                }
            )
        )
        return
    verb = "would delete" if dry_run else "deleted"
    for name, count in counts.items():
        age = rt.age_text(policy.inbox if name == "inbox" else policy.history)
        click.echo(f"{name:<11} {verb} {count} row(s) older than {age}")
