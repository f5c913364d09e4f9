"""Print the lowest versions pyproject.toml allows for tenure's direct dependencies, pinned.

    python tools/floors.py [--extra NAME ...] > floors.txt
    pip install -r floors.txt ...

Each requirement of [project].dependencies (and of the named extras) becomes ``name==floor``
from its ``>=`` bound, so a CI step can install exactly the floors and run the tests on
them (scripts/release-checks): a floor that does not install or does not work fails there
instead of on a user's machine. A requirement without a ``>=`` floor is an error.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)(;.*)?$")


def floor(requirement: str) -> str:
    """``"click>=8.2"`` -> ``"click==8.2"``; extras and markers are kept."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        raise SystemExit(f"floors: cannot read the requirement {requirement!r}")
    name, extras, specifiers, marker = match.groups()
    lows = [s.strip()[2:].strip() for s in specifiers.split(",") if s.strip().startswith(">=")]
    if len(lows) != 1:
        raise SystemExit(f"floors: {requirement!r} has no single >= floor; give it one")
    return f"{name}{extras or ''}=={lows[0]}{marker or ''}"


def floors(pyproject: dict[str, object], extras: list[str]) -> list[str]:
    project = pyproject["project"]
    assert isinstance(project, dict)
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return [floor(r) for r in requirements]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="append", default=[], help="an extra's floors too")
    args = parser.parse_args(argv)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    print("\n".join(floors(pyproject, args.extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
