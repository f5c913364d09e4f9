"""The `tenure` command, run as a real child process."""

from __future__ import annotations

import json

import pytest

import tenure
from tests.support.env import run_tenure, tenure_env


def test_help_teaches_and_shows_env_twins(dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    top = run_tenure(["--help"], env)
    assert top.returncode == 0
    assert "tenure demo" in top.stdout and "fencing" in top.stdout
    for command in (["demo"], ["migrate"], ["status"], ["release"], ["result", "put"]):
        out = run_tenure([*command, "--help"], env)
        assert out.returncode == 0, out.stderr
        assert "TENURE_DSN" in out.stdout and "TENURE_SCHEMA" in out.stdout, command


def test_migrate_then_status_json(dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    first = run_tenure(["migrate"], env)
    assert first.returncode == 0 and "applied 1" in first.stdout, first
    again = run_tenure(["migrate"], env)
    assert again.returncode == 0 and "up to date" in again.stdout
    with tenure.connect(dsn, schema=schema) as client:
        lease = client.acquire("nightly", ttl=60)
        assert lease is not None
        client.results.put("nightly", {"rows": 3}, token=lease.token)
    status = run_tenure(["status", "--json"], env)
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)
    assert [(r["job"], r["token"], r["held"], r["result_token"]) for r in rows] == [
        ("nightly", 1, True, 1)
    ]
    assert 0 < rows[0]["seconds_left"] <= 60
    table = run_tenure(["status"], env)
    assert table.returncode == 0 and "nightly" in table.stdout


def test_result_put_get_and_stale_rejection(client: tenure.Client, dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    old = client.acquire("job", ttl=0.1)
    assert old is not None
    import time

    time.sleep(0.15)
    new = client.acquire("job", ttl=30)
    assert new is not None
    ok = run_tenure(
        ["result", "put", "--key", "job", "--token", str(new.token)], env, input='{"by": "new"}'
    )
    assert ok.returncode == 0, ok.stderr
    stale = run_tenure(
        ["result", "put", "--key", "job"],
        {**env, "TENURE_FENCING_TOKEN": str(old.token)},
        input='{"by": "old"}',
    )
    assert stale.returncode == 1
    assert "stale fencing token" in stale.stderr
    assert f"token {old.token} rejected" in stale.stderr and f"token {new.token}" in stale.stderr
    assert "Traceback" not in stale.stderr
    got = run_tenure(["result", "get", "--key", "job"], env)
    assert json.loads(got.stdout)["payload"] == {"by": "new"}


def test_release_expires_a_stuck_lease(client: tenure.Client, dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    lease = client.acquire("stuck", ttl=3600)
    assert lease is not None
    out = run_tenure(["release", "--key", "stuck"], env)
    assert out.returncode == 0 and f"expired token {lease.token}" in out.stdout
    nxt = client.acquire("stuck", ttl=30)
    assert nxt is not None and nxt.token == lease.token + 1
    with pytest.raises(tenure.LeaseLost):
        lease.renew()


@pytest.mark.parametrize(
    "args",
    [["release"], ["jobs", "pause"], ["jobs", "resume"], ["jobs", "trigger"], ["jobs", "history"]],
)
def test_commands_inside_exec_do_not_default_to_the_execs_own_key(
    client: tenure.Client, dsn: str, schema: str, args: list[str]
) -> None:
    """`tenure exec` hands its command TENURE_JOB_KEY for `tenure result put`. A script that
    calls one of these without naming a key must be told so, not act on the lease (or job)
    it is running under: `tenure release` would expire the exec's own lease."""
    lease = client.acquire("running-under-exec", ttl=3600)
    assert lease is not None
    env = tenure_env(dsn, schema, TENURE_JOB_KEY="running-under-exec")
    out = run_tenure(args, env)
    assert out.returncode == 2, out
    assert "Missing" in out.stderr and "KEY" in out.stderr.upper()
    lease.renew()  # still held: nothing was released


@pytest.mark.parametrize(
    ("args", "stdin", "message", "code"),
    [
        # Bad option values are usage errors: exit 2.
        (["demo", "--ttl", "soon"], None, "not a duration", 2),
        (["demo", "--ttl", "0"], None, "out of range", 2),
        (["result", "put", "--key", "job", "--token", "1"], "not json", "not a JSON document", 2),
        (["result", "put", "--key", "", "--token", "1"], "{}", "non-empty", 2),
        (["result", "get", "--key", "missing"], None, "no result stored", 1),
    ],
)
def test_bad_input_is_one_line(
    client: tenure.Client,
    dsn: str,
    schema: str,
    args: list[str],
    stdin: str | None,
    message: str,
    code: int,
) -> None:
    out = run_tenure(args, tenure_env(dsn, schema), input=stdin)
    assert out.returncode == code, out
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_unreachable_database_is_one_clear_line(schema: str) -> None:
    env = tenure_env("postgresql://postgres:s3cret@127.0.0.1:1/postgres", schema)
    out = run_tenure(["status"], env)
    assert out.returncode == 1
    assert "127.0.0.1:1" in out.stderr and "s3cret" not in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


MISSING_DB = "postgresql://postgres@127.0.0.1:5432/tenure_no_such_database"
NO_SERVER = "postgresql://postgres@127.0.0.1:1/postgres"


@pytest.mark.parametrize("given", ["--dsn", "$TENURE_DSN", "$DATABASE_URL"])
@pytest.mark.parametrize("target", ["missing-database", "no-server"])
def test_connection_error_names_where_the_dsn_came_from_and_what_failed(
    schema: str, given: str, target: str
) -> None:
    """Issue 31: a DSN given with --dsn was answered with "check ... the DSN ($TENURE_DSN)",
    and a missing database with "check that the server is running and reachable". The line
    names the DSN's origin, and says whether the server refused the connection (it answered:
    check the database, user and password) or could not be reached."""
    target_dsn = MISSING_DB if target == "missing-database" else NO_SERVER
    env = tenure_env("", schema)
    env.pop("TENURE_DSN")
    args = ["status"]
    if given == "--dsn":
        args += ["--dsn", target_dsn]
    else:
        env[given[1:]] = target_dsn
    out = run_tenure(args, env)
    assert out.returncode == 1, out
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out
    line = out.stderr.strip()
    assert given in line, line
    for other in {"--dsn", "$TENURE_DSN", "$DATABASE_URL"} - {given}:
        assert other not in line, line
    if target == "missing-database":
        assert "refused the connection" in line and "database name" in line, line
        assert "is running" not in line, line
    else:
        assert "could not reach PostgreSQL" in line and "is running" in line, line


def test_unknown_option_is_a_usage_error(dsn: str, schema: str) -> None:
    out = run_tenure(["status", "--frobnicate"], tenure_env(dsn, schema))
    assert out.returncode == 2 and "No such option" in out.stderr


def test_demo_runs_the_seed_scenario(dsn: str, schema: str) -> None:
    out = run_tenure(["demo"], tenure_env(dsn, schema), timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any("acquired" in line and "fencing token" in line for line in lines)
    assert any("SIGSTOP" in line for line in lines)
    assert any("rejected" in line and "StaleTokenError" in line for line in lines)
    assert lines[-1].startswith("verdict: PASS")
    with tenure.connect(dsn, schema=schema) as client:
        stored = client.results.get("demo:nightly-report")
        info = client.inspect("demo:nightly-report")
    assert stored is not None and stored.payload["by"] == "B"
    assert info is not None and stored.token == info.token


def test_every_option_has_a_tenure_env_twin_shown_in_help() -> None:
    import click

    from tenure.cli.main import cli

    missing: list[str] = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")
        for param in command.params:
            if not isinstance(param, click.Option) or param.name in ("help", "version"):
                continue
            envvar = param.envvar if isinstance(param.envvar, str) else None
            if not envvar or not envvar.startswith("TENURE_") or not param.show_envvar:
                missing.append(f"{path} {'/'.join(param.opts)}")

    walk(cli, "tenure")
    assert missing == []
