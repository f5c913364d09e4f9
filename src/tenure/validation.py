"""Input checks that run before any SQL: job keys, durations, TTLs, payloads."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from .errors import InvalidArgument

MAX_JOB_KEY = 200
MIN_TTL = 0.01
MAX_TTL = 86_400.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

Duration = float | int | str | dt.timedelta


def parse_duration(value: Duration, *, what: str = "duration") -> float:
    """Seconds from ``30``, ``2.5``, ``"30s"``, ``"250ms"``, ``"5m"``, ``"1h"`` or a timedelta."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} must be a number of seconds or like '30s', got {value!r}")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise InvalidArgument(
        f"{what} {value!r} is not a duration; use seconds or a number with a unit: "
        "250ms, 30s, 5m, 1h, 1d"
    )


def check_ttl(value: Duration) -> float:
    ttl = parse_duration(value, what="ttl")
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidArgument(
            f"ttl {value!r} is out of range: it must be between {MIN_TTL}s and {MAX_TTL:.0f}s "
            "(24h). The TTL is how long a holder may go silent, not how long the job runs: "
            "the lease is renewed every ttl/3 while the job runs"
        )
    return ttl


def check_job_key(job_key: object) -> str:
    if not isinstance(job_key, str) or not job_key.strip():
        raise InvalidArgument(f"job key must be a non-empty string, got {job_key!r}")
    if len(job_key) > MAX_JOB_KEY:
        raise InvalidArgument(
            f"job key is {len(job_key)} characters long; the limit is {MAX_JOB_KEY}"
        )
    if "\x00" in job_key:
        raise InvalidArgument("job key must not contain NUL characters")
    return job_key


def check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidArgument(
            f"fencing token must be a positive integer (as returned by acquire), got {token!r}"
        )
    return token


def to_json(payload: Any) -> str:
    """Serialise a payload to JSON text, or say why it cannot be stored."""
    try:
        return json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"payload is not JSON-serialisable ({exc}); store dicts, lists, strings, numbers, "
            "booleans or None"
        ) from None


def check_schema(schema: object) -> str:
    if not isinstance(schema, str) or not schema or len(schema) > 63:
        raise InvalidArgument(
            f"schema must be a PostgreSQL identifier of 1 to 63 characters, got {schema!r}"
        )
    return schema
