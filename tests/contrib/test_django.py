"""tenure.contrib.django on the real PostgreSQL: fence and outbox inside atomic(), system
checks, tenure_exec, and two `manage.py tenure_worker` processes running each slot once."""

from __future__ import annotations

import io
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("django")

import tenure

from ..support.examples import (
    EXAMPLES,
    assert_each_slot_once,
    example_env,
    python,
    recorded_slots,
    start,
    stop,
)

PROJECT = EXAMPLES / "django"
MANAGE = str(PROJECT / "manage.py")


@pytest.fixture(scope="module")
def django_schema(dsn: str) -> Iterator[str]:
    """Django set up in this process on a schema of its own (Django is set up once per
    process; its settings are read then)."""
    import django
    from django.conf import settings

    name = f"t_dj_{uuid.uuid4().hex[:10]}"
    if not settings.configured:
        saved = dict(os.environ)
        os.environ.update(
            TENURE_DSN=dsn,
            TENURE_SCHEMA=name,
            DJANGO_SEARCH_PATH=name,
            DJANGO_SETTINGS_MODULE="tests.contrib.django_settings",
        )
        try:
            django.setup()
        finally:
            os.environ.clear()
            os.environ.update(saved)
    else:
        name = settings.TENURE["SCHEMA"]
    from django.core.management import call_command

    call_command("tenure_migrate", stdout=io.StringIO())
    call_command("migrate", verbosity=0)
    yield name
    from django.db import connections

    connections.close_all()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def tenure_client(dsn: str, django_schema: str) -> Iterator[tenure.Client]:
    with tenure.connect(dsn, schema=django_schema) as client:
        yield client


def stale_and_current(client: tenure.Client, key: str) -> tuple[int, int]:
    old = client.acquire(key)
    assert old is not None
    client.release(key)
    new = client.acquire(key)
    assert new is not None
    return old.token, new.token


def invoice_numbers() -> list[str]:
    from invoices.models import Invoice  # type: ignore[import-not-found]

    return sorted(Invoice.objects.values_list("number", flat=True))


def new_invoice(number: str) -> Any:
    import datetime as dt

    from invoices.models import Invoice

    return Invoice.objects.create(number=number, slot=dt.datetime.now(dt.UTC), token=0, pid=0)


def outbox_keys(client: tenure.Client) -> list[str]:
    return sorted(m.key for m in tenure.outbox.messages(client, state="all"))


def test_fence_in_atomic_commits_with_current_and_rolls_back_with_stale_token(
    tenure_client: tenure.Client,
) -> None:
    from django.db import transaction

    from tenure.contrib.django import fence, outbox_enqueue

    stale, current = stale_and_current(tenure_client, "dj-fence")
    with transaction.atomic():
        new_invoice("D-1")
        outbox_enqueue("invoices", "D-1", {"n": 1})
        fence("dj-fence", current)
    with pytest.raises(tenure.StaleTokenError), transaction.atomic():
        new_invoice("D-2")
        outbox_enqueue("invoices", "D-2", {"n": 2})
        fence("dj-fence", stale)
    assert [n for n in invoice_numbers() if n.startswith("D-")] == ["D-1"]
    assert [k for k in outbox_keys(tenure_client) if k.startswith("D-")] == ["D-1"]


def test_fence_outside_atomic_is_refused(tenure_client: tenure.Client) -> None:
    from tenure.contrib.django import fence

    with pytest.raises(tenure.InvalidArgument, match=r"transaction.atomic\(using='default'\)"):
        fence("dj-outside", 1)


def test_non_postgresql_alias_is_a_configuration_error(django_schema: str) -> None:
    from django.db import transaction

    from tenure.contrib.django import fence

    with pytest.raises(tenure.ConfigurationError, match="sqlite"), transaction.atomic("other"):
        fence("dj-sqlite", 1, using="other")


def test_system_checks(django_schema: str) -> None:
    from django.test import override_settings

    from tenure.contrib.django.checks import check_backend, check_schema

    assert check_backend() == []
    assert check_schema(databases=["default"]) == []
    with override_settings(TENURE={"SCHEMA": f"{django_schema}_missing"}):
        (warning,) = check_schema(databases=["default"])
        assert warning.id == "tenure.W001" and "tenure_migrate" in warning.hint
    with override_settings(TENURE={"DATABASE": "other"}):
        (error,) = check_backend()
        assert error.id == "tenure.E001"
    with override_settings(TENURE={"DATABSE": "default"}):
        (error,) = check_backend()
        assert "unknown keys" in error.msg


def test_conninfo_comes_from_databases(dsn: str, django_schema: str) -> None:
    from tenure.contrib.django import conninfo

    info = psycopg.conninfo.conninfo_to_dict(conninfo())
    assert info["options"] == f"-c search_path={django_schema}"
    assert info["dbname"] == psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]


def test_tenure_exec_runs_a_command_once_per_slot(
    tenure_client: tenure.Client, django_schema: str
) -> None:
    from django.core.management import CommandError, call_command

    def run(*args: str) -> str:
        err = io.StringIO()
        call_command("tenure_exec", *args, stdout=io.StringIO(), stderr=err)
        return err.getvalue()

    assert "ran with token 1" in run("--key", "dj-exec", "--every", "1h", "--", "check")
    assert "already done" in run("--key", "dj-exec", "--every", "1h", "--", "check")
    with pytest.raises(CommandError, match="whole number of seconds"):
        run("--key", "dj-exec", "--every", "1.5s", "--", "check")
    with pytest.raises(CommandError, match="unknown management command"):
        run("--key", "dj-exec", "--", "nosuchcommand")


@pytest.mark.slow
def test_two_tenure_worker_processes_run_each_slot_once(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    env = example_env(dsn, schema, DJANGO_SEARCH_PATH=schema)
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(*args: str) -> None:
        subprocess.run(python(MANAGE, *args), env=env, cwd=PROJECT, check=True, timeout=60)

    manage("tenure_migrate")
    manage("migrate", "-v0")
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    workers = [start(python(MANAGE, "tenure_worker"), env, log, cwd=PROJECT) for log in logs]
    try:
        deadline = time.monotonic() + 60
        while not all("started" in log.read_text() for log in logs):
            assert all(w.poll() is None for w in workers), [log.read_text() for log in logs]
            assert time.monotonic() < deadline, [log.read_text() for log in logs]
            time.sleep(0.2)
        time.sleep(6)
    finally:
        codes = [stop(w) for w in workers]
    assert codes == [0, 0], [log.read_text() for log in logs]
    assert all("stopped" in log.read_text() for log in logs)
    assert_each_slot_once(recorded_slots(dsn, schema, "invoices_invoice"), at_least=5)
    with tenure.connect(dsn, schema=schema) as client:
        assert len(tenure.outbox.messages(client, state="all", limit=1000)) == len(
            recorded_slots(dsn, schema, "invoices_invoice")
        )
