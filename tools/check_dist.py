"""Check what the built wheel and sdist contain (scripts/release-checks; issue 26).

    python tools/check_dist.py dist/tenure-X-py3-none-any.whl dist/tenure-X.tar.gz

The wheel must hold every file of src/tenure that git tracks (the SQL, migrations, templates,
static files and py.typed, not only the modules: an editable install hides a file the wheel
lacks) and nothing else but its metadata, with the LICENSE among it; the sdist must hold the
same sources plus LICENSE, README.md and pyproject.toml. Standard library only.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_files() -> set[str]:
    """src/tenure's tracked files, relative to src/ (what the wheel must ship)."""
    listed = subprocess.run(
        ["git", "ls-files", "src/tenure"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {path.removeprefix("src/") for path in listed}


def check_wheel(path: Path, expected: set[str]) -> list[str]:
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
    info = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    problems = [f"wheel lacks {n}" for n in sorted(expected - names)]
    problems += [f"wheel has {n}, not a package file" for n in sorted(names - expected - info)]
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in info):
        problems.append("wheel has no licenses/LICENSE in its metadata")
    return problems


def check_sdist(path: Path, expected: set[str]) -> list[str]:
    with tarfile.open(path) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    wanted = {f"src/{n}" for n in expected} | {"LICENSE", "README.md", "pyproject.toml"}
    return [f"sdist lacks {n}" for n in sorted(wanted - names)]


def main(argv: list[str]) -> int:
    expected = package_files()
    problems: list[str] = []
    for arg in argv:
        path = Path(arg)
        if path.suffix == ".whl":
            problems += check_wheel(path, expected)
        elif path.name.endswith(".tar.gz"):
            problems += check_sdist(path, expected)
        else:
            problems.append(f"not a wheel or an sdist: {path}")
    for problem in problems:
        print(f"check_dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_dist: {len(argv)} files hold the {len(expected)} files of src/tenure")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
