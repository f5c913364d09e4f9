"""Input checks that run before any SQL: names, job keys, durations, TTLs, payloads.

Every check raises :class:`~tenure.errors.InvalidArgument` (or its subclass
:class:`~tenure.errors.InvalidArgumentType` when the value has the wrong type) with a message
that says what is allowed. The limits are listed in the README ("Limits and guarantees").
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any

from .errors import InvalidArgument, InvalidArgumentType

MAX_JOB_KEY = 200
MIN_TTL = 0.01
MAX_TTL = 86_400.0
#: The longest duration tenure accepts anywhere: 100 years. Longer values are typos or
#: attacks, and overflow Python's timedelta, PostgreSQL's interval or a thread's timeout.
MAX_DURATION = 100 * 365 * 86_400.0
#: PostgreSQL's NAMEDATALEN - 1: longer identifiers are silently truncated by the server.
MAX_IDENTIFIER_BYTES = 63
#: Deepest nesting of a JSON payload. Deeper documents exhaust Python's recursion limit
#: when they are serialised or read back.
MAX_JSON_DEPTH = 100
#: Largest value of a PostgreSQL bigint (tokens, message ids, limits).
MAX_BIGINT = 2**63 - 1
#: Most job bodies running at once on one scheduler worker (sync ones each take a thread).
MAX_CONCURRENCY = 10_000
#: Largest claim_ahead / finish_backlog a worker accepts (runs held without a body).
MAX_QUEUE = 100_000

# Matched on the stripped text, so no two optional runs of spaces are adjacent (they made
# the match quadratic on long input). re.ASCII: "٣s" is not a duration.
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?", re.ASCII)
#: Longest duration text: "36500d", "2.5s" and their like are short.
MAX_DURATION_TEXT = 40
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

Duration = float | int | str | dt.timedelta


def parse_duration(value: Duration, *, what: str = "duration") -> float:
    """Seconds from ``30``, ``2.5``, ``"30s"``, ``"250ms"``, ``"5m"``, ``"1h"`` or a timedelta.

    Refused (:class:`InvalidArgument`): other types, negative, NaN or infinite values, and
    anything longer than 100 years (``36500d``).
    """
    seconds: float
    if isinstance(value, bool) or not isinstance(value, int | float | str | dt.timedelta):
        raise InvalidArgumentType(
            f"{what} must be a number of seconds, a timedelta or a string like '30s', "
            f"got {_show(value)}"
        )
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        if len(value) > MAX_DURATION_TEXT:
            raise InvalidArgument(
                f"{what} {_show(value)} is too long for a duration ({len(value)} characters); "
                "use seconds or a number with a unit: 250ms, 30s, 5m, 1h, 1d"
            )
        m = _DURATION.fullmatch(value.strip(" \t\n\r\f\v"))
        if m is None:
            raise InvalidArgument(
                f"{what} {_show(value)} is not a duration; use seconds or a number with a "
                "unit: 250ms, 30s, 5m, 1h, 1d"
            )
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds < 0:
        raise InvalidArgument(f"{what} {_show(value)} is out of range: it must not be negative")
    if not seconds <= MAX_DURATION:  # also true for NaN
        raise InvalidArgument(
            f"{what} {_show(value)} is out of range: a duration is a finite number of "
            "seconds, at most 100 years (36500d)"
        )
    return seconds


def check_ttl(value: Duration, *, what: str = "ttl") -> float:
    ttl = parse_duration(value, what=what)
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidArgument(
            f"{what} {_show(value)} is out of range: it must be between {MIN_TTL}s and "
            f"{MAX_TTL:.0f}s (24h). The TTL is how long a holder may go silent, not how long "
            "the job runs: the lease is renewed every ttl/3 while the job runs"
        )
    return ttl


def check_text(value: object, *, what: str, max_chars: int, blank_ok: bool = False) -> str:
    """A name or key stored as text: a str, not empty (nor only spaces unless ``blank_ok``),
    at most ``max_chars`` characters, encodable as UTF-8 (no lone surrogates), without NUL
    (PostgreSQL text cannot hold it)."""
    if not isinstance(value, str):
        raise InvalidArgumentType(f"{what} must be a string, got {_show(value)}")
    if not value or (not blank_ok and not value.strip()):
        raise InvalidArgument(f"{what} must be a non-empty string (not only spaces), got {value!r}")
    if len(value) > max_chars:
        raise InvalidArgument(f"{what} is {len(value)} characters long; the limit is {max_chars}")
    check_encodable(value, what=what)
    return value


def check_encodable(value: str, *, what: str) -> str:
    """No NUL (PostgreSQL text cannot store it) and no lone surrogate (not UTF-8)."""
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters, got {_show(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{what} is not valid Unicode (it holds a lone surrogate), got {_show(value)}"
        ) from None
    return value


def check_job_key(job_key: object) -> str:
    return check_text(job_key, what="job key", max_chars=MAX_JOB_KEY)


def check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgumentType(
            f"fencing token must be a positive integer (as returned by acquire), got {_show(token)}"
        )
    if not 1 <= token <= MAX_BIGINT:
        raise InvalidArgument(
            f"fencing token must be a positive integer of at most {MAX_BIGINT} (as returned "
            f"by acquire), got {_show(token)}"
        )
    return token


def check_int(value: object, *, what: str, minimum: int, maximum: int) -> int:
    """An int (not a bool) in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"{what} must be an integer, got {_show(value)}")
    if not minimum <= value <= maximum:
        raise InvalidArgument(f"{what} must be between {minimum} and {maximum}, got {_show(value)}")
    return value


def parse_json(text: str | bytes, *, what: str = "payload") -> Any:
    """Parse a JSON document (str, or bytes in UTF-8/16/32), or say why it is refused."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidArgument(
            f"{what} is nested too deeply; the limit is {MAX_JSON_DEPTH} levels"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise InvalidArgument(f"{what} is not a JSON document: {_first_line(exc)}") from None
    to_json(value, what=what)  # the same limits as a payload passed from Python
    return value


def to_json(payload: Any, *, what: str = "payload") -> str:
    """Serialise a payload to JSON text, or say why it cannot be stored.

    Refused: values JSON cannot represent (NaN, infinity, sets, objects), nesting deeper than
    :data:`MAX_JSON_DEPTH`, and strings (or keys) with NUL or lone surrogates, which
    PostgreSQL's jsonb rejects.
    """
    _check_json_tree(payload, what)
    try:
        return json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"{what} is not JSON-serialisable ({_first_line(exc)}); store dicts, lists, "
            "strings, numbers, booleans or None"
        ) from None


def _check_json_tree(payload: Any, what: str) -> None:
    # An explicit stack, not recursion: the depth check must not hit the recursion limit
    # it guards against (a cycle is reported as too deep).
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_json_string(value, what)
        elif isinstance(value, dict | list | tuple):
            if depth > MAX_JSON_DEPTH:
                raise InvalidArgument(
                    f"{what} is nested more than {MAX_JSON_DEPTH} levels deep (or holds a "
                    "reference to itself); flatten it"
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(key, str):
                        _check_json_string(key, what)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)


def _check_json_string(value: str, what: str) -> None:
    if "\x00" in value:
        raise InvalidArgument(
            f"{what} holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store; "
            "remove it or encode the data (base64, for example)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{what} holds a lone surrogate (not valid Unicode), which PostgreSQL's jsonb "
            "cannot store"
        ) from None


def check_dsn(dsn: object) -> str | None:
    """None (the environment decides) or a connection string without NUL, which libpq would
    silently cut the string at."""
    if dsn is None:
        return None
    if not isinstance(dsn, str):
        raise InvalidArgumentType(
            "dsn must be a connection string (postgresql://user@host/db or 'host=... "
            f"dbname=...') or None, got a {type(dsn).__name__}"
        )
    if "\x00" in dsn:
        raise InvalidArgument("dsn must not contain NUL characters")
    try:
        dsn.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("dsn is not valid Unicode (it holds a lone surrogate)") from None
    return dsn


def check_connection(conn: object, cls: type, *, what: str) -> None:
    """``conn`` is a psycopg connection of the flavour ``what`` needs (sync or asyncio)."""
    if not isinstance(conn, cls):
        raise InvalidArgumentType(
            f"{what} takes your open psycopg connection ({cls.__module__.split('.')[0]}."
            f"{cls.__name__}) as its first argument, got {_show(conn)}"
        )


def check_schema(schema: object) -> str:
    """A PostgreSQL schema name tenure can use as a quoted identifier.

    At most 63 bytes in UTF-8 (longer names are silently truncated by PostgreSQL, so two
    names could share one schema), no NUL or lone surrogate, not starting with ``pg_``
    (reserved by PostgreSQL).
    """
    if not isinstance(schema, str):
        raise InvalidArgumentType(f"schema must be a string, got {_show(schema)}")
    if not schema:
        raise InvalidArgument("schema must not be empty; the default is 'tenure'")
    check_encodable(schema, what="schema")
    size = len(schema.encode("utf-8"))
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidArgument(
            f"schema {schema[:20]!r}... is {size} bytes long in UTF-8; PostgreSQL identifiers "
            f"are at most {MAX_IDENTIFIER_BYTES} bytes (longer names are silently truncated)"
        )
    if schema.lower().startswith("pg_"):
        raise InvalidArgument(
            f"schema {schema!r} starts with 'pg_', which PostgreSQL reserves for system schemas"
        )
    return schema


def _show(value: object) -> str:
    """A short repr for messages: hostile input must not flood the error line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
