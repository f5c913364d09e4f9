"""Option types that refuse bad values while the command line is parsed (a usage error,
exit 2), with a message that says what is allowed: durations, fencing tokens, message ids
and row limits."""

from __future__ import annotations

from typing import Any

import click

from ..validation import MAX_CONCURRENCY, MAX_QUEUE

#: PostgreSQL's bigint: tokens and message ids beyond it cannot exist.
BIGINT_MAX = 2**63 - 1
#: Most rows a list command prints.
LIMIT_MAX = 100_000


class DurationType(click.ParamType):  # type: ignore[type-arg]
    """``30s``, ``250ms``, ``5m``, ``1h``, ``1d`` or plain seconds, in seconds (float), at
    most 100 years (tenure's bound on every duration); a bad one is a usage error (exit 2).
    ``positive`` also refuses zero."""

    name = "duration"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..errors import InvalidArgument
        from ..validation import parse_duration

        try:
            seconds = parse_duration(value, what=f"{value!r}")
        except InvalidArgument as exc:
            self.fail(str(exc).removeprefix(f"{value!r} "), param, ctx)
        if self.positive and seconds == 0:
            self.fail(f"{value!r} must be positive", param, ctx)
        return seconds


DURATION = DurationType()
POSITIVE_DURATION = DurationType(positive=True)
TOKEN = click.IntRange(1, BIGINT_MAX)
MESSAGE_ID = click.IntRange(1, BIGINT_MAX)
LIMIT = click.IntRange(1, LIMIT_MAX)
CONCURRENCY = click.IntRange(1, MAX_CONCURRENCY)
QUEUE = click.IntRange(1, MAX_QUEUE)


def check_ttl_option(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A lease TTL option: out of range is a usage error."""
    from ..errors import InvalidArgument
    from ..validation import check_ttl

    try:
        return check_ttl(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def check_inbox_retention(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """An inbox retention option: under a day is a usage error (the library's rule)."""
    from ..db.retention import check_inbox_retention as check
    from ..errors import InvalidArgument

    try:
        return check(value, what="the inbox retention")
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def retention_options(fn: Any) -> Any:
    """``--retention`` and ``--inbox-retention``: how long the history a long-running command
    prunes in the background is kept (docs/retention.md)."""
    fn = click.option(
        "--inbox-retention",
        type=POSITIVE_DURATION,
        default="30d",
        envvar="TENURE_INBOX_RETENTION",
        show_envvar=True,
        callback=check_inbox_retention,
        help="Prune inbox claims older than this (at least 1d; longer than any redelivery).",
    )(fn)
    fn = click.option(
        "--retention",
        type=POSITIVE_DURATION,
        default="7d",
        envvar="TENURE_RETENTION",
        show_envvar=True,
        help="Prune history older than this, in short batches every few minutes: run "
        "histories, slots no run can name again, delivered outbox messages.",
    )(fn)
    return fn
