"""Helpers for the hostile-input properties: the case counter, the "nothing stored changed"
snapshot, the CLI assertions, and Hypothesis strategies for hostile values."""

from __future__ import annotations

import datetime as dt
import math
import os
import traceback
from typing import Any

import psycopg
from click.testing import Result
from hypothesis import strategies as st
from psycopg import sql

import tenure

#: Generated cases run by the properties (printed at the end of the run by conftest).
TRIED: dict[str, int] = {}

SEEDED_KEY = "seeded"
SEEDED_TOPIC = "seeded.topic"


#: Multiplies every property's number of examples (``TENURE_HYPOTHESIS_SCALE=10`` for a deep
#: run); the default keeps the package well under a minute.
SCALE = int(os.environ.get("TENURE_HYPOTHESIS_SCALE", "1"))


def examples(n: int) -> int:
    return max(1, n * SCALE)


def tried(name: str) -> None:
    """Count one generated case of property ``name``."""
    TRIED[name] = TRIED.get(name, 0) + 1


# -- what is stored ---------------------------------------------------------------------------


def stored(dsn: str, schema: str) -> dict[str, set[str]]:
    """Every row of every table in ``schema``, as JSON text, per table."""
    out: dict[str, set[str]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
            )
        ]
        for table in tables:
            rows = conn.execute(
                sql.SQL("SELECT row_to_json(t)::text FROM {}.{} AS t").format(
                    sql.Identifier(schema), sql.Identifier(table)
                )
            ).fetchall()
            out[table] = {row[0] for row in rows}
    return out


def assert_kept(before: dict[str, set[str]], after: dict[str, set[str]]) -> None:
    """Every row stored before is still there, unchanged (new rows may have appeared)."""
    for table, rows in before.items():
        missing = rows - after.get(table, set())
        assert not missing, f"{table}: rows changed or deleted: {sorted(missing)[:3]}"


class Seeded:
    """What the ``seeded`` fixture stored, and the check that it is still there."""

    def __init__(self, client: tenure.Client, dsn: str, schema: str, token: int) -> None:
        self.client, self.dsn, self.schema, self.token = client, dsn, schema, token
        self.before: dict[str, set[str]] = {}

    def __repr__(self) -> str:
        return f"<Seeded schema={self.schema!r} token={self.token}>"

    def check(self) -> None:
        """Every row stored by the fixture is still there, unchanged."""
        assert_kept(self.before, stored(self.dsn, self.schema))


# -- the CLI ----------------------------------------------------------------------------------


def no_traceback(result: Result) -> None:
    """The command ended by exiting, not by an exception escaping it."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(result.exception))
        raise AssertionError(f"the command raised instead of exiting:\n{trace}")
    assert "Traceback" not in result.stderr, result.stderr


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def assert_refused(result: Result) -> None:
    """Refused without a traceback: exit 1 or 2, and the last stderr line is the error.
    Holds with click's usage block too; :func:`assert_one_line` is the issue's form."""
    no_traceback(result)
    assert result.exit_code in (1, 2), (result.exit_code, result.stdout, result.stderr)
    lines = error_lines(result.stderr)
    assert lines, "no message on stderr"
    assert lines[-1].startswith(("tenure: error: ", "Error: ")), lines


def assert_one_line(result: Result, code: int) -> None:
    """The issue's form: exactly one line ``tenure: error: ...`` on stderr, exit ``code``."""
    no_traceback(result)
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("tenure: error: "), lines
    assert result.exit_code == code, (result.exit_code, lines)


# -- strategies -------------------------------------------------------------------------------

#: Characters that break naive code: NUL, controls, ESC, quotes, % and braces (SQL and
#: format strings), backslash, a lone surrogate, multi-byte UTF-8, the BOM, RTL override.
NASTY_CHARS = st.sampled_from(
    [
        "\x00",
        "\n",
        "\r",
        "\t",
        "\x1b",
        "\x7f",
        '"',
        "'",
        "%",
        "%s",
        "%(x)s",
        "{",
        "}",
        "{schema}",
        "\\",
        "\ud800",
        "\udfff",
        "é",
        "€",
        "😀",
        "\ufeff",
        "\u202e",
        " ",
        ";",
        "--",
        "$1",
        "/",
        ":",
        "=",
        "a",
        "Z",
        "0",
    ]
)

#: Text mixing ordinary and nasty pieces, sometimes long.
hostile_text = st.one_of(
    st.text(max_size=30),
    st.lists(NASTY_CHARS, max_size=12).map("".join),
    st.builds(lambda piece, n: piece * n, NASTY_CHARS, st.integers(1, 120)),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=60, max_size=300),
)

#: Values of the wrong type where a string, number or duration is expected.
wrong_types = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.binary(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()),
    st.just(1 + 2j),
)

hostile_durations = st.one_of(
    st.floats(),
    st.integers(min_value=-(2**70), max_value=2**1100),
    st.timedeltas(),
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.one_of(st.integers(-10, 10**20), st.floats(allow_nan=True)),
        st.sampled_from(["", "ms", "s", "m", "h", "d", "w", "y", " s", "S", "e3"]),
    ),
    hostile_text,
    wrong_types,
)


class _HugeInt(int):
    """An int of 5001 digits that Hypothesis can print (Python refuses str() of it)."""

    def __repr__(self) -> str:
        return "10**5000"


HUGE_INT = _HugeInt(10**5000)


def deep(depth: int, leaf: Any = 1) -> Any:
    """A list nested ``depth`` levels."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    hostile_text,
)
hostile_payloads = st.one_of(
    st.recursive(
        json_leaf,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4)
        ),
        max_leaves=12,
    ),
    st.integers(90, 3000).map(deep),
    st.sampled_from([{1, 2}, object(), b"bytes", dt.datetime(2020, 1, 1), HUGE_INT]),
)

#: Plausible and hostile cron expressions and IANA time zones.
hostile_crons = st.one_of(
    st.sampled_from(
        [
            "0 2 * * *",
            "*/5 * * * *",
            "@daily",
            "@reboot",
            "0 2 30 2 *",
            "60 * * * *",
            "* * * * * *",
            "0 0 L * *",
            "0 0 * * MON#5",
            "*/0 * * * *",
            "1-0 * * * *",
            "0 2 * * 7",
            "0 24 * * *",
            "",
            "   ",
        ]
    ),
    st.lists(
        st.one_of(
            st.sampled_from(["*", "*/3", "1-5", "1,2", "L", "W", "?", "#", "-1", "99999999999"]),
            hostile_text,
        ),
        min_size=1,
        max_size=7,
    ).map(" ".join),
    wrong_types,
)
hostile_zones = st.one_of(
    st.sampled_from(
        [
            "UTC",
            "Europe/Berlin",
            "America/St_Johns",
            "Etc/GMT+14",
            "../../etc/passwd",
            "/etc/localtime",
            "Europe/../UTC",
            "utc",
            "Mars/Olympus",
            "",
        ]
    ),
    hostile_text,
    wrong_types,
)


# -- the documented rules, stated independently of tenure's code --------------------------------


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def valid_text(value: object, max_chars: int, *, blank_ok: bool = False) -> bool:
    """A key or name: a non-empty str (not only spaces unless ``blank_ok``), at most
    ``max_chars`` characters, UTF-8 without NUL."""
    return (
        isinstance(value, str)
        and bool(value if blank_ok else value.strip())
        and len(value) <= max_chars
        and encodable(value)
    )


def valid_schema(value: object) -> bool:
    """1 to 63 bytes of UTF-8 without NUL, not starting with pg_."""
    return (
        isinstance(value, str)
        and encodable(value)
        and 1 <= len(value.encode("utf-8")) <= 63
        and not value.lower().startswith("pg_")
    )


def valid_topic(value: object) -> bool:
    return (
        isinstance(value, str)
        and 1 <= len(value) <= 200
        and all(c.isascii() and (c.isalnum() or c in "_.:/-") for c in value)
    )


def payload_ok(payload: Any) -> bool:
    """JSON values only (dict with str keys, list, str, int, finite float, bool, None), at
    most 100 levels of nesting, no NUL or lone surrogate in any string, ints of at most 4300
    digits (Python's own limit for int to text)."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, int):
            if value.bit_length() > 14_000:  # about 4300 digits
                return False
        elif isinstance(value, float):
            if not math.isfinite(value):
                return False
        elif isinstance(value, str):
            if not encodable(value):
                return False
        elif isinstance(value, list | dict):
            if depth > 100:
                return False
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str) or not encodable(key):
                        return False
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
        else:
            return False
    return True


def has_float(payload: Any) -> bool:
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            return True
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False
