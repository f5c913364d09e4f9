"""The integrations stay optional: `import tenure`, `tenure.once` and the CLI load none of
the frameworks (each needs its own extra and costs start-up time)."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = ("django", "sqlalchemy", "celery", "kombu", "apscheduler", "fastapi", "starlette")

PROBE = """
import sys
{code}
frameworks = {frameworks!r}
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in frameworks)))
"""


@pytest.mark.parametrize(
    "code",
    [
        "import tenure",
        "import tenure; tenure.once; tenure.OnceContext; tenure.Scheduler",
        "import tenure.contrib, tenure.guard",
        # The CLI with every command registered, as `tenure --help` loads it.
        "from tenure.cli import main\nsys.argv = ['tenure', '--help']\ntry:\n    main()\n"
        "except SystemExit as e:\n    assert e.code == 0",
        "from tenure.cli import main\nsys.argv = ['tenure', 'exec', '--help']\ntry:\n    main()\n"
        "except SystemExit as e:\n    assert e.code == 0",
    ],
)
def test_no_framework_is_imported(code: str) -> None:
    probe = PROBE.format(code=code, frameworks=FRAMEWORKS)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.splitlines()[-1] == "", f"{code!r} imported {out.splitlines()[-1]}"


def test_the_probe_sees_a_framework_when_one_is_imported() -> None:
    pytest.importorskip("sqlalchemy")
    probe = PROBE.format(code="import tenure.contrib.sqlalchemy", frameworks=FRAMEWORKS)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "sqlalchemy" in out.splitlines()[-1]
