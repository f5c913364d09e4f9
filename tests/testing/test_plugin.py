"""tenure.testing, the pytest plugin users load (issue 26): its fixtures and helpers, in this
suite (the plugin is loaded here by its entry point, beside tests/conftest.py's fixtures)
and in examples/testing, run as a user's own suite would run it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import tenure
from tenure.testing import LeaseHelpers

ROOT = Path(__file__).resolve().parents[2]


def process_state(pid: int) -> str:
    # /proc/PID/stat: "pid (comm) STATE ..."; comm may hold spaces, so split after ')'.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_plugin_is_registered_by_its_entry_point() -> None:
    points = importlib.metadata.entry_points(group="pytest11")
    assert [p.value for p in points if p.name == "tenure"] == ["tenure.testing.plugin"]


def test_the_fixtures_give_a_migrated_throwaway_schema(
    tenure_dsn: str, tenure_schema: str, tenure_client: tenure.Client, schema: str
) -> None:
    assert tenure_schema != schema  # the suite's own fixture and the plugin's side by side
    assert tenure_client.schema == tenure_schema
    assert tenure_client.acquire("job", ttl="30s") is not None
    with psycopg.connect(tenure_dsn) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = 'job_leases'",
            [tenure_schema],
        ).fetchone()
    assert tables == (1,)


def test_expire_ends_a_live_lease_now_and_take_over_writes_with_a_newer_token(
    tenure_client: tenure.Client, tenure_leases: LeaseHelpers
) -> None:
    assert tenure_leases.expire("job") is None  # no lease yet
    mine = tenure_client.acquire("job", ttl="5m")
    assert mine is not None
    assert tenure_client.acquire("job", ttl="5m") is None  # live: busy
    successor = tenure_leases.take_over("job", {"by": "successor"})
    assert successor.token == mine.token + 1
    with pytest.raises(tenure.StaleTokenError):
        tenure_client.results.put("job", {"by": "me"}, token=mine.token)
    stored = tenure_client.results.get("job")
    assert stored is not None and (stored.payload, stored.token) == (
        {"by": "successor"},
        successor.token,
    )


def test_a_holder_is_a_real_process_that_sigstop_pauses(
    tenure_client: tenure.Client, tenure_leases: LeaseHelpers
) -> None:
    holder = tenure_leases.holder("job", target="tests.testing.jobs:put_result")
    assert holder.pid != os.getpid()
    info = tenure_client.inspect("job")
    assert info is not None and info.token == holder.token
    holder.pause()
    assert process_state(holder.pid) == "T"  # stopped by the kernel, not by a flag
    successor = tenure_leases.take_over("job", {"by": "successor"})
    outcome = holder.run()  # resumes it: its put with the old token is refused
    assert outcome.refused and outcome.error == "StaleTokenError", outcome
    stored = tenure_client.results.get("job")
    assert stored is not None and stored.token == successor.token
    # Without a successor a holder's job commits: refused above because of the takeover.
    other = tenure_leases.holder("other", target="tests.testing.jobs:put_result")
    assert other.run() == tenure.testing.Outcome(None, "", repr(other.token))


def test_a_second_holder_of_a_live_lease_is_refused(tenure_leases: LeaseHelpers) -> None:
    first = tenure_leases.holder("job")
    with pytest.raises(tenure.LeaseBusy, match=f"token {first.token}, expires"):
        tenure_leases.holder("job")


def test_the_example_suite_passes_as_a_users_suite(dsn: str) -> None:
    # examples/testing is what docs/testing.md shows; run as its own pytest session, with
    # the plugin loaded by its entry point and no fixture of this suite's conftest.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/testing"],
        cwd=ROOT,
        env={**os.environ, "TENURE_TEST_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("2 passed"), done.stdout
