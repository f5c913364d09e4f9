"""One error hierarchy, rooted at :class:`TenureError`.

Every message says what happened and what to do. Database errors are mapped by SQLSTATE
class (psycopg's ``diag.sqlstate``), never by parsing message text.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


class TenureError(Exception):
    """Base class of every error tenure raises.

    Its message is one line: control characters that came from input (a newline in a schema
    name, an escape sequence in a DSN) are shown escaped, so an error never breaks a log line
    or drives a terminal.
    """

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (printable(args[0]), *args[1:])
        super().__init__(*args)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Bidirectional overrides and isolates: they reorder what follows them on screen (U+202E
# shows "exe.txt" as "txt.exe"), in a terminal, a log viewer or a browser alike.
_BIDI = {*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C}


def one_line(text: str) -> str:
    """``text`` on one line: every run of whitespace, newlines included, as one space (an
    exception's str may add context on further lines)."""
    return " ".join(text.split())


def printable(text: str) -> str:
    """``text`` with control characters, line separators and bidirectional controls shown as
    escapes (``\\n``, ``\\x1b``, ``\\u202e``): the one rule for error messages, the CLI's
    tables and the dashboard's pages."""
    if text.isprintable():
        return text
    return "".join(_escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if code < 0x20 or 0x7F <= code < 0xA0:
        return f"\\x{code:02x}"
    if code in _BIDI or unicodedata.category(ch) in ("Zl", "Zp"):
        return f"\\u{code:04x}"
    return ch


class InvalidArgument(TenureError, ValueError):
    """Bad input, detected before any SQL runs: the one exception tenure raises for an
    argument it refuses (a bad value, or with :class:`InvalidArgumentType` a bad type).

    It is a :class:`TenureError` (catch everything tenure raises) and a :class:`ValueError`
    (what Python code expects of a refused value). The message says what is allowed; the
    limits are listed in the README ("Limits and guarantees").
    """


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of the wrong type (``connect(12345)``, ``fence("not a connection", ...)``,
    ``token=True``). Also a :class:`TypeError`, so ``except TypeError`` works as for any
    Python function; ``except InvalidArgument`` catches both kinds."""


class UnknownJob(TenureError, LookupError):
    """No scheduled job has this key (``tenure jobs pause KEY`` and the like): a runtime
    answer about the database's contents, not a malformed argument."""


class ScheduleConflict(TenureError):
    """A runtime schedule change was refused because of what is stored: the key exists
    (``if_exists="error"``), is a coded job, or changed since it was read. ``keys``: the
    refused keys. Nothing was written."""

    def __init__(self, message: str, keys: dict[str, str]) -> None:
        super().__init__(message)
        self.keys = keys


class ConfigurationError(TenureError):
    """The environment is not set up: no DSN, missing extra, schema not migrated."""


class JobOwnedByAnotherApp(ConfigurationError):
    """A worker would redefine a job that another app (another Scheduler name) registered.

    ``jobs`` maps each such job key to the app that owns it. Rename the job, or take it
    over on purpose: ``tenure worker --adopt`` / ``Scheduler.run(adopt=True)``.
    """

    def __init__(self, message: str, jobs: dict[str, str]) -> None:
        super().__init__(message)
        self.jobs = jobs


class JobStillDefined(TenureError):
    """``tenure jobs remove KEY`` refused: a live worker of the job's app still defines it, or
    its lease is live (a run is going). Deploy workers without the job, stop the old ones,
    then remove it."""


class DatabaseError(TenureError):
    """The database refused or failed an operation. ``sqlstate`` is PostgreSQL's code."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class DatabaseUnavailable(DatabaseError):
    """The database could not be reached, or the connection broke.

    ``outcome_unknown`` is True when a write was sent but its commit was not acknowledged:
    it may or may not have committed. Retrying with the same token is safe.
    """

    def __init__(
        self, message: str, *, sqlstate: str | None = None, outcome_unknown: bool = False
    ) -> None:
        super().__init__(message, sqlstate=sqlstate)
        self.outcome_unknown = outcome_unknown


class SchemaNotReady(ConfigurationError, DatabaseError):
    """tenure's tables are missing or older than this version expects."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        DatabaseError.__init__(self, message, sqlstate=sqlstate)


class Timeout(DatabaseError):
    """A lock wait or statement ran past tenure's timeouts (lock_timeout, statement_timeout)."""


class LeaseError(TenureError):
    """Base class of lease outcomes that are not database failures."""


class LeaseBusy(LeaseError):
    """Another execution holds the lease. ``retry_after``: seconds until it expires by the
    database clock, unless renewed (None when unknown)."""

    def __init__(
        self,
        job_key: str,
        token: int | None,
        expires_at: dt.datetime | None,
        detail: str = "",
        *,
        retry_after: float | None = None,
    ) -> None:
        self.job_key = job_key
        self.token = token
        self.expires_at = expires_at
        self.retry_after = retry_after
        holder = (
            f"token {token}, expires {expires_at.isoformat()} (database clock)"
            if token is not None and expires_at is not None
            else "a concurrent acquire won the race"
        )
        super().__init__(
            f"lease {job_key!r} is held by another execution ({holder}){detail}; "
            "wait for it (wait=seconds) or try again later"
        )


class LeaseLost(LeaseError):
    """This execution no longer holds its lease: start no new work."""

    def __init__(self, job_key: str, token: int, reason: str) -> None:
        self.job_key = job_key
        self.token = token
        self.reason = reason
        super().__init__(
            f"lease {job_key!r} with token {token} is lost: {reason}; stop starting new work "
            "(writes with this token will be rejected once a successor takes over)"
        )


class StaleTokenError(TenureError):
    """A fenced write affected zero rows: a newer token has been accepted or has taken over.

    This means an executor ran past its lease: the deployment's timing assumptions (TTL,
    pauses, downstream latency) were broken. The write was not applied.
    """

    def __init__(
        self,
        job_key: str,
        token: int,
        current_token: int | None,
        *,
        site: str = "result",
        lease_ended: str | None = None,
    ) -> None:
        self.job_key = job_key
        self.token = token
        self.current_token = current_token
        self.site = site
        if current_token is None:
            why = "no lease has been issued for this key (run acquire first)"
        elif current_token > token:
            why = f"token {current_token} has been accepted or has taken over"
        elif lease_ended is not None:  # a strict write: "released" or "expired"
            why = (
                f"the lease of token {token} was {lease_ended} and no newer token has taken "
                "over (a strict write needs a live lease)"
            )
        else:
            why = "the lease expired or was taken over while this write waited"
        super().__init__(
            f"stale fencing token for {job_key!r} ({site} write): token {token} rejected, "
            f"{why}; nothing was written. A stale write means an executor outlived its lease: "
            "check pauses, TTL and downstream latency"
        )


class TokenNotIssued(InvalidArgument):
    """A write named a token that no acquire ever issued for this key."""

    def __init__(self, job_key: str, token: int, issued: int | None) -> None:
        self.job_key = job_key
        self.token = token
        self.issued = issued
        newest = f"the newest issued token is {issued}" if issued else "no token was issued yet"
        super().__init__(
            f"token {token} was never issued for {job_key!r} ({newest}); pass the token that "
            "acquire returned (e.g. $TENURE_FENCING_TOKEN)"
        )


# SQLSTATE classes: https://www.postgresql.org/docs/current/errcodes-appendix.html
_UNAVAILABLE_CLASSES = ("08", "53", "57P", "58")
_SCHEMA_STATES = ("42P01", "3F000", "42703", "42883")
_TIMEOUT_STATES = ("55P03", "57014", "25P03")


UNKNOWN_OUTCOME = "; the write may or may not have committed (retrying with the same token is safe)"


def translate(exc: psycopg.Error, doing: str, *, wrote: bool = False) -> TenureError:
    """Map a psycopg error to a tenure error, by SQLSTATE.

    ``wrote``: the statement was a write that commits on its own (autocommit). Its outcome is
    unknown only when the connection was lost while it ran (no SQLSTATE, or a FATAL/PANIC
    one); a statement that got an ERROR back was rolled back.
    """
    state = exc.sqlstate
    if isinstance(exc, psycopg.OperationalError) and state is None:
        reason = " ".join(str(exc).split())  # libpq's message spans lines: keep one
        return DatabaseUnavailable(
            f"{doing}: the connection to PostgreSQL failed ({reason}); check that the server is "
            "running and reachable" + (UNKNOWN_OUTCOME if wrote else ""),
            outcome_unknown=wrote,
        )
    if state is not None:
        if state in _TIMEOUT_STATES:
            return Timeout(
                f"{doing}: timed out waiting ({exc.diag.message_primary}, SQLSTATE {state}); "
                "a paused holder's transaction may hold the job's row lock",
                sqlstate=state,
            )
        if state == "08P01":
            return DatabaseError(
                f"{doing}: protocol violation ({exc.diag.message_primary}); behind PgBouncer "
                "in transaction mode, connect with prepare_threshold=None "
                "(--prepare-threshold none / $TENURE_PREPARE_THRESHOLD=none)",
                sqlstate=state,
            )
        if state in ("42P05", "26000"):
            return DatabaseError(
                f"{doing}: a prepared statement is missing or duplicated "
                f"({exc.diag.message_primary}); behind PgBouncer in transaction mode, connect "
                "with prepare_threshold=None (--prepare-threshold none)",
                sqlstate=state,
            )
        if state.startswith(_UNAVAILABLE_CLASSES):
            unknown = wrote and exc.diag.severity_nonlocalized in ("FATAL", "PANIC")
            return DatabaseUnavailable(
                f"{doing}: the database is unavailable ({exc.diag.message_primary}, "
                f"SQLSTATE {state}); retry when it is back" + (UNKNOWN_OUTCOME if unknown else ""),
                sqlstate=state,
                outcome_unknown=unknown,
            )
        if state == "25006":
            return DatabaseError(
                f"{doing}: the server is read-only ({exc.diag.message_primary}): a hot standby, "
                "or default_transaction_read_only; connect to the primary (with several hosts "
                "in the DSN, add target_session_attrs=read-write)",
                sqlstate=state,
            )
        if state in _SCHEMA_STATES:
            return SchemaNotReady(
                f"{doing}: tenure's schema is missing or outdated ({exc.diag.message_primary});"
                " run `tenure migrate` (or client.migrate())",
                sqlstate=state,
            )
    return DatabaseError(f"{doing}: {_server_message(exc)}", sqlstate=state)


# libpq's text for an error the server sent: its severity, a colon and two spaces ("FATAL:  "),
# at the start or after libpq's "connection to server at ... failed: ". A refused start-up
# has no SQLSTATE in psycopg (libpq keeps it to itself): whether the server answered at all
# is what tells "check the DSN" from "check the server" apart.
_SERVER_ANSWERED = re.compile(r"(?:^|failed: )[^\s:]+:  \S")


def connection_failed(exc: psycopg.Error, doing: str, dsn_named: str) -> TenureError:
    """:func:`translate` for a connection attempt with the DSN ``dsn_named`` (e.g. "the DSN
    given with --dsn"): says whether PostgreSQL refused the connection (a database, user or
    password the DSN names wrongly) or could not be reached."""
    if not isinstance(exc, psycopg.OperationalError) or exc.sqlstate is not None:
        return translate(exc, doing)
    reason = one_line(str(exc))
    if _SERVER_ANSWERED.search(str(exc)):
        return DatabaseUnavailable(
            f"{doing}: PostgreSQL refused the connection ({reason}); check the database name, "
            f"user and password in {dsn_named} (or retry, if the server is starting up or "
            "has no free connection slots)"
        )
    return DatabaseUnavailable(
        f"{doing}: could not reach PostgreSQL ({reason}); check that the server is running "
        f"and reachable at that host and port, and {dsn_named}"
    )


def _server_message(exc: psycopg.Error) -> str:
    """The server's message and detail on one line. str(exc) adds CONTEXT and the statement's
    parameters on further lines: noise for an operator, and it may quote the caller's data."""
    primary = exc.diag.message_primary
    if primary is None:
        return one_line(str(exc))
    detail = exc.diag.message_detail
    text = f"{primary} ({detail})" if detail else primary
    return one_line(text) + (f" [SQLSTATE {exc.sqlstate}]" if exc.sqlstate else "")


@contextmanager
def mapped(doing: str, *, wrote: bool = False) -> Iterator[None]:
    """Re-raise psycopg errors raised in the block as tenure errors."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, doing, wrote=wrote) from exc
