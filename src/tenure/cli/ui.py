"""``tenure ui``: the web dashboard."""

from __future__ import annotations

import socket
from typing import Any

import click

from .common import CONTEXT, connect, db_options, handle_errors, setup_logs


@click.command("ui", context_settings=CONTEXT)
@db_options
@click.option(
    "--host",
    default="127.0.0.1",
    envvar="TENURE_UI_HOST",
    show_envvar=True,
    help="Address to bind. Anything but loopback exposes the dashboard: set a --token.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8484,
    envvar="TENURE_UI_PORT",
    show_envvar=True,
    help="Port to listen on (0: any free port, printed).",
)
@click.option(
    "--actions",
    is_flag=True,
    envvar="TENURE_UI_ACTIONS",
    show_envvar=True,
    help="Enable pause, resume, trigger, release, retry and purge buttons (needs --token). "
    "[default: read-only]",
)
@click.option(
    "--token",
    default=None,
    envvar="TENURE_UI_TOKEN",
    show_envvar=True,
    help="Credential every request must carry: the HTTP Basic password (any user name) or "
    "'Authorization: Bearer TOKEN'. Prefer the environment variable (a flag shows in ps).",
)
@click.option(
    "--root-path",
    default="",
    envvar="TENURE_UI_ROOT_PATH",
    show_envvar=True,
    help="Path prefix a reverse proxy serves the dashboard under (e.g. /ops/tenure): links, "
    "assets, cookies and redirects carry it. The proxy may strip it or pass it on.",
)
@click.option(
    "--forwarded-allow-ips",
    default=None,
    envvar="TENURE_UI_FORWARDED_ALLOW_IPS",
    show_envvar=True,
    help="Comma-separated proxy addresses or networks (or *) whose X-Forwarded-Proto, "
    "-Host, -For and -Prefix headers are believed. [default: none]",
)
@handle_errors
def ui(
    dsn: str | None,
    schema: str,
    log_level: str,
    log_format: str,
    host: str,
    port: int,
    actions: bool,
    token: str | None,
    root_path: str,
    forwarded_allow_ips: str | None,
) -> None:
    """Serve the web dashboard: jobs, leases, takeovers and refused writes, live.

    \b
    Pages: overview, jobs (sort, filter, search), a job's lease timeline and run history,
    every lease, the outbox. Open pages update within a second of a change in the database
    (LISTEN/NOTIFY, pushed as server-sent events). Read-only unless --actions (with --token).
    Binds 127.0.0.1 by default. Needs the ui extra: pip install 'tenure[ui]'.
    """
    setup_logs(log_level, log_format)
    if actions and not token:
        raise click.UsageError("--actions needs a credential: set --token or $TENURE_UI_TOKEN")
    from ..ui.server import serve

    dashboard, sock = start_dashboard(
        dsn=dsn,
        schema=schema,
        host=host,
        port=port,
        actions=actions,
        token=token,
        root_path=root_path,
        forwarded_allow_ips=forwarded_allow_ips,
    )
    try:
        serve(dashboard, sock)
    finally:
        sock.close()


def _check_schema(dsn: str | None, schema: str) -> None:
    """Fail now if the database cannot be reached; warn if the schema is missing or older
    than the dashboard needs (pages still answer, and say what to do)."""
    from ..db import migrations

    with connect(dsn, schema) as client:
        version = client.schema_version()
    if version is None:
        click.echo(
            f"tenure: warning: schema {schema!r} has no tenure tables yet; run `tenure migrate`",
            err=True,
        )
    elif version < migrations.latest():
        click.echo(
            f"tenure: warning: schema {schema!r} is at version {version}; run `tenure migrate` "
            f"(version {migrations.latest()} notifies open pages when runs start and end)",
            err=True,
        )


#: Served by the metrics app on the worker's one port (tenure.observability.http.App).
METRICS_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})


def one_port(dashboard_app: Any, metrics_app: Any) -> Any:
    """An ASGI app: ``/metrics``, ``/healthz`` and ``/readyz`` go to ``metrics_app``, anything
    else (and the lifespan, which opens and closes the dashboard) to ``dashboard_app``.
    Composed here, above both: observability and ui do not import each other."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in METRICS_PATHS:
            await metrics_app(scope, receive, send)
        else:
            await dashboard_app(scope, receive, send)

    return app


def serve_dashboard_with_metrics(
    *,
    dsn: str | None,
    schema: str,
    host: str,
    port: int,
    actions: bool,
    token: str | None,
    check: bool = True,
) -> Any:
    """`tenure worker --ui`: the dashboard and the metrics endpoints on one port, on a
    background thread (a started :class:`~tenure.ui.server.BackgroundServer`). The metrics
    endpoints answer without the dashboard's credential, as on a metrics port alone (a
    Prometheus scraper and a load balancer's health check carry none)."""
    try:
        from a2wsgi import WSGIMiddleware
    except ImportError:  # pragma: no cover - depends on the environment
        raise click.UsageError(
            "--ui needs the ui extra (a2wsgi is missing): pip install 'tenure[ui]'"
        ) from None
    from ..observability.http import exporter_app
    from ..ui.server import BackgroundServer

    dashboard, sock = start_dashboard(
        dsn=dsn,
        schema=schema,
        host=host,
        port=port,
        actions=actions,
        token=token,
        check=check,
        flags="--metrics-port (0: any free port) or --metrics-host",
    )
    metrics_app = WSGIMiddleware(exporter_app(dsn=dsn, schema=schema))  # type: ignore[arg-type]
    server = BackgroundServer(one_port(dashboard.app, metrics_app), sock).start()
    click.echo(f"tenure: metrics on {server.url}metrics (also /healthz, /readyz)", err=True)
    return server


def start_dashboard(
    *,
    dsn: str | None,
    schema: str,
    host: str,
    port: int,
    actions: bool,
    token: str | None,
    check: bool = True,
    flags: str = "--port (0: any free port) or --host",
    root_path: str = "",
    forwarded_allow_ips: str | None = None,
) -> tuple[Any, socket.socket]:
    """Build the dashboard and bind its socket, with the checks and messages of `tenure ui`
    (shared with `tenure worker --ui-port` and `--ui`)."""
    from ..ui import Dashboard
    from ..ui.server import bind, is_loopback, url_of

    if not is_loopback(host) and not token:
        click.echo(
            f"tenure: warning: the dashboard is bound to {host} without a credential: anyone "
            "who can reach it can read job keys, errors and results; set a token",
            err=True,
        )
    dashboard = Dashboard(
        dsn,
        schema=schema,
        actions=actions,
        credential=token,
        root_path=root_path,
        forwarded_allow_ips=forwarded_allow_ips,
    )
    if check:
        _check_schema(dsn, schema)
    sock = bind(host, port, flags)
    mode = "actions enabled" if actions else "read-only"
    click.echo(
        f"tenure: dashboard on {url_of(sock)} ({mode}) for schema {schema!r} on {dashboard.where}"
        + (f", under {root_path.rstrip('/')} behind a proxy" if root_path.strip("/ ") else ""),
        err=True,
    )
    return dashboard, sock
