"""What every command shares: the database and logging options, --json, one-line errors,
and the connection. Command modules import this; it imports none of them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from ..observability.http import MetricsServer

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "show_default": True}

EXIT_ERROR = 1


def db_options(fn: F) -> F:
    """--dsn, --schema and the logging options, shared by every command that talks to the DB."""
    fn = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        envvar="TENURE_LOG_FORMAT",
        show_envvar=True,
        help="Log line format on stderr.",
    )(fn)
    fn = click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="warning",
        envvar="TENURE_LOG_LEVEL",
        show_envvar=True,
        help="Least severe log level shown.",
    )(fn)
    fn = click.option(
        "--schema",
        default="tenure",
        envvar="TENURE_SCHEMA",
        show_envvar=True,
        help="PostgreSQL schema holding tenure's tables.",
    )(fn)
    fn = click.option(
        "--dsn",
        default=None,
        envvar="TENURE_DSN",
        show_envvar=True,
        help="PostgreSQL connection string. Unset: $DATABASE_URL, else the embedded server."
        " Behind PgBouncer in transaction mode, also set TENURE_PREPARE_THRESHOLD=none.",
    )(fn)
    return fn


def json_option_with(help_text: str) -> Callable[[F], F]:
    """--json (and $TENURE_JSON) for commands that can print machine-readable output."""
    return click.option(
        "--json", "as_json", is_flag=True, envvar="TENURE_JSON", show_envvar=True, help=help_text
    )


def json_option(fn: F) -> F:
    return json_option_with("Print JSON instead of a table.")(fn)


def handle_errors(fn: F) -> F:
    """Turn tenure errors into one line on stderr and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..errors import TenureError

        try:
            return fn(*args, **kwargs)
        except TenureError as exc:
            click.echo(f"tenure: error: {exc}", err=True)
            sys.exit(EXIT_ERROR)

    return wrapper  # type: ignore[return-value]


def setup_logs(log_level: str, log_format: str) -> None:
    from . import logs

    logs.setup(log_level, log_format)


def connect(dsn: str | None, schema: str) -> Any:
    import tenure

    return tenure.connect(dsn, schema=schema)


def metrics_options(fn: F) -> F:
    """``--metrics-port`` and ``--metrics-host``, for the long-running commands."""
    fn = click.option(
        "--metrics-host",
        default="127.0.0.1",
        envvar="TENURE_METRICS_HOST",
        show_envvar=True,
        help="Address the metrics server binds to (0.0.0.0 or :: to be scraped from elsewhere).",
    )(fn)
    fn = click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        default=None,
        envvar="TENURE_METRICS_PORT",
        show_envvar=True,
        help="Serve /metrics (Prometheus), /healthz and /readyz on this port (0: any free "
        "port, logged). [default: no server]",
    )(fn)
    return fn


def serve_from_cli(
    port: int | None, host: str, *, dsn: str | None, schema: str
) -> MetricsServer | None:
    """What the commands call: nothing without ``--metrics-port``."""
    if port is None:
        return None
    from ..observability.http import serve

    server = serve(dsn=dsn, schema=schema, host=host, port=port)
    # Also without info logging: with --metrics-port 0 this is where the port is told.
    click.echo(f"tenure: metrics on {server.url}/metrics (also /healthz, /readyz)", err=True)
    return server
