"""The history a run leaves: the workers' operation logs and the nemesis' fault log.

Every operation is two JSON lines in its worker's op log, ``ph`` ``b`` (begin) then ``e``
(end), sharing ``(w, inc, n)``: worker number, incarnation (a killed worker is started again
as the next one) and sequence number. Outcomes: ``ok``, ``busy``, ``stale`` (refused by the
fence), ``lost``, ``skipped``, ``none``, ``error`` (definitely not applied: refused, rolled
back, or failed before COMMIT was sent) and ``unknown`` (may have committed: the connection
died while the write or its COMMIT was in flight). A begin line without an end line (the
worker was killed mid-operation) is ``unknown`` too.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

#: An operation as the checker sees it: the begin line's fields updated by the end line's.
Op = dict[str, Any]

#: Outcomes that mean "this write did not happen".
NOT_APPLIED = ("stale", "error", "busy", "none", "lost", "skipped")
#: Operations that write business data (and so can be stale).
WRITES = ("ledger", "result")


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def parse_ts(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


class OpLog:
    """Append-only JSON lines, flushed per line (a SIGKILL loses at most the line in flight).

    Thread-safe: a scheduler worker logs from several job threads.
    """

    def __init__(self, stream: IO[str], worker: int, incarnation: int) -> None:
        self._stream = stream
        self._worker = worker
        self._inc = incarnation
        self._n = 0
        self._lock = threading.Lock()

    def begin(self, op: str, **fields: Any) -> Op:
        with self._lock:
            self._n += 1
            rec: Op = {"w": self._worker, "inc": self._inc, "n": self._n, "op": op, **fields}
            self._write({**rec, "ph": "b", "t": time.time()})
        return rec

    def end(self, rec: Op, outcome: str, **fields: Any) -> None:
        with self._lock:
            self._write({**rec, **fields, "ph": "e", "outcome": outcome, "t": time.time()})

    def _write(self, line: Op) -> None:
        self._stream.write(json.dumps(line, separators=(",", ":"), default=str) + "\n")
        self._stream.flush()


def write_id(op: Op) -> str:
    """The id a write stores with its row (``l`` ledger / ``r`` result, then w.inc.n), known
    from the begin line alone, so a killed write can still be matched with its row."""
    prefix = "r" if op["op"] == "result" else "l"
    return f"{prefix}{op['w']}.{op['inc']}.{op['n']}"


def read_ops(paths: Iterable[Path]) -> list[Op]:
    """Pair begin/end lines; a begin without an end (killed mid-operation) is ``unknown``."""
    begun: dict[tuple[int, int, int], Op] = {}
    ended: dict[tuple[int, int, int], Op] = {}
    for path in paths:
        try:
            f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue
        with f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except ValueError:  # a line torn by SIGKILL
                    continue
                ident = (line["w"], line["inc"], line["n"])
                (begun if line["ph"] == "b" else ended)[ident] = line
    ops: list[Op] = []
    for ident, start in begun.items():
        op = ended.get(ident)
        if op is None:
            ops.append({**start, "outcome": "unknown", "killed": True, "t0": start["t"]})
        else:
            ops.append({**op, "t0": start["t"]})
    ops.sort(key=lambda o: (o["t0"], o["w"], o["n"]))
    return ops


def read_faults(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for raw in text.splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


class Tally:
    """Running counts for the progress lines, read incrementally from the growing op logs."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self.ops = 0
        self.stale = 0

    def update(self, paths: Iterable[Path]) -> None:
        for path in paths:
            start = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1  # a partial last line is read next time
            self._offsets[path] = start + end
            for raw in chunk[:end].splitlines():
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if line.get("ph") != "e":
                    continue
                self.ops += 1
                if line.get("outcome") == "stale":
                    self.stale += 1
