"""Metrics of short-lived commands (``tenure exec``) for node_exporter's textfile collector.

A process that ends before anything scrapes it cannot serve ``/metrics``, and per-run
counters written to a file would reset on every run (``increase()`` would see nothing).
So a run writes *gauges about the last run* of its job, which alerting can use directly:
``time() - tenure_exec_last_success_timestamp_seconds > 3 * interval`` for "no successful
run for three slots". The file is replaced atomically (write, then rename), as the
collector requires. Timestamps are this host's wall clock: they are for monitoring only and
decide nothing about leases.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from pathlib import Path

#: Outcomes ``tenure exec`` reports (metrics.JOB events).
OUTCOMES = (
    "succeeded",
    "failed",
    "lease_lost",
    "already_done",
    "not_started",
    "busy",
    "slot_unrecorded",
    "error",
)

#: The job key's label is ``job_key``: node_exporter's scrape sets ``job``, which would
#: overwrite it. ``job`` is still read back from a file an older tenure wrote, so that the
#: first run after the upgrade keeps the last success.
_LAST_SUCCESS = re.compile(
    r"^tenure_exec_last_success_timestamp_seconds"
    r'\{(?:job_key|job)="(?P<job>(?:[^"\\]|\\.)*)"\} (?P<v>\S+)$'
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _previous_success(path: Path, job: str) -> float | None:
    try:
        text = path.read_text("utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        m = _LAST_SUCCESS.match(line)
        if m and m.group("job") == _label(job):
            try:
                return float(m.group("v"))
            except ValueError:
                return None
    return None


def write_last_run(
    path: str | os.PathLike[str],
    job: str,
    outcome: str,
    exit_code: int,
    duration: float | None,
    token: int | None = None,
) -> None:
    """Replace ``path`` with the gauges of this run of ``job`` (keeping its last success)."""
    target = Path(path)
    now = time.time()
    last_success = now if outcome == "succeeded" else _previous_success(target, job)
    j = f'job_key="{_label(job)}"'
    lines = [
        "# HELP tenure_exec_last_run_timestamp_seconds When the last tenure exec run of the job"
        " ended (host clock).",
        "# TYPE tenure_exec_last_run_timestamp_seconds gauge",
        f"tenure_exec_last_run_timestamp_seconds{{{j}}} {now:.3f}",
        "# HELP tenure_exec_last_run_duration_seconds How long the last run's command ran.",
        "# TYPE tenure_exec_last_run_duration_seconds gauge",
        f"tenure_exec_last_run_duration_seconds{{{j}}} {duration or 0.0:.6f}",
        "# HELP tenure_exec_last_run_exit_code tenure exec's exit code for the last run.",
        "# TYPE tenure_exec_last_run_exit_code gauge",
        f"tenure_exec_last_run_exit_code{{{j}}} {exit_code}",
        "# HELP tenure_exec_last_run_outcome 1 for the last run's outcome, 0 for the others.",
        "# TYPE tenure_exec_last_run_outcome gauge",
        *(
            f'tenure_exec_last_run_outcome{{{j},outcome="{o}"}} {1 if o == outcome else 0}'
            for o in OUTCOMES
        ),
    ]
    if token is not None:
        lines += [
            "# HELP tenure_exec_last_run_token Fencing token of the last run that took the lease.",
            "# TYPE tenure_exec_last_run_token gauge",
            f"tenure_exec_last_run_token{{{j}}} {token}",
        ]
    if last_success is not None:
        lines += [
            "# HELP tenure_exec_last_success_timestamp_seconds When the job last succeeded.",
            "# TYPE tenure_exec_last_success_timestamp_seconds gauge",
            f"tenure_exec_last_success_timestamp_seconds{{{j}}} {last_success:.3f}",
        ]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
