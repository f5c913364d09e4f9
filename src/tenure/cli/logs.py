"""Logging set-up for the command line: text for people, JSON lines for machines. Library
code only logs under ``tenure.*`` with structured ``extra`` fields (job, token, owner)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from ..db.dsn import redact
from .tables import printable

_FIELDS = ("job", "token", "owner", "slot", "outcome", "current_token")


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
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in _FIELDS:
            if hasattr(record, field):
                out[field] = getattr(record, field)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "warning", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("tenure")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
