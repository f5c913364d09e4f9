"""What every command shares: the database and logging options, --json, one-line errors,
and the connection. Command modules import this; it imports none of them.

The conventions every command follows (README, "Command line"):

* a usage error (unknown option, bad option value, missing argument) exits 2, a runtime
  error 1; both print exactly one line on stderr, ``tenure: error: ...`` (``tenure exec:
  error: ...`` for exec), never click's usage block and never a traceback;
* no message ever shows a password: every error line and log line goes through
  :func:`tenure.db.dsn.redact`.

:class:`TenureGroup` is the last line of defence: it runs click in non-standalone mode and
turns whatever escapes a command into that one line.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from click.core import ParameterSource

from ..errors import one_line

if TYPE_CHECKING:
    from ..observability.http import MetricsServer

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "show_default": True}

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, like a shell

PROG = "tenure"


def error_line(message: str, prog: str = PROG) -> str:
    """``tenure: error: MESSAGE`` on one line, without passwords."""
    from ..db.dsn import redact

    return f"{prog}: error: {redact(one_line(message))}"


def fail(message: str, code: int = EXIT_ERROR, prog: str = PROG) -> NoReturn:
    click.echo(error_line(message, prog), err=True)
    sys.exit(code)


def _prog(ctx: click.Context | None) -> str:
    """``tenure exec`` speaks as itself (the command owns stdout and stderr's prefix)."""
    while ctx is not None:
        if ctx.info_name == "exec" and ctx.parent is not None and ctx.parent.parent is None:
            return f"{PROG} exec"
        ctx = ctx.parent
    return PROG


class TenureGroup(click.Group):
    """The ``tenure`` group: click's errors and anything a command lets escape become one
    line and the conventional exit code (2 usage, 1 runtime)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        from ..db import dsn as dsn_mod

        # Passwords the command line and environment carry, hidden even before any DSN is
        # resolved (a traceback of a bad --dsn must not show it either).
        argv = list(sys.argv[1:] if args is None else args)
        given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--dsn"]
        given += [a.split("=", 1)[1] for a in argv if a.startswith("--dsn=")]
        dsn_mod.remember(*given, os.environ.get("TENURE_DSN"), os.environ.get("DATABASE_URL"))
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            if isinstance(exc, click.exceptions.NoArgsIsHelpError):
                exc.show()  # `tenure` or `tenure jobs` alone: the help, as click prints it
                sys.exit(exc.exit_code)
            where = exc.ctx.command_path if exc.ctx is not None else PROG
            fail(f"{exc.format_message()} (see `{where} --help`)", EXIT_USAGE, _prog(exc.ctx))
        except click.ClickException as exc:
            if type(exc).show is not click.ClickException.show:
                exc.show()  # a command's own one-line usage problem (tenure exec)
                sys.exit(exc.exit_code)
            fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("interrupted", EXIT_INTERRUPTED)
        except Exception as exc:
            from ..errors import InvalidArgument, TenureError

            prog = f"{PROG} exec" if argv[:1] == ["exec"] else PROG
            if isinstance(exc, TenureError):
                fail(str(exc), EXIT_USAGE if isinstance(exc, InvalidArgument) else EXIT_ERROR, prog)
            if isinstance(exc, BrokenPipeError):
                # The reader went away (`tenure jobs list | head`): nothing to tell it, and
                # no flush at exit that would fail again.
                os._exit(EXIT_ERROR)
            if os.environ.get("TENURE_TRACEBACK"):
                raise
            fail(
                f"unexpected {type(exc).__name__}: {str(exc) or 'no message'} (this is a bug in "
                "tenure, or an input it does not handle yet: please report it; set "
                "TENURE_TRACEBACK=1 to see the traceback)",
                prog=prog,
            )
        sys.exit(result if isinstance(result, int) else 0)


def usage_error(message: str) -> NoReturn:
    """Bad usage found inside a command (options that only make sense together): exit 2."""
    raise click.UsageError(message, ctx=click.get_current_context(silent=True))


def dsn_origin(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The --dsn value, told whether it came from --dsn or $TENURE_DSN (for messages about
    it: "check the DSN given with --dsn", not a guess)."""
    if not value:
        return value
    from ..db.dsn import GivenDsn

    from_env = ctx.get_parameter_source(param.name or "dsn") is ParameterSource.ENVIRONMENT
    return GivenDsn(value, "$TENURE_DSN" if from_env else "--dsn")


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
        callback=dsn_origin,
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
    """Turn tenure errors into one line on stderr and exit 1, never a traceback (also when
    the command is invoked without :class:`TenureGroup`, e.g. by a test's CliRunner)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..errors import InvalidArgument, TenureError

        try:
            return fn(*args, **kwargs)
        except InvalidArgument as exc:
            # Refused input (a key, a payload, a name checked inside the command): usage.
            fail(str(exc), EXIT_USAGE)
        except TenureError as exc:
            fail(str(exc))

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
