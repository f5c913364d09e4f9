"""Where the database is: an explicit DSN, ``$TENURE_DSN``, ``$DATABASE_URL``, or the
embedded server. Passwords are never printed: use :func:`describe` for humans and
:func:`redact` on any text that could quote a DSN.

Every DSN :func:`resolve` sees is checked here, before libpq connects: libpq's parse errors
quote the DSN or the token it stumbled on (a password with a bad percent-escape), so an
unparseable DSN is refused with libpq's reason, redacted, and never reaches a connection.
The passwords of the DSNs resolved in this process are remembered, so that :func:`redact`
also hides them where no ``password=`` or ``user:...@`` frames them.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse

import psycopg.conninfo

from ..errors import ConfigurationError, InvalidArgument

log = logging.getLogger("tenure.dsn")

HIDDEN = "***"

# Passwords of the DSNs this process resolved (and $PGPASSWORD): what redact() hides.
_known: set[str] = set()

# `scheme://user:password@` (a DSN, or a webhook URL): the password, up to the last @ of
# the authority.
_URI_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/?#@\s\"']*:)[^/?#\s\"']*@")
# `password=value` (key=value or URI query), quoted or not.
_KEYWORD = re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&\"']+)")
_URI_AUTHORITY = re.compile(r"(?i)^\s*postgres(?:ql)?://([^/?#]*)")


def candidates(dsn: str) -> set[str]:
    """Every string of ``dsn`` that may be a password, also when libpq cannot parse it."""
    found: set[str] = set()
    try:
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except (psycopg.ProgrammingError, UnicodeEncodeError):  # unparseable, or not UTF-8
        password = None
    if password:
        found.add(str(password))
    match = _URI_AUTHORITY.match(dsn)
    if match and "@" in match.group(1):
        authority = match.group(1)
        for userinfo in (authority.rsplit("@", 1)[0], authority.split("@", 1)[0]):
            if ":" in userinfo:
                found.add(userinfo.split(":", 1)[1])
    for value in re.findall(r"(?i)password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", dsn):
        found.add(value)
        found.add(value.strip("'"))
        found.add(value.split("&", 1)[0])
    for value in list(found):
        found.add(urllib.parse.unquote(value, errors="replace"))
    return {value for value in found if value}


def remember(*dsns: str | None) -> None:
    """Hide the passwords of these DSNs (and of ``$PGPASSWORD``) in :func:`redact`."""
    for dsn in dsns:
        if dsn:
            _known.update(candidates(dsn))
    password = os.environ.get("PGPASSWORD")
    if password:
        _known.add(password)


def redact(text: str, *dsns: str | None) -> str:
    """``text`` without passwords: ``password=...`` values, ``user:...@`` in URIs, and every
    password of ``dsns`` and of the DSNs already resolved in this process."""
    text = _URI_USERINFO.sub(rf"\g<1>{HIDDEN}@", text)
    text = _KEYWORD.sub(rf"\g<1>{HIDDEN}", text)
    secrets = set(_known)
    for dsn in dsns:
        if dsn:
            secrets |= candidates(dsn)
    # Only where the password stands alone, not inside a word: libpq and URIs quote or
    # delimit it (`:pw@`, `"pw%ZZ"`), and a password "ab" (or "postgres") must not turn
    # "about" into "***out" (or "postgresql://" into "***ql://").
    for secret in sorted(secrets, key=len, reverse=True):
        text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", HIDDEN, text)
    return text


#: ``resolve``'s source for a DSN passed in by the caller (a library call's ``dsn=``).
GIVEN = "the DSN given"


class GivenDsn(str):
    """A DSN string that knows how the command line got it (``--dsn`` or ``$TENURE_DSN``), so
    that a message about it names that rather than a guess. Otherwise a plain ``str``."""

    source: str

    def __new__(cls, value: str, source: str) -> GivenDsn:
        self = super().__new__(cls, value)
        self.source = source
        return self

    def __reduce__(self) -> tuple[type[GivenDsn], tuple[str, str]]:
        return (GivenDsn, (str(self), self.source))


def named(source: str) -> str:
    """``resolve``'s ``source`` as a phrase for a message: "the DSN given with --dsn"."""
    if source == "embedded":
        return "the embedded server"
    if source.startswith("-"):
        return f"the DSN given with {source}"
    if source.startswith("$"):
        return f"the DSN from {source}"
    return source


def parse(dsn: str, source: str, *, given: bool | None = None) -> dict[str, str]:
    """libpq's reading of ``dsn``; an unparseable one raises with the reason, redacted:
    :class:`~tenure.errors.InvalidArgument` for a DSN the caller passed in (``given``; by
    default when ``source`` is :data:`GIVEN`), else
    :class:`~tenure.errors.ConfigurationError`."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        reason = redact(" ".join(str(exc).split()), dsn)
        error = (
            InvalidArgument if (source == GIVEN if given is None else given) else ConfigurationError
        )
        raise error(
            f"{named(source)} cannot be parsed ({reason}); "
            "write it as a URI (postgresql://user@host:5432/dbname; a password goes after "
            "user and a colon, percent-encoded) or as key=value pairs (host=... dbname=...)"
        ) from None
    return {key: str(value) for key, value in params.items() if value is not None}


def resolve(dsn: str | None = None) -> tuple[str, str]:
    """Return ``(dsn, source)``; ``source`` says where it came from, for logs and errors.

    Raises :class:`~tenure.errors.InvalidArgument` (a DSN given) or
    :class:`~tenure.errors.ConfigurationError` (from the environment) when libpq cannot
    parse it."""
    if dsn:
        found, source = dsn, getattr(dsn, "source", GIVEN)
    else:
        for var in ("TENURE_DSN", "DATABASE_URL"):
            value = os.environ.get(var)
            if value:
                found, source = value, f"${var}"
                break
        else:
            from . import embedded

            return embedded.dsn(), "embedded"
    remember(found)
    parse(found, source, given=bool(dsn))
    return found, source


def describe(dsn: str) -> str:
    """``user@host:port/dbname`` without the password or other secrets."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    user = str(params.get("user") or os.environ.get("PGUSER") or "")
    dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or user or "")
    where = f"{host}:{port}" if not host.startswith("/") else f"socket {host}"
    return redact(f"{user + '@' if user else ''}{where}/{dbname}", dsn)
