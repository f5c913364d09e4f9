"""The package's metadata, as a team adopting it checks it (issue 26).

The built wheel itself is checked by scripts/release-checks (build, twine, a wheel-only
install outside the tree); these are the fast checks of the source tree.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import tenure

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_no_module_imports_another_distributions_private_module() -> None:
    # httpx._utils once: any httpx release may change a private module without notice.
    private: list[str] = []
    for path in sorted((ROOT / "src" / "tenure").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                top, *rest = name.split(".")
                if top != "tenure" and any(part.startswith("_") for part in rest):
                    private.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert private == []


def test_one_version_source() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "src/tenure/__init__.py"
    assert importlib.metadata.version("tenure") == tenure.__version__


def test_license_is_an_spdx_expression_with_its_file() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def test_dev_tools_are_a_dependency_group_not_a_published_extra() -> None:
    assert "dev" not in PYPROJECT["project"]["optional-dependencies"]
    groups = PYPROJECT["dependency-groups"]
    assert {"include-group": "test"} in groups["dev"]
    assert any(d.startswith("pytest>=") for d in groups["test"])
    script = (ROOT / "scripts" / "test").read_text()
    assert "--group dev" in script and "pip>=25.1" in script


def test_every_supported_python_has_its_classifier() -> None:
    floor = re.fullmatch(r">=3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert floor is not None
    versions = {
        c.rsplit(" ", 1)[1]
        for c in PYPROJECT["project"]["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert versions == {f"3.{m}" for m in range(int(floor[1]), 14)}


def test_check_dist_names_a_file_the_wheel_lacks_and_one_it_should_not_have(
    tmp_path: Path,
) -> None:
    # scripts/release-checks trusts tools/check_dist.py to fail on a wheel that lost a file.
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_dist
    finally:
        sys.path.remove(str(ROOT / "tools"))
    expected = check_dist.package_files()
    assert {"tenure/py.typed", "tenure/db/sql/queries.sql"} <= expected
    wheel = tmp_path / "tenure-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in sorted(expected - {"tenure/db/sql/queries.sql"}):
            z.writestr(name, "")
        z.writestr("tests/test_x.py", "")
        z.writestr("tenure-0.dist-info/licenses/LICENSE", "")
    assert check_dist.check_wheel(wheel, expected) == [
        "wheel lacks tenure/db/sql/queries.sql",
        "wheel has tests/test_x.py, not a package file",
    ]


def test_floors_pins_every_direct_dependency_at_its_lower_bound() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import floors
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert floors.floor("httpx>=0.27,<1") == "httpx==0.27"
    assert floors.floor("psycopg[binary]>=3.2.1") == "psycopg[binary]==3.2.1"
    assert floors.floor('x>=1; python_version < "3.12"') == 'x==1; python_version < "3.12"'
    with pytest.raises(SystemExit, match="no single >= floor"):
        floors.floor("click")
    pinned = floors.floors(PYPROJECT, ["binary"])
    assert len(pinned) == len(PYPROJECT["project"]["dependencies"]) + 1
    assert "click==8.2" in pinned  # NoArgsIsHelpError: every usage error relies on it
