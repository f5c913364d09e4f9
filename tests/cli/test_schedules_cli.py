"""`tenure schedules` (issue 27) as a real process: add / update / remove / list / show /
backfill, bad input one line with exit 2 and nothing stored changed, every change shown."""

from __future__ import annotations

import json

import pytest

import tenure
from tests.hardening.hostile import stored
from tests.support.env import run_tenure, tenure_env


@pytest.fixture
def env(dsn: str, schema: str) -> dict[str, str]:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    return tenure_env(dsn, schema)


def ok(args: list[str], env: dict[str, str]) -> str:
    done = run_tenure(args, env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_add_update_list_show_remove(env: dict[str, str], dsn: str, schema: str) -> None:
    out = ok(
        ["schedules", "add", "tenant-42", "--task", "reports.send", "--cron", "0 9 * * *",
         "--tz", "Europe/Paris", "--args", '{"tenant": 42}'],
        env,
    )  # fmt: skip
    assert out.startswith("tenant-42: added (revision 1): task reports.send, cron '0 9 * * *'")
    again = run_tenure(["schedules", "add", "tenant-42", "--task", "x", "--every", "1h"], env)
    assert again.returncode == 1 and again.stderr.count("\n") == 1
    assert "already exists" in again.stderr and "--if-exists replace" in again.stderr
    kept = ok(["schedules", "add", "tenant-42", "--task", "x", "--every", "1h",
               "--if-exists", "keep"], env)  # fmt: skip
    assert "kept" in kept
    out = ok(["schedules", "update", "tenant-42", "--args", '{"tenant": 43}'], env)
    assert "changed (revision 2)" in out
    listed = json.loads(ok(["schedules", "list", "--json"], env))
    assert [(s["key"], s["args"], s["timezone"]) for s in listed] == [
        ("tenant-42", {"tenant": 43}, "Europe/Paris")
    ]
    shown = json.loads(ok(["schedules", "show", "tenant-42", "--json"], env))
    assert [c["action"] for c in shown["changes"]] == ["update", "add"]
    assert shown["changes"][0]["before"]["args"] == {"tenant": 42}
    assert shown["changes"][0]["after"]["args"] == {"tenant": 43}
    assert shown["changes"][0]["application_name"]  # who: role and application name
    text = ok(["schedules", "show", "tenant-42"], env)
    assert "changes, newest first" in text and "update" in text
    assert ok(["schedules", "remove", "tenant-42"], env) == "tenant-42: removed\n"
    gone = run_tenure(["schedules", "remove", "tenant-42"], env)
    assert gone.returncode == 1 and "no runtime schedule 'tenant-42'" in gone.stderr
    assert ok(["schedules", "list"], env) == "no runtime schedules\n"
    # Removed, but its history of changes is still shown.
    assert "remove" in ok(["schedules", "show", "tenant-42"], env)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "t", "--cron", "0 25 * * *"], "invalid cron expression"),
        (["--task", "t", "--cron", "0 9 * * *", "--tz", "Nowhere/City"], "unknown time zone"),
        (["--task", "t", "--every", "1h", "--args", "{oops"], "args are not JSON"),
        (["--task", "t", "--every", "1h", "--args", '"x' + "y" * 70_000 + '"'], "a JSON object"),
        (["--task", "t", "--every", "1h", "--start", "2031-01-01", "--end", "2030-01-01"],
         "is before start"),
        (["--every", "1h"], "--task is required"),
        (["--task", "t"], "exactly one of"),
        (["--task", "t", "--every", "soon"], "Invalid value for '--every'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_changes(
    env: dict[str, str], dsn: str, schema: str, args: list[str], message: str
) -> None:
    ok(["schedules", "add", "kept", "--task", "t", "--every", "1h"], env)
    before = stored(dsn, schema)
    done = run_tenure(["schedules", "add", "kept", "--if-exists", "replace", *args], env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("tenure: error: ")
    assert message in done.stderr
    assert stored(dsn, schema) == before


def test_list_pages_and_search(env: dict[str, str], dsn: str, schema: str) -> None:
    with tenure.connect(dsn, schema=schema) as client:
        tenure.add_schedules(
            client, [tenure.schedule_def(f"k{i:03d}", task="t", every="1h") for i in range(30)]
        )
    page = ok(["schedules", "list", "--limit", "10"], env)
    assert "next page: --after k009" in page
    nxt = json.loads(ok(["schedules", "list", "--after", "k009", "--limit", "10", "--json"], env))
    assert [s["key"] for s in nxt] == [f"k{i:03d}" for i in range(10, 20)]
    found = json.loads(ok(["schedules", "list", "--search", "k02", "--json"], env))
    assert [s["key"] for s in found] == [f"k{i:03d}" for i in range(20, 30)]


def test_backfill_refuses_a_future_range(env: dict[str, str]) -> None:
    ok(["schedules", "add", "b", "--task", "t", "--every", "1h"], env)
    done = run_tenure(
        ["schedules", "backfill", "b", "--from", "2020-01-01T00:00Z", "--to", "2999-01-01T00:00Z"],
        env,
    )
    assert done.returncode == 2 and "is in the future" in done.stderr
    out = ok(
        ["schedules", "backfill", "b", "--from", "2020-01-01T00:00Z", "--to", "2020-01-01T05:00Z"],
        env,
    )
    assert out.startswith("b: backfilling 5 slots")


def test_pause_with_a_note_and_resume_are_recorded(env: dict[str, str]) -> None:
    ok(["schedules", "add", "p", "--task", "t", "--every", "1h"], env)
    assert ok(["schedules", "pause", "p", "--note", "customer asked, ticket 12"], env) == (
        "p: paused\n"
    )
    shown = json.loads(ok(["schedules", "show", "p", "--json"], env))
    assert shown["schedule"]["paused"] and shown["schedule"]["state"] == "paused"
    assert shown["schedule"]["pause_note"] == "customer asked, ticket 12"
    assert ok(["schedules", "resume", "p"], env).startswith("p: resumed; next slot ")
    shown = json.loads(ok(["schedules", "show", "p", "--json"], env))
    assert [c["action"] for c in shown["changes"]] == ["resume", "pause", "add"]
    assert shown["changes"][1]["after"] == {"paused": True, "note": "customer asked, ticket 12"}
    assert shown["schedule"]["pause_note"] is None
