"""One vocabulary of job states: `tenure jobs list` and the dashboard name a job's state the
same way, by the same rule (scheduler.jobs.job_state)."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from tenure.scheduler.jobs import JobStatus

T0 = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)


def listed(*, quarantined: bool, paused: bool, running: bool, failed: bool) -> str:
    return JobStatus(
        "k",
        "every 10s",
        dt.timedelta(seconds=30),
        "latest",
        None,
        "retry",
        1,
        T0,
        "test",
        paused,
        T0,
        T0 if running else None,
        7 if running else None,
        False,
        7,
        None,
        False,
        "failed" if failed else "succeeded",
        T0,
        T0,
        T0,
        quarantined="crashed 3 times" if quarantined else None,
    ).state


def shown(*, quarantined: bool, paused: bool, running: bool, failed: bool) -> str:
    from tenure.ui.data import JobRow

    return JobRow(
        "k",
        "every 10s",
        "UTC",
        paused,
        T0,
        running,
        False,
        7,
        None,
        False,
        "failed" if failed else "succeeded",
        T0,
        7,
        T0,
        quarantined,
    ).state


@pytest.mark.parametrize(
    ("quarantined", "paused", "running", "failed"), list(itertools.product((False, True), repeat=4))
)
def test_the_list_and_the_dashboard_name_a_state_alike(
    quarantined: bool, paused: bool, running: bool, failed: bool
) -> None:
    facts = {"quarantined": quarantined, "paused": paused, "running": running, "failed": failed}
    assert listed(**facts) == shown(**facts)


def test_the_states_and_their_precedence() -> None:
    from tenure.scheduler.jobs import JOB_STATES
    from tenure.ui.data import JOB_STATES as FILTERS

    assert JOB_STATES == ("quarantined", "paused", "running", "failing", "idle")
    assert set(FILTERS) == {"all", *JOB_STATES}
    every = {"quarantined": True, "paused": True, "running": True, "failed": True}
    assert listed(**every) == "quarantined"
    assert listed(**{**every, "quarantined": False}) == "paused"
    assert listed(quarantined=False, paused=False, running=True, failed=True) == "running"
    assert listed(quarantined=False, paused=False, running=False, failed=True) == "failing"
    assert listed(quarantined=False, paused=False, running=False, failed=False) == "idle"
