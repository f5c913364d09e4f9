"""An open page of a `tenure exec` key refreshes live: exec_runs changes are announced on
the dashboard's channel (migration 16), as job_runs' are (migration 6)."""

from __future__ import annotations

import json

import psycopg

import tenure
from tenure.db.channels import channel
from tests.support.env import run_tenure, tenure_env


def test_an_exec_run_notifies_the_dashboards_channel(dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(
            psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel("ui", schema)))
        )
        done = run_tenure(["exec", "--key", "backup", "--", "true"], tenure_env(dsn, schema))
        assert done.returncode == 0, done.stderr
        keys = [json.loads(n.payload) for n in listener.notifies(timeout=10, stop_after=2)]
    # One at the run's start (its row inserted), one at its end (updated).
    assert keys == [["backup"], ["backup"]], keys
