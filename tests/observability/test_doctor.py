"""`tenure doctor`, run as a real child process against real servers: the shared PostgreSQL,
the fault proxy (a TCP hop that is not a pooler), Debian's PgBouncer (transaction and session
pooling, with and without admin-console rights) and a clock skewed with libfaketime."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tenure
from tenure.db import migrations
from tests.support.env import run_tenure, tenure_env
from tests.support.fix_proxy import Proxy
from tests.support.roles import app_role

FAKETIME = shutil.which("faketime")


def doctor(env: dict[str, str], *args: str, prefix: tuple[str, ...] = ()) -> tuple[int, Any]:
    if prefix:
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "tenure", "doctor", "--json", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    else:
        proc = run_tenure(["doctor", "--json", *args], env)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    return proc.returncode, report


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


@pytest.fixture
def migrated(dsn: str, schema: str) -> str:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    return schema


def test_a_healthy_setup_passes_every_check(dsn: str, migrated: str) -> None:
    code, report = doctor(tenure_env(dsn, migrated))
    found = checks(report)
    assert code == 0 and report["ok"] is True
    assert list(found) == [
        "dsn", "connect", "server", "schema", "privileges", "vacuum", "memory", "clock",
        "timeouts", "pooler",
    ]  # fmt: skip
    assert {c["status"] for c in found.values()} == {"ok"}, found
    assert found["dsn"]["details"]["source"] == "$TENURE_DSN"
    assert found["schema"]["details"]["applied"] == str(migrations.latest())
    assert "statement_timeout 5s" in found["timeouts"]["summary"]
    assert "direct connection" in found["pooler"]["summary"]
    # The text form says the same, one check per line first.
    text = run_tenure(["doctor"], tenure_env(dsn, migrated))
    assert text.returncode == 0
    assert [line.split()[:2] for line in text.stdout.splitlines() if line[:1].strip()][:10] == [
        ["ok", name] for name in found
    ]


def test_the_dsn_source_and_no_password_are_shown(dsn: str, migrated: str) -> None:
    env = tenure_env(dsn, migrated)
    del env["TENURE_DSN"]
    code, report = doctor(env, "--dsn", dsn)
    assert code == 0 and checks(report)["dsn"]["details"]["source"] == "--dsn"
    env["DATABASE_URL"] = dsn
    code, report = doctor(env)
    assert code == 0 and checks(report)["dsn"]["details"]["source"] == "$DATABASE_URL"


def test_an_unreachable_database_fails_without_leaking_the_password(schema: str) -> None:
    env = tenure_env("postgresql://postgres:s3cret@127.0.0.1:1/postgres", schema)
    proc = run_tenure(["doctor"], env)
    assert proc.returncode == 1
    assert "s3cret" not in proc.stdout + proc.stderr
    code, report = doctor(env)
    found = checks(report)
    assert code == 1 and report["ok"] is False
    assert found["dsn"]["status"] == "ok"
    assert found["dsn"]["details"]["password"] == "in the DSN (not shown)"
    assert found["connect"]["status"] == "fail" and "127.0.0.1:1" in found["connect"]["summary"]
    assert all(
        found[n]["status"] == "skip" for n in ("server", "schema", "privileges", "clock", "pooler")
    )


def test_an_unmigrated_schema_fails_with_the_fix(dsn: str, schema: str) -> None:
    code, report = doctor(tenure_env(dsn, schema))
    schema_check = checks(report)["schema"]
    assert code == 1 and schema_check["status"] == "fail"
    assert "tenure migrate" in schema_check["advice"]


def test_a_role_lacking_a_privilege_fails_and_names_it(dsn: str, migrated: str) -> None:
    """The reproduction: INSERT and UPDATE revoked on exec_slots, and doctor said "no
    failures". It now names each missing privilege, what needs it, and the fix."""
    revoke = ("REVOKE INSERT, UPDATE ON {schema}.exec_slots FROM {role}",)
    with app_role(dsn, migrated, revoke=revoke, minimal=False) as role:
        role_name = psycopg.conninfo.conninfo_to_dict(role)["user"]
        code, report = doctor(tenure_env(role, migrated))
        text = run_tenure(["doctor"], tenure_env(role, migrated))
    found = checks(report)
    assert code == 1 and report["ok"] is False
    privileges = found["privileges"]
    assert privileges["status"] == "fail", privileges
    assert f"INSERT on {migrated}.exec_slots" in privileges["summary"]
    assert role_name in privileges["summary"]
    assert "exec --slot/--every" in privileges["details"][f"{migrated}.exec_slots"]
    assert f"tenure grants --role {role_name}" in privileges["advice"]
    assert text.returncode == 1 and "no failures" not in text.stdout
    assert "FAIL privileges" in " ".join(text.stdout.split())
    # Only what is used: UPDATE on exec_slots is not needed, so it is not reported.
    assert "UPDATE on" not in privileges["summary"]


def test_a_role_with_exactly_the_printed_grants_passes(dsn: str, migrated: str) -> None:
    with app_role(dsn, migrated) as role:
        code, report = doctor(tenure_env(role, migrated))
    privileges = checks(report)["privileges"]
    assert code == 0 and privileges["status"] == "ok", privileges


def test_the_vacuum_check_says_who_removes_the_dead_rows(dsn: str, migrated: str) -> None:
    # The owner (here a superuser) may vacuum: its workers do.
    _code, report = doctor(tenure_env(dsn, migrated))
    owner = checks(report)["vacuum"]
    assert owner["status"] == "ok" and "may vacuum" in owner["summary"], owner
    assert owner["details"]["role may vacuum"] == "yes"
    # The role `tenure grants` sets up may not: fine while autovacuum runs, a warning when
    # nothing does (this server's setting decides which; both are checked by what it is).
    with psycopg.connect(dsn) as conn:
        [(autovacuum,)] = conn.execute("SHOW autovacuum").fetchall()
    with app_role(dsn, migrated) as role:
        code, report = doctor(tenure_env(role, migrated))
    app = checks(report)["vacuum"]
    assert code == 0 and app["details"]["role may vacuum"] == "no", app
    assert "may not vacuum" in app["summary"]
    if autovacuum == "on":
        assert app["status"] == "ok" and "autovacuum" in app["summary"]
    else:
        assert app["status"] == "warn" and "autovacuum is off" in app["summary"]
        assert "GRANT MAINTAIN" in app["advice"] and "docs/retention.md" in app["advice"]


def test_the_vacuum_check_skips_a_schema_without_scheduler_tables(dsn: str, schema: str) -> None:
    _code, report = doctor(tenure_env(dsn, schema))
    assert checks(report)["vacuum"]["status"] == "skip"
    assert checks(report)["memory"]["status"] == "skip"


def test_the_memory_check_warns_when_shared_buffers_cannot_hold_the_jobs_history_pages(
    dsn: str, migrated: str
) -> None:
    """32 kB per unpaused job (two job_key-led history indexes since migration 19, a leaf
    page each, twice over): a fleet of frequent jobs on a server at a default shared_buffers
    slowed down the longer it ran (bench/README.md, "Sixth pass")."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(shared,)] = conn.execute(
            "SELECT setting::bigint * 8192 FROM pg_settings WHERE name = 'shared_buffers'"
        ).fetchall()
        many = shared // (32 * 1024) + 1

        def jobs(n: int) -> None:
            table = sql.Identifier(migrated, "scheduled_jobs")
            conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(table))
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (job_key, every, timezone, ttl, misfire, on_crash, "
                    "defined_at, defined_by, next_slot) SELECT 'job-' || n, interval '1 s', "
                    "'UTC', interval '30 s', 'latest', 'retry', now(), 't', now() "
                    "FROM generate_series(1, %s) n"
                ).format(table),
                (n,),
            )

        jobs(many - 1)
        _code, report = doctor(tenure_env(dsn, migrated))
        assert checks(report)["memory"]["status"] == "ok", checks(report)["memory"]
        jobs(many)
        code, report = doctor(tenure_env(dsn, migrated))
    memory = checks(report)["memory"]
    assert code == 0 and memory["status"] == "warn", memory  # a warning, not a failure
    assert memory["details"]["scheduled jobs (unpaused)"] == str(many)
    assert "raise shared_buffers" in memory["advice"]


@pytest.mark.skipif(
    FAKETIME is None,
    reason="libfaketime is not installed (Debian package `faketime`; scripts/test installs it "
    "when it runs as root)",
)
def test_a_skewed_clock_is_only_a_warning(dsn: str, migrated: str) -> None:
    assert FAKETIME is not None
    code, report = doctor(tenure_env(dsn, migrated), prefix=(FAKETIME, "-f", "-2m"))
    clock = checks(report)["clock"]
    assert code == 0 and report["ok"] is True  # a warning does not fail the doctor
    assert clock["status"] == "warn" and "behind the database" in clock["summary"]
    assert float(clock["details"]["host_minus_database_seconds"]) == pytest.approx(-120, abs=5)
    assert "only trusts the database clock" in clock["advice"]


def test_a_tcp_proxy_is_not_taken_for_a_pooler(dsn: str, migrated: str) -> None:
    with Proxy.from_dsn(dsn) as proxy:
        code, report = doctor(tenure_env(proxy.dsn(dsn), migrated))
    pooler = checks(report)["pooler"]
    assert code == 0 and pooler["status"] == "ok", pooler
    assert "port mapping or TCP proxy" in pooler["summary"]
    assert pooler["details"]["client connected to"] != pooler["details"]["server was reached on"]


# -- PgBouncer (Debian's), in front of the shared server ---------------------------------------


def _pgbouncer_available() -> bool:
    from tests.support.servers import pgbouncer_binary

    return pgbouncer_binary() is not None


@pytest.fixture
def bouncer_factory(dsn: str) -> Iterator[Any]:
    if not _pgbouncer_available():
        pytest.skip(
            "pgbouncer is not installed (Debian package `pgbouncer`; scripts/test installs it "
            "when it runs as root)"
        )
    from psycopg.conninfo import conninfo_to_dict

    from tests.support.servers import PgBouncer

    params = conninfo_to_dict(dsn)
    if str(params.get("host", "127.0.0.1")) not in ("127.0.0.1", "localhost"):
        pytest.skip("the test database is not on 127.0.0.1, where the bouncer forwards")
    # PgBouncer only needs the server's port: a stand-in for the shared server.
    upstream: Any = types.SimpleNamespace(port=int(params.get("port") or 5432))
    started: list[Any] = []

    def start(**kwargs: Any) -> Any:
        bouncer = PgBouncer(upstream, **kwargs).start()
        started.append(bouncer)
        return bouncer

    try:
        yield start
    finally:
        for bouncer in started:
            bouncer.close()


def test_pgbouncer_in_transaction_mode_is_detected(
    dsn: str, migrated: str, bouncer_factory: Any
) -> None:
    bouncer = bouncer_factory(pool_mode="transaction")
    code, report = doctor(tenure_env(bouncer.dsn, migrated))
    pooler = checks(report)["pooler"]
    assert code == 0, report  # a warning
    assert pooler["status"] == "warn", pooler
    assert pooler["details"]["pool_mode"] == "transaction"
    assert pooler["details"]["pgbouncer"].startswith("PgBouncer ")
    assert "LISTEN/NOTIFY" in pooler["advice"] and "prepare_threshold" in pooler["advice"]


def test_pgbouncer_in_session_mode_is_fine(dsn: str, migrated: str, bouncer_factory: Any) -> None:
    bouncer = bouncer_factory(pool_mode="session")
    code, report = doctor(tenure_env(bouncer.dsn, migrated))
    pooler = checks(report)["pooler"]
    assert code == 0 and pooler["status"] == "ok", pooler
    assert pooler["details"]["pool_mode"] == "session"


def test_a_pooler_without_admin_rights_is_still_reported(
    dsn: str, migrated: str, bouncer_factory: Any
) -> None:
    bouncer = bouncer_factory(pool_mode="transaction", extra={"admin_users": "nobody"})
    code, report = doctor(tenure_env(bouncer.dsn, migrated))
    pooler = checks(report)["pooler"]
    assert code == 0 and pooler["status"] == "warn", pooler
    assert "probably PgBouncer" in pooler["summary"] and "pool mode is unknown" in pooler["summary"]
    assert "not reachable for this user" in pooler["details"]["admin console"]


def test_through_a_proxy_the_server_check_names_the_member_that_answered(
    dsn: str, migrated: str
) -> None:
    # As behind HAProxy or a multi-host DSN (issue 30): doctor says which server answered,
    # not the endpoint it was given, and the WAL timeline tokens are floored on.
    proxy = Proxy.from_dsn(dsn)
    proxy.start()
    try:
        code, report = doctor(tenure_env(proxy.dsn(dsn), migrated))
    finally:
        proxy.stop()
    server = checks(report)["server"]
    assert code == 0 and server["status"] == "ok", server
    with psycopg.connect(dsn) as conn:
        [(address, port, timeline)] = conn.execute(
            "SELECT host(inet_server_addr()), inet_server_port(),"
            " ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
        ).fetchall()
    member = f"{address}:{port}" if address is not None else f"socket, port {port}"
    assert server["details"]["answered_by"] == member != f"127.0.0.1:{proxy.port}"
    assert server["details"]["timeline"] == str(timeline)
    assert f"timeline {timeline}, answered by {member}" in server["summary"]
