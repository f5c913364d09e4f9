"""One rule for a command that names something that is not there (issue 31): a key or a message
id given explicitly that matches nothing is a runtime error, exit 1 with one line; a filter
that matches nothing (--all, --topic) and a named thing with nothing left to do (a lease
already expired, a job with no runs yet) are not errors."""

from __future__ import annotations

import json

import pytest

import tenure
from tests.support.env import run_tenure, tenure_env


def _job(ctx: object) -> None:  # registered, never run here
    return None


@pytest.fixture
def env(client: tenure.Client, dsn: str, schema: str) -> dict[str, str]:
    """A schema with a registered job 'known' (no runs) and a lease 'expired' that has run
    out."""
    app = tenure.Scheduler(dsn, schema=schema)
    app.job("known", cron="0 3 * * *")(_job)
    app.register()
    lease = client.acquire("expired", ttl=60)
    assert lease is not None
    client.release("expired")
    return tenure_env(dsn, schema)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["outbox", "retry", "--id", "999999"], "999999"),
        (["release", "--key", "never-existed"], "never-existed"),
        (["jobs", "history", "nope"], "no scheduled job 'nope'"),
        (["jobs", "pause", "nope"], "no scheduled job 'nope'"),
        (["jobs", "resume", "nope"], "no scheduled job 'nope'"),
        (["jobs", "trigger", "nope"], "no scheduled job 'nope'"),
        (["result", "get", "--key", "nope"], "nope"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_a_named_thing_that_is_not_there_exits_1_with_one_line(
    env: dict[str, str], args: list[str], says: str
) -> None:
    """Before the fix outbox retry --id, release --key and jobs history exited 0."""
    out = run_tenure(args, env)
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tenure: error: "), out.stderr
    assert says in lines[0], lines
    assert out.stdout == "", out.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["outbox", "retry", "--all"], "no dead message"),
        (["outbox", "retry", "--topic", "t"], "no dead message"),
        (["release", "--key", "expired"], "no live lease"),
        (["jobs", "history", "known"], "no runs recorded"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_a_filter_matching_nothing_or_nothing_left_to_do_exits_0(
    env: dict[str, str], args: list[str], says: str
) -> None:
    out = run_tenure(args, env)
    assert out.returncode == 0, out
    assert says in out.stdout and out.stderr == "", out


def test_history_json_of_a_job_without_runs_is_an_empty_list(env: dict[str, str]) -> None:
    """One document, as every other --json prints (issue 31: JSON Lines printed nothing)."""
    out = run_tenure(["jobs", "history", "known", "--json"], env)
    assert out.returncode == 0, out
    assert json.loads(out.stdout) == []
