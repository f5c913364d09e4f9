"""``tenure relay`` and ``tenure outbox list|retry|purge``: deliver and operate the outbox."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Mapping
from typing import Any

import click

from ..db.dsn import redact
from .common import (
    CONTEXT,
    connect,
    db_options,
    fail,
    handle_errors,
    json_option,
    metrics_options,
    serve_from_cli,
    setup_logs,
    usage_error,
)
from .params import DURATION, MESSAGE_ID, retention_options


def _check_webhooks(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    for spec in value:
        topic, sep, url = spec.partition("=")
        if not sep or not topic or not url:
            raise click.BadParameter(f"takes TOPIC=URL, got {spec!r}")
    return value


def load_handlers(spec: str) -> dict[str, Any]:
    """Handlers from ``MODULE:ATTR``: a mapping of topic to handler, or a callable returning
    one. The current directory is importable, as for ``python -m`` (a command-line concern:
    the library never edits ``sys.path``)."""
    from ..errors import ConfigurationError, InvalidArgument

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(
            f"--handlers takes MODULE:ATTR (e.g. myapp.outbox:HANDLERS), got {spec!r}"
        )
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import handler module {module_name!r}: {exc}") from exc
    try:
        found = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(found) and not isinstance(found, Mapping):
        found = found()
    if not isinstance(found, Mapping):
        raise ConfigurationError(
            f"{spec} must be a mapping of topic to handler (or a function returning one), "
            f"got {type(found).__name__}"
        )
    return dict(found)


@click.command(context_settings=CONTEXT)
@db_options
@click.option(
    "--webhook",
    "webhooks",
    multiple=True,
    metavar="TOPIC=URL",
    callback=_check_webhooks,
    envvar="TENURE_RELAY_WEBHOOK",
    show_envvar=True,
    help="POST messages of TOPIC as JSON to URL, with an Idempotency-Key header. Repeatable.",
)
@click.option(
    "--handlers",
    "handler_specs",
    multiple=True,
    metavar="MODULE:ATTR",
    envvar="TENURE_RELAY_HANDLERS",
    show_envvar=True,
    help="Python handlers: a mapping of topic to callable (or a function returning one), "
    "imported from MODULE (the current directory is importable). Repeatable.",
)
@click.option(
    "--topic",
    "topics",
    multiple=True,
    envvar="TENURE_RELAY_TOPICS",
    show_envvar=True,
    help="Claim only these topics (each needs a handler here). Default: every topic this "
    "relay has a handler for; messages of other topics wait for a relay that has one.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=4,
    envvar="TENURE_RELAY_CONCURRENCY",
    show_envvar=True,
    help="Handler calls in flight at once.",
)
@click.option(
    "--timeout",
    type=DURATION,
    default="10s",
    envvar="TENURE_RELAY_TIMEOUT",
    show_envvar=True,
    help="Per handler call (webhook request); slower is a failed attempt.",
)
@click.option(
    "--visibility",
    type=DURATION,
    default=None,
    envvar="TENURE_RELAY_VISIBILITY",
    show_envvar=True,
    help="How long a claim lasts: a dead relay's messages are retried after it. "
    "Default: 1.5 x timeout + 5s.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 10_000),
    default=10,
    envvar="TENURE_RELAY_MAX_ATTEMPTS",
    show_envvar=True,
    help="Attempts before a message is parked as dead.",
)
@click.option(
    "--backoff",
    type=DURATION,
    default="1s",
    envvar="TENURE_RELAY_BACKOFF",
    show_envvar=True,
    help="First retry delay; doubles per attempt, with jitter.",
)
@click.option(
    "--backoff-max",
    type=DURATION,
    default="5m",
    envvar="TENURE_RELAY_BACKOFF_MAX",
    show_envvar=True,
    help="Longest retry delay.",
)
@click.option(
    "--poll",
    type=DURATION,
    default="5s",
    envvar="TENURE_RELAY_POLL",
    show_envvar=True,
    help="Longest sleep without a notification (LISTEN/NOTIFY wakes the relay sooner).",
)
@click.option(
    "--connect-timeout",
    type=DURATION,
    default="5s",
    envvar="TENURE_RELAY_CONNECT_TIMEOUT",
    show_envvar=True,
    help="Webhooks: longest wait for a TCP (and TLS) connection; --timeout bounds the whole call.",
)
@click.option(
    "--ca-bundle",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    envvar="TENURE_RELAY_CA_BUNDLE",
    show_envvar=True,
    help="Webhooks: trust the CAs in this PEM file instead of the system's (or SSL_CERT_FILE).",
)
@click.option(
    "--client-cert",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    envvar="TENURE_RELAY_CLIENT_CERT",
    show_envvar=True,
    help="Webhooks: present this client certificate (PEM) to https endpoints.",
)
@click.option(
    "--client-key",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    envvar="TENURE_RELAY_CLIENT_KEY",
    show_envvar=True,
    help="The client certificate's private key (PEM), if not in the --client-cert file.",
)
@retention_options
@metrics_options
@handle_errors
def relay(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    webhooks: tuple[str, ...],
    handler_specs: tuple[str, ...],
    topics: tuple[str, ...],
    connect_timeout: float,
    ca_bundle: str | None,
    client_cert: str | None,
    client_key: str | None,
    metrics_port: int | None,
    metrics_host: str,
    **options: Any,
) -> None:
    """Deliver committed outbox messages, at least once, until SIGTERM or Ctrl-C.

    Run as many relays as you like, with the same or different handlers: each claims only
    the topics it handles, they share the work (FOR UPDATE SKIP LOCKED), never have two
    attempts of one message in flight, and keep per-key order. A message no running relay
    handles waits for one (`tenure outbox list` shows it). Consumers apply each message once
    with the inbox: tenure.inbox.claim_header(conn, consumer, Idempotency-Key).
    """
    setup_logs(log_level, log_format)
    from ..errors import InvalidArgument
    from ..outbox import relay as relay_mod
    from ..outbox.settings import RelaySettings
    from ..outbox.webhook import HttpSession, webhook

    # Every other flag is a relay option, spelled once: a field of RelaySettings.
    settings = RelaySettings.of({**options, "topics": topics or None})

    handlers: dict[str, Any] = {}

    def add(topic: str, handler: Any, origin: str) -> None:
        if topic in handlers:
            raise InvalidArgument(f"topic {topic!r} has two handlers (the second from {origin})")
        handlers[topic] = handler

    # One connection pool and TLS set-up for all of this relay's webhooks. Proxies come from
    # the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY).
    session = HttpSession(
        ca_bundle=ca_bundle,
        client_cert=client_cert,
        client_key=client_key,
        connect_timeout=connect_timeout,
    )
    for spec in webhooks:
        topic, sep, url = spec.partition("=")
        if not sep or not topic or not url:
            raise InvalidArgument(f"--webhook takes TOPIC=URL, got {spec!r}")
        add(topic, webhook(url, session=session), f"--webhook {spec}")
    for spec in handler_specs:
        for topic, handler in load_handlers(spec).items():
            add(topic, handler, f"--handlers {spec}")
    if not handlers:
        usage_error("no handlers: pass --webhook TOPIC=URL and/or --handlers MODULE:ATTR")
    for topic in topics:
        if topic not in handlers:
            usage_error(
                f"--topic {topic!r} has no handler on this relay (handlers: "
                f"{', '.join(sorted(handlers))}); add --webhook {topic}=URL or drop --topic"
            )

    def ready(r: Any) -> None:
        # One line on stdout, so scripts and tests know the relay is listening.
        click.echo(
            f"tenure relay {r.id}: delivering {', '.join(sorted(r.handlers))} "
            f"from schema {schema!r} (concurrency {r.settings.concurrency})"
        )
        sys.stdout.flush()

    serve_from_cli(metrics_port, metrics_host, dsn=dsn, schema=schema)
    done = relay_mod.serve(handlers, dsn=dsn, schema=schema, ready=ready, settings=settings)
    click.echo(f"tenure relay {done.id}: stopped ({done.delivered} delivered)")


@click.group(context_settings=CONTEXT)
def outbox() -> None:
    """Inspect and operate the transactional outbox (messages waiting, dead or delivered)."""


@outbox.command("list", context_settings=CONTEXT)
@db_options
@click.option(
    "--state",
    type=click.Choice(["undelivered", "pending", "dead", "delivered", "all"]),
    default="undelivered",
    envvar="TENURE_OUTBOX_STATE",
    show_envvar=True,
    help="Which messages: undelivered = pending and dead.",
)
@click.option(
    "--topic", default=None, envvar="TENURE_OUTBOX_TOPIC", show_envvar=True, help="Only this topic."
)
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    envvar="TENURE_OUTBOX_LIMIT",
    show_envvar=True,
    help="At most this many messages (oldest first).",
)
@json_option
@handle_errors
def outbox_list(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    state: str,
    topic: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Outbox messages, oldest first, with attempts, next attempt and last error."""
    setup_logs(log_level, log_format)
    from .. import outbox as ob

    states = None if state == "undelivered" else state
    with connect(dsn, schema) as client:
        found = ob.messages(client, state=states, topic=topic, limit=limit)
        totals = ob.counts(client)
        unhandled = ob.unhandled(client)
        now = client.now()
    orphaned = {u.topic for u in unhandled}
    rows = [
        {
            "id": m.id,
            "topic": m.topic,
            "key": m.key,
            "state": m.state,
            "attempts": m.attempts,
            "order_key": m.order_key,
            "job": m.job_key,
            "token": m.token,
            "created_at": m.created_at.isoformat(),
            "next_attempt_in": (
                round(max(0.0, (m.available_at - now).total_seconds()), 3)
                if m.state == "pending"
                else None
            ),
            "claimed": m.claimed_until is not None and m.claimed_until >= now,
            # Pending, and no live relay has a handler for its topic: it waits for one.
            "no_relay": m.state == "pending" and m.topic in orphaned,
            "delivered_at": m.delivered_at.isoformat() if m.delivered_at else None,
            # The same redaction as the relay's log: an endpoint's answer may quote a secret.
            "last_error": None if m.last_error is None else redact(m.last_error),
        }
        for m in found
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    summary = ", ".join(f"{n} {s}" for s, n in totals.items())
    waiting = [
        f"no relay handles topic {u.topic!r}: {u.pending} message(s) waiting, oldest "
        f"{u.oldest_age / 60:.1f} min; start a relay with a handler for it"
        for u in unhandled
    ]
    from .tables import printable, show

    if not rows:
        click.echo(f"no {state} messages ({summary})")
        for line in waiting:
            click.echo(printable(line))
        return

    show(
        ("id", "topic", "key", "state", "attempts", "next in", "last error"),
        [
            (
                row["id"],
                row["topic"],
                row["key"],
                "in flight" if row["claimed"] else "no relay" if row["no_relay"] else row["state"],
                row["attempts"],
                "-" if row["next_attempt_in"] is None else f"{row['next_attempt_in']:.1f}s",
                row["last_error"] or "",
            )
            for row in rows
        ],
        right=("id", "attempts", "next in"),
    )
    click.echo(summary)
    for line in waiting:
        click.echo(printable(line))


@outbox.command("retry", context_settings=CONTEXT)
@db_options
@click.option(
    "--id",
    "ids",
    type=MESSAGE_ID,
    multiple=True,
    envvar="TENURE_OUTBOX_IDS",
    show_envvar=True,
    help="A dead message to re-drive. Repeatable.",
)
@click.option(
    "--topic",
    default=None,
    envvar="TENURE_OUTBOX_TOPIC",
    show_envvar=True,
    help="Every dead message of this topic.",
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    envvar="TENURE_OUTBOX_RETRY_ALL",
    show_envvar=True,
    help="Every dead message.",
)
@handle_errors
def outbox_retry(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    ids: tuple[int, ...],
    topic: str | None,
    every: bool,
) -> None:
    """Re-drive dead messages: pending again now, with a fresh attempt budget."""
    setup_logs(log_level, log_format)
    from .. import outbox as ob

    if not (ids or topic or every):
        usage_error("say which dead messages to re-drive: --id N, --topic T or --all")
    with connect(dsn, schema) as client:
        redriven = ob.retry(client, ids=ids or None, topic=topic)
    if redriven:
        click.echo(f"re-drove {len(redriven)} message(s): {', '.join(map(str, redriven))}")
    # Ids named explicitly that matched nothing are an error; a filter that matched nothing
    # is an answer (README, "Command-line conventions").
    missing = sorted(set(ids) - set(redriven))
    if missing:
        fail(
            f"no dead message with id {', '.join(map(str, missing))}"
            + (f" in topic {topic!r}" if topic else "")
            + "; `tenure outbox list --state all` shows the messages and their states"
        )
    if not redriven:
        click.echo("no dead message matched")


@outbox.command("purge", context_settings=CONTEXT)
@db_options
@click.option(
    "--state",
    type=click.Choice(["delivered", "dead"]),
    default="delivered",
    envvar="TENURE_OUTBOX_PURGE_STATE",
    show_envvar=True,
    help="Delete delivered messages (default) or dead ones. Pending messages are never deleted.",
)
@click.option(
    "--older-than",
    type=DURATION,
    default="7d",
    envvar="TENURE_OUTBOX_PURGE_AGE",
    show_envvar=True,
    help="Only messages whose last event is older than this. A purged (topic, key) no longer "
    "deduplicates a new enqueue.",
)
@click.option(
    "--id",
    "ids",
    type=MESSAGE_ID,
    multiple=True,
    envvar="TENURE_OUTBOX_IDS",
    show_envvar=True,
    help="Only these messages. Repeatable.",
)
@click.option(
    "--topic", default=None, envvar="TENURE_OUTBOX_TOPIC", show_envvar=True, help="Only this topic."
)
@handle_errors
def outbox_purge(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    state: str,
    older_than: float,
    ids: tuple[int, ...],
    topic: str | None,
) -> None:
    """Delete old delivered (or dead) messages."""
    setup_logs(log_level, log_format)
    from .. import outbox as ob

    with connect(dsn, schema) as client:
        purged = ob.purge(client, older_than=older_than, state=state, ids=ids or None, topic=topic)
    click.echo(f"purged {purged} {state} message(s)")
