"""tools/async_to_sync.py keeps the async source's comments in the sync code it generates."""

from __future__ import annotations

import importlib.util
import io
import shutil
import sys
import tokenize
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The generated file's header: three comment lines of its own.
HEADER_COMMENTS = 3


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", ROOT / "tools/async_to_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["async_to_sync"] = module
    spec.loader.exec_module(module)
    return module


def comments(text: str) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [t.string for t in tokens if t.type == tokenize.COMMENT]


def test_every_generated_file_has_its_sources_comments() -> None:
    """None of the async sources has a comment in a branch the sync code drops, so each sync
    twin has every comment (renamed as the code is) and the header's."""
    tool = _tool()
    counted = 0
    for source in sorted((ROOT / "src/tenure").rglob("_async/*.py")):
        twin = source.parent.parent / "_sync" / source.name
        theirs = [tool.rename_words(c) for c in comments(source.read_text(encoding="utf-8"))]
        ours = comments(twin.read_text(encoding="utf-8"))[HEADER_COMMENTS:]
        assert sorted(ours) == sorted(theirs), source.name
        counted += len(theirs)
    assert counted >= 50  # the client alone has about 30


def _convert(source: str) -> str:
    tool = _tool()
    if shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").is_file():
        pytest.skip("ruff is not installed")
    return str(tool.ruff_format(tool.convert_source(source), ROOT / "x.py", ROOT))


def test_comments_keep_their_places() -> None:
    source = '''\
"""Doc."""

from ._acompat import SYNC


# Before f.
async def f(x: int) -> int:  # on the header
    # Before the docstring: kept below it.
    """F."""
    if x:
        await g(x)  # trailing
        # end of the if body
    else:  # on else
        pass
    call(
        x,  # inside brackets: moved above the call
    )
    if SYNC:
        # kept
        return 1
    else:
        # dropped with its branch
        return 2
'''
    out = _convert(source)
    assert "# Before f.\ndef f(x: int) -> int:  # on the header\n" in out
    assert '    """F."""\n    # Before the docstring: kept below it.\n' in out
    assert "        g(x)  # trailing\n        # end of the if body\n    else:  # on else\n" in out
    assert "    # inside brackets: moved above the call\n    call(" in out
    assert "# kept\n    return 1" in out
    assert "dropped" not in out
