"""Log lines where teams look: a failed job body at ERROR with its traceback and fields (what
Sentry's logging integration turns into an event), JSON lines with RFC 3339 times and every
structured field (issue 29)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re

import pytest

import tenure
from tenure.cli import logs
from tenure.db.channels import channel
from tenure.scheduler import jobs as ops
from tests.support.scheduler_apps import NEVER
from tests.support.scheduler_support import InProcessWorker, prepare, wait_for


def test_a_failed_job_body_is_logged_at_error_with_its_traceback_and_fields(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    prepare(dsn, schema)
    app = tenure.Scheduler(dsn, schema=schema)

    @app.job("billing/close", cron=NEVER)
    def close(ctx: tenure.JobContext) -> None:
        raise RuntimeError("ledger is locked")

    caplog.set_level(logging.INFO, logger="tenure")
    with tenure.connect(dsn, schema=schema) as client, InProcessWorker(app):
        ops.trigger(client, "billing/close", channel=channel("jobs", schema))
        wait_for(
            lambda: any("ledger is locked" in r.getMessage() for r in caplog.records),
            timeout=15,
            what="the failure's log line",
        )
    [record] = [r for r in caplog.records if "ledger is locked" in r.getMessage()]
    assert record.levelno == logging.ERROR, record.levelname
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert record.__dict__["job"] == "billing/close"
    assert isinstance(record.__dict__["token"], int)
    assert record.__dict__["slot"]


def test_json_lines_carry_rfc3339_milliseconds_and_every_structured_field() -> None:
    record = logging.LogRecord(
        "tenure.scheduler", logging.WARNING, __file__, 1, "run %s late", ("r1",), None
    )
    record.created = dt.datetime(2026, 12, 4, 3, 4, 5, 678_900, tzinfo=dt.UTC).timestamp()
    record.msecs = 678.9
    for name, value in {
        "job": "billing/close",
        "token": 7,
        "owner": "0d6f...",
        "lateness": 0.25,
        "worker": "w-1",
        "app": "billing",
    }.items():
        setattr(record, name, value)
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["time"] == "2026-12-04T03:04:05.678Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)", line["time"])
    assert line["message"] == "run r1 late" and line["level"] == "warning"
    for name in ("job", "token", "owner", "lateness", "worker", "app"):
        assert name in line, name
    assert line["token"] == 7 and line["lateness"] == 0.25
    # The record's own bookkeeping is not a field.
    for internal in ("msecs", "args", "levelno", "pathname", "created", "msg"):
        assert internal not in line


def test_an_unconfigured_program_still_sees_tenures_warnings() -> None:
    # As under uvicorn or gunicorn, which configure only their own loggers.
    import subprocess
    import sys

    code = (
        "import logging, tenure\n"
        "logging.getLogger('uvicorn.error').addHandler(logging.StreamHandler())\n"
        "logging.getLogger('tenure.scheduler').warning('lease of %s lost', 'billing/close')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "lease of billing/close lost" in out.stderr


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_psycopg_pool_lines_go_through_tenures_handler_and_format(fmt: str) -> None:
    """Issue 31: psycopg_pool's own warnings (a reconnection failing while the server
    restarts) came out through Python's last-resort handler, unformatted, beside tenure's
    lines, also under --log-format json. A real pool, connecting to a closed port."""
    import subprocess
    import sys

    code = (
        "import time\n"
        "from psycopg_pool import ConnectionPool\n"
        "from tenure.cli import logs\n"
        f"logs.setup('warning', {fmt!r})\n"
        "pool = ConnectionPool('postgresql://postgres:s3cret@127.0.0.1:1/x', min_size=1,\n"
        "                      open=False, name='tenure-test')\n"
        "pool.open(wait=False)\n"
        "deadline = time.monotonic() + 30\n"
        "while not pool.get_stats().get('connections_errors'):\n"
        "    assert time.monotonic() < deadline\n"
        "    time.sleep(0.05)\n"
        "pool.close(timeout=0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert any("tenure-test" in line for line in lines), out.stderr
    for line in lines:
        if fmt == "json":
            record = json.loads(line)  # every line is one of tenure's JSON records
            assert record["logger"].startswith("psycopg"), record
        else:
            assert re.match(r"\d{4}-\d\d-\d\d[ T].* WARNING psycopg\.pool: ", line), line
    assert "s3cret" not in out.stderr
