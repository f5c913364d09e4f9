"""Logging set-up for the command line: text for people, JSON lines for machines. Library
code only logs under ``tenure.*`` with structured ``extra`` fields (job, token, owner)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any

from ..db.dsn import redact
from .tables import printable

#: What every LogRecord has: anything else on a record came from ``extra=`` and is a field.
#: The logger of psycopg and psycopg_pool ("psycopg.pool"), routed like tenure's own.
DRIVER_LOGGER = "psycopg"

_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # The last line of defence: a driver message or a traceback may quote a DSN, and a
        # job's error message may hold terminal escapes (a traceback keeps its lines).
        text = redact(super().format(record))
        return "\n".join(printable(line) for line in text.split("\n"))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(self._format(record))

    def _format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field, value in record.__dict__.items():
            if field not in _RECORD_ATTRIBUTES and field not in out:
                out[field] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _rfc3339(created: float) -> str:
    """RFC 3339 in UTC with milliseconds (``2026-12-04T03:04:05.678Z``): sortable, and
    unambiguous across hosts in other zones."""
    moment = dt.datetime.fromtimestamp(created, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _one_line_message(record: logging.LogRecord) -> bool:
    """libpq's messages span lines ("...failed: Connection refused\n\tIs the server
    running..."): one record, one line."""
    record.msg, record.args = " ".join(record.getMessage().split()), None
    return True


def _handler(fmt: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def setup(level: str = "warning", fmt: str = "text") -> None:
    handler = _handler(fmt)
    root = logging.getLogger("tenure")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # psycopg and psycopg_pool log too (the pool's failed reconnections while the server
    # restarts): through the same handler and format, not Python's last-resort handler.
    # Their debug and info lines (every connection attempt, the pool growing) only with
    # --log-level debug.
    driver = logging.getLogger(DRIVER_LOGGER)
    driver_handler = _handler(fmt)
    driver_handler.addFilter(_one_line_message)
    driver.handlers[:] = [driver_handler]
    driver.setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    driver.propagate = False
