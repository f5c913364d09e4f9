"""No command prints a password: a sentinel password goes through every command that takes
--dsn, in every way connecting can fail, and never shows up on stdout or stderr (debug logs
and --json included).

The machine's server trusts every login, so the wrong-password case runs against a
throwaway server (tests/support/servers.py) that asks role ``app`` for a SCRAM password.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli_commands import leaf_commands, with_options
from tests.support.servers import PgServer, ServerError, _run_as

SENTINEL = f"S3ntinel{uuid.uuid4().hex[:10]}"

APP = """
import tenure

app = tenure.Scheduler()


@app.job("tick", every="1h")
def tick(ctx):
    pass
"""


def _dsn_commands() -> list[list[str]]:
    """Every command line (``{dsn}`` for the DSN) of a command whose options include --dsn;
    with --json too where it has one. Debug logs on: they must not leak either."""
    found: list[list[str]] = []
    for path, command in leaf_commands():
        names = {p.name for p in command.params}
        if "dsn" not in names:
            continue
        found.append(with_options(path, "--log-level", "debug", "--dsn", "{dsn}"))
        if "as_json" in names:
            found.append(with_options(path, "--json", "--log-level", "debug", "--dsn", "{dsn}"))
    return found


COMMANDS = _dsn_commands()


def test_every_dsn_command_is_covered() -> None:
    names = {" ".join(c[:2]) if c[0] in ("jobs", "outbox", "result") else c[0] for c in COMMANDS}
    assert {"status", "doctor", "exec", "worker", "relay", "jobs list", "outbox list"} <= names


@pytest.fixture(scope="module")
def auth_server() -> Iterator[PgServer]:
    """A throwaway server where role ``app`` must give its SCRAM password over TCP."""
    try:
        server = PgServer(name="auth", settings={"password_encryption": "scram-sha-256"})
    except ServerError as exc:
        pytest.skip(str(exc))
    hba = server.datadir / "pg_hba.conf"
    hba.write_text(
        "local all all trust\n"
        "host all postgres 127.0.0.1/32 trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
    )
    user = _run_as()
    if user is not None:
        os.chown(hba, user.pw_uid, user.pw_gid)
    with server:
        server.execute("CREATE ROLE app LOGIN PASSWORD 'the-right-one'")
        yield server


def _modes(auth_server: PgServer, tmp_path: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """How connecting fails: (DSN, extra environment)."""
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{auth_server.port}:*:app:{SENTINEL}\n")
    pgpass.chmod(0o600)
    return {
        "unparseable": (f"postgresql://postgres:{SENTINEL}@[::1:5432/db", {}),
        "bad percent escape": (f"postgresql://postgres:{SENTINEL}%ZZ@127.0.0.1:5432/db", {}),
        "key=value unparseable": (f"host=127.0.0.1 password='{SENTINEL} dbname=x", {}),
        "wrong password": (
            f"postgresql://app:{SENTINEL}@127.0.0.1:{auth_server.port}/postgres",
            {},
        ),
        "wrong password in key=value": (
            f"host=127.0.0.1 port={auth_server.port} user=app password={SENTINEL} dbname=postgres",
            {},
        ),
        "wrong .pgpass": (
            f"postgresql://app@127.0.0.1:{auth_server.port}/postgres",
            {"PGPASSFILE": str(pgpass)},
        ),
        "unreachable": (f"postgresql://app:{SENTINEL}@127.0.0.1:1/postgres?connect_timeout=3", {}),
        "missing database": (
            f"postgresql://postgres:{SENTINEL}@127.0.0.1:5432/no_such_db_{uuid.uuid4().hex[:6]}",
            {},
        ),
    }


@pytest.mark.parametrize("mode_index", range(8))
def test_no_command_prints_the_password(
    auth_server: PgServer, tmp_path: Path, schema: str, mode_index: int
) -> None:
    mode, (dsn, extra) = list(_modes(auth_server, tmp_path).items())[mode_index]
    (tmp_path / "secret_app.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PG"))}
    env.pop("DATABASE_URL", None)
    env.update(extra, TENURE_SCHEMA=schema)
    leaks: list[str] = []
    silent: list[str] = []

    def run(template: list[str]) -> subprocess.CompletedProcess[str]:
        args = [dsn if a == "{dsn}" else a for a in template]
        return subprocess.run(
            [sys.executable, "-m", "tenure", *args],
            env=env,
            cwd=tmp_path,
            input="{}",
            capture_output=True,
            text=True,
            timeout=60,
        )

    # The commands are independent processes: run a few at once (the test starts ~200).
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(run, COMMANDS))
    for template, proc in zip(COMMANDS, done, strict=True):
        shown = proc.stdout + proc.stderr
        name = " ".join(template)
        if SENTINEL in shown:
            leaks.append(f"{mode}: tenure {name}: {shown.strip()[-300:]}")
        if proc.returncode == 0 or not shown.strip():
            silent.append(f"{mode}: tenure {name} exited {proc.returncode}: {shown[-200:]}")
    assert leaks == []
    # The failure is still reported (every command fails, with something on stderr).
    assert silent == []
