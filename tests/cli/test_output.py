"""List output: whole values when piped, control characters escaped (piped and on a
terminal), and --json on every list command, with real rows whose keys hold ESC and newline."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys

import psycopg
import pytest

import tenure
from tenure.cli.tables import printable
from tests.support.env import run_tenure, tenure_env
from tests.support.scheduler_support import InProcessWorker, query, wait_for

# An ESC sequence that would turn a terminal red, a newline that would break the row, and
# enough characters that an 80-column cut would lose the end.
EVIL = "evil\x1b[31mred\nrow-" + "x" * 100 + "-end"
TOPIC = "evil.topic"  # topics are restricted to letters, digits and _ . : / -
ERROR = "boom\x1b[2J\nsecond line"

LISTS = [
    ["jobs", "list"],
    ["jobs", "history", EVIL],
    ["outbox", "list", "--state", "all"],
    ["status"],
]


@pytest.fixture
def evil_rows(client: tenure.Client, dsn: str, schema: str) -> None:
    """A scheduled job (with one failed run), an outbox message and a lease, under EVIL."""
    app = tenure.Scheduler(dsn, schema=schema)

    @app.job(EVIL, every="1h")
    def evil(ctx: tenure.JobContext) -> None:
        raise RuntimeError(ERROR)

    with InProcessWorker(app):
        triggered = run_tenure(["jobs", "trigger", EVIL], tenure_env(dsn, schema))
        assert triggered.returncode == 0, triggered.stderr
        wait_for(
            lambda: query(
                dsn,
                schema,
                "SELECT 1 FROM {schema}.job_runs WHERE job_key = %s AND outcome = 'failed'",
                (EVIL,),
            ),
            timeout=20,
            what="the failed run",
        )
    with psycopg.connect(dsn) as conn:
        tenure.outbox.enqueue(conn, TOPIC, EVIL, {"n": 1}, schema=schema)


def test_piped_lists_show_whole_values_with_control_characters_escaped(
    evil_rows: None, dsn: str, schema: str
) -> None:
    env = tenure_env(dsn, schema)
    shown = printable(EVIL)
    assert "\\x1b[31mred\\nrow-" in shown and shown.endswith("-end")
    for args in LISTS:
        out = run_tenure(args, env)
        assert out.returncode == 0, (args, out.stderr)
        assert "\x1b" not in out.stdout, args
        rows = [line for line in out.stdout.splitlines() if shown in line]
        assert rows, (args, out.stdout)  # the whole key, on one line
        if args[1:2] == ["history"]:  # the key is in the title; the run below it
            [run] = [line for line in out.stdout.splitlines() if " failed " in line]
            assert run.endswith(printable(f"RuntimeError: {ERROR}")), out.stdout
        if args[0] == "outbox":
            # Pending, and shown as waiting for a relay: none runs with a handler for it.
            assert printable(TOPIC) in rows[0] and "no relay" in rows[0]


def test_json_on_every_list_gives_the_values_back_exactly(
    evil_rows: None, dsn: str, schema: str
) -> None:
    env = tenure_env(dsn, schema)
    for args in LISTS:
        out = run_tenure([*args, "--json"], env)
        assert out.returncode == 0, (args, out.stderr)
        # One document on every list (issue 31: jobs history printed JSON Lines).
        rows = json.loads(out.stdout)
        assert isinstance(rows, list), (args, out.stdout)
        keys = {row.get("job") or row.get("job_key") or row.get("key") for row in rows}
        assert EVIL in keys, (args, rows)


def _on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run tenure with stdout on a pseudo-terminal (wide, so nothing wraps)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure", *args],
        env={**env, "COLUMNS": "1000", "TERM": "xterm"},
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.stderr is not None
    with proc.stderr:
        errors = proc.stderr.read()
    assert proc.wait(60) == 0, errors
    return b"".join(chunks).decode(errors="replace")


def test_terminal_lists_escape_control_characters(evil_rows: None, dsn: str, schema: str) -> None:
    env = tenure_env(dsn, schema)
    for args in LISTS:
        out = _on_a_terminal(args, env)
        # rich styles the table with its own escapes; the key's own never reach the terminal.
        assert "\x1b[31mred" not in out and "\x1b[2J" not in out
        assert "\\x1b[31mred\\nrow-" in out, (args, out)
