"""Every Python and shell block in README.md, CONTRIBUTING.md and docs/ is either run here or
says why it is not (issue 26).

The line before each such block is a marker comment:

* ``<!-- run: NAME -->``: the block runs here. A Python block runs as a script after the
  prelude ``PRELUDES[NAME]`` (names the fragment takes for granted) and before the check
  ``CHECKS[NAME]``; a shell block runs under ``bash -euo pipefail`` with ``tenure`` on PATH.
  Both get ``$TENURE_DSN`` and ``$TENURE_SCHEMA`` for a migrated throwaway schema.
* ``<!-- same-as: PATH -->``: the block is, line for line, part of PATH, a file the suite
  runs (an example project).
* ``<!-- not-run: REASON -->``: not runnable here, and why (a fragment, a long-running
  server, another host).

A block without a marker, an unknown run name or an empty reason fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import tenure

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = {"python", "py", "sh", "bash", "shell", "console"}
# docs/index.md and docs/changelog.md are README.md and CHANGELOG.md (mkdocs snippets).
PAGES = sorted(
    {ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")}
    - {ROOT / "docs" / "index.md", ROOT / "docs" / "changelog.md"}
)
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(run|same-as|not-run):\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    marker: str | None
    argument: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        language = opening[2]
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        if language in LANGUAGES:
            code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
            found.append(
                Block(
                    page,
                    i + 1,
                    language,
                    code,
                    marker[1] if marker else None,
                    marker[2] if marker else "",
                )
            )
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]

PRELUDES = {
    # The README's first example: compute_report is the user's; the client's schema is the
    # test's (tenure.connect() would use the shared default schema "tenure").
    "guide": """
import functools, os
import tenure
tenure.connect = functools.partial(tenure.connect, schema=os.environ["TENURE_SCHEMA"])
def compute_report():
    return 42
""",
    # The scheduler example defines an app and its jobs; nothing starts a worker.
    "scheduler": "",
    # docs/schedules.md's task (issue 27): an app with one task, nothing started.
    "tasks": "import tenure\n",
}
CHECKS = {
    "guide": """
stored = client.results.get("nightly-report")
assert stored is not None and stored.payload == {"rows": 42}, stored
""",
    "scheduler": """
assert set(app.jobs) == {"nightly-report", "heartbeat"}, app.jobs
""",
    "tasks": """
assert set(app.tasks) == {"reports.send"} and not app.jobs, app.tasks
""",
}


def test_every_block_is_run_or_says_why_not() -> None:
    assert ALL, "no code blocks found"
    problems = [
        f"{b.where}: a {b.language} block without a marker (run / same-as / not-run)"
        for b in ALL
        if b.marker is None
    ]
    problems += [
        f"{b.where}: not-run without a reason"
        for b in ALL
        if b.marker == "not-run" and not b.argument
    ]
    problems += [
        f"{b.where}: no prelude named {b.argument!r}"
        for b in ALL
        if b.marker == "run" and b.language in ("python", "py") and b.argument not in PRELUDES
    ]
    assert problems == []


SAME_AS = [b for b in ALL if b.marker == "same-as"]


@pytest.mark.parametrize("block", SAME_AS, ids=[b.where for b in SAME_AS])
def test_a_same_as_block_is_in_its_file(block: Block) -> None:
    source = (ROOT / block.argument).read_text()
    assert block.code.strip() in source, f"{block.where} is not in {block.argument}"


RUN = [b for b in ALL if b.marker == "run"]


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_a_run_block_runs(block: Block, dsn: str, schema: str, tmp_path: Path) -> None:
    with tenure.connect(dsn, schema=schema, migrate=True):
        pass
    env = {
        **os.environ,
        "TENURE_DSN": dsn,
        "TENURE_SCHEMA": schema,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    if block.language in ("python", "py"):
        script = PRELUDES[block.argument] + block.code + CHECKS.get(block.argument, "")
        command = [sys.executable, "-c", script]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{block.where}\n{done.stdout}\n{done.stderr}"
