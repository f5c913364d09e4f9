#!/usr/bin/env python3
"""Generate the sync twins of tenure (every ``_sync`` package) from the async code.

The library is written once, as asyncio code, in the ``_async`` package of each capability
(``src/tenure/leases/_async/*.py``, ``src/tenure/outbox/_async/*.py``).
This script parses every module there with :mod:`ast`, rewrites it into
blocking code, unparses it, applies ruff's safe lint fixes and formats it
(``ruff check --fix-only`` then ``ruff format``, using the repo's
configuration) and writes it to the sibling ``_sync/<same name>.py``::

    python tools/async_to_sync.py           # regenerate every _sync/ package
    python tools/async_to_sync.py --check   # exit 1 if _sync/ is out of date
    python tools/async_to_sync.py --check --diff   # ... and show the diff

Transformations
---------------

* ``async def`` -> ``def``, ``await x`` -> ``x``, ``async with`` -> ``with``,
  ``async for`` -> ``for``, ``[x async for x in y]`` -> ``[x for x in y]``.
* Identifiers listed in :data:`RENAMES` are renamed wherever they appear as a
  name, an attribute, an imported name (or its ``as`` alias), a ``def`` or
  ``class`` name, inside string annotations / forward references, as a whole
  string constant (``__all__ = ["AsyncClient"]``, ``bound="AsyncLease"``),
  and as whole words in docstrings.  Unknown names pass through unchanged.
* Module path components listed in :data:`MODULE_RENAMES` are renamed in
  imports (``from .._acompat import Event`` -> ``from .._compat import Event``,
  ``from ._async.client import AsyncClient`` ->
  ``from ._sync.client import Client``).
* ``Coroutine[Any, Any, T]`` -> ``T``; ``Awaitable[T]`` -> ``T``;
  ``AsyncGenerator[Y, S]`` -> ``Generator[Y, S, None]``.
* ``import asyncio`` is dropped when ``asyncio`` is no longer referenced;
  unused names are dropped from ``typing``, ``typing_extensions``,
  ``collections.abc`` and compat-module imports (e.g. ``Coroutine``, ``SYNC``).
* Escape hatch: ``SYNC`` (imported from the compat module; ``False`` in
  ``_acompat``, ``True`` in ``_compat``).  In the generated code
  ``if SYNC: A else: B`` becomes ``A``; ``if not SYNC: A else: B`` becomes
  ``B`` (or nothing); ``x if SYNC else y`` becomes ``x``.

Comments survive the round trip through :mod:`ast` as placeholder statements
(see "comments" below), renamed like the code: a comment line stays where it
is, a comment at the end of a line stays at its end, one inside brackets moves
above its statement (so no ``# type: ignore`` inside brackets), and one in a
branch the transformation drops goes with it. The generated file starts with a
header comment saying where it comes from.  Implicitly concatenated string literals
(``"abc" "def"``) are kept as such when the transformation leaves them alone
(ast would otherwise merge them into one over-long literal).

Example
-------

``src/tenure/_async/lease.py``::

    import asyncio
    from collections.abc import AsyncIterator, Coroutine
    from typing import Any
    from .._acompat import SYNC, sleep

    class AsyncLease:
        '''A lease held by an :class:`AsyncClient`.'''

        async def __aenter__(self) -> "AsyncLease":
            return self

        async def __aexit__(self, *exc: object) -> None:
            await self.aclose()

        async def aclose(self) -> None:
            async with self._lock:
                await sleep(0.1)

        def renew(self) -> Coroutine[Any, Any, bool]:
            return self._renew()

        async def rows(self) -> AsyncIterator[int]:
            if SYNC:
                yield 1
            else:
                await asyncio.sleep(0)
                yield 2

becomes ``src/tenure/_sync/lease.py``::

    # WARNING: this file is generated from src/tenure/_async/lease.py by ...
    # Edit the async source and run `python tools/async_to_sync.py`; ...
    from collections.abc import Iterator

    from .._compat import sleep


    class Lease:
        '''A lease held by an :class:`Client`.'''

        def __enter__(self) -> "Lease":
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

        def close(self) -> None:
            with self._lock:
                sleep(0.1)

        def renew(self) -> bool:
            return self._renew()

        def rows(self) -> Iterator[int]:
            yield 1
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# Identifier renames (names, attributes, imported names, def/class names,
# string annotations, docstrings).  Extend freely.
RENAMES: dict[str, str] = {
    # tenure / psycopg / psycopg_pool classes and functions
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "AsyncRawCursor": "RawCursor",
    "AsyncClient": "Client",
    "AsyncLease": "Lease",
    "AsyncLeaseContext": "LeaseContext",
    "AsyncResults": "Results",
    "AsyncReleaseWaiter": "ReleaseWaiter",
    "connect_async": "connect",
    "fence_async": "fence",
    "enqueue_async": "enqueue",
    "claim_async": "claim",
    "claim_header_async": "claim_header",
    "unhandled_async": "unhandled",
    "messages_async": "messages",
    "counts_async": "counts",
    "retry_async": "retry",
    "purge_async": "purge",
    "prune_async": "prune",
    "registered_tasks_async": "registered_tasks",
    "add_schedule_async": "add_schedule",
    "add_schedules_async": "add_schedules",
    "get_schedule_async": "get_schedule",
    "list_schedules_async": "list_schedules",
    "update_schedule_async": "update_schedule",
    "remove_schedule_async": "remove_schedule",
    "remove_schedules_async": "remove_schedules",
    "schedule_changes_async": "schedule_changes",
    "pause_schedule_async": "pause_schedule",
    "resume_schedule_async": "resume_schedule",
    "backfill_schedule_async": "backfill_schedule",
    "AsyncExecutor": "Executor",
    "aspawn": "spawn",
    # typing / collections.abc / contextlib / builtins
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    "AsyncContextManager": "ContextManager",
    "AbstractAsyncContextManager": "AbstractContextManager",
    "asynccontextmanager": "contextmanager",
    "StopAsyncIteration": "StopIteration",
    "aiter": "iter",
    "anext": "next",
    # protocol methods
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "aclose": "close",
}

# Renames of module path components in imports.
MODULE_RENAMES: dict[str, str] = {
    "_acompat": "_compat",
    "_async": "_sync",
}

# Name of the compile-time switch exported by the compat modules.
SYNC_FLAG = "SYNC"

# Modules from which imported-but-unused names are pruned after the
# transformation (plus any module whose last component is "_compat").
PRUNABLE_MODULES = frozenset({"typing", "typing_extensions", "collections.abc"})
PRUNABLE_PLAIN_IMPORTS = frozenset({"asyncio"})

HEADER = (
    "# WARNING: this file is generated from {name}\n"
    "# by tools/async_to_sync.py.\n"
    "# Edit the async source and run `python tools/async_to_sync.py`;"
    " CI checks the two agree.\n"
)
HEADER_MARK = "# WARNING: this file is generated from "

FIX_COMMAND = "python tools/async_to_sync.py"

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_REL = Path("src/tenure")

_WORD_RE = re.compile(
    r"(?<!\w)("
    + "|".join(re.escape(k) for k in sorted(RENAMES, key=len, reverse=True))
    + r")(?!\w)"
)
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")


def rename(name: str) -> str:
    """Rename one identifier (unknown names pass through)."""
    return RENAMES.get(name, MODULE_RENAMES.get(name, name))


def rename_module(module: str) -> str:
    """Rename the components of a dotted module path."""
    return ".".join(MODULE_RENAMES.get(p, p) for p in module.split("."))


def rename_words(text: str) -> str:
    """Rename whole words of free text (docstrings)."""
    return _WORD_RE.sub(lambda m: RENAMES[m.group(1)], text)


def _tail_name(node: ast.expr) -> str | None:
    """Return ``X`` for ``X`` or ``mod.X``; None otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_sync_flag(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == SYNC_FLAG


def _is_not_sync_flag(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.Not)
        and _is_sync_flag(node.operand)
    )


def _docstring_node(body: Sequence[ast.stmt]) -> ast.Constant | None:
    if body and isinstance(body[0], ast.Expr):
        value = body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value
    return None


def transform_annotation_string(text: str) -> str:
    """Transform a string annotation (forward reference) like an expression."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return rename_words(text)
    before = ast.unparse(tree)
    new = AsyncToSync(in_annotation=True).visit(tree)
    after = ast.unparse(new)
    return text if after == before else after


class AsyncToSync(ast.NodeTransformer):
    """Rewrite an async module's AST into its blocking twin."""

    def __init__(self, *, in_annotation: bool = False) -> None:
        self._annotation_depth = 1 if in_annotation else 0
        self._docstrings: set[int] = set()

    # -- helpers ----------------------------------------------------------

    def _visit_annotation(self, node: ast.expr | None) -> Any:
        if node is None:
            return None
        self._annotation_depth += 1
        try:
            return self.visit(node)
        finally:
            self._annotation_depth -= 1

    def _mark_docstring(self, body: Sequence[ast.stmt]) -> None:
        doc = _docstring_node(body)
        if doc is not None:
            assert isinstance(doc.value, str)
            doc.value = rename_words(doc.value)
            self._docstrings.add(id(doc))

    # -- modules, functions, classes -------------------------------------

    def visit_Module(self, node: ast.Module) -> ast.AST:
        self._mark_docstring(node.body)
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self._mark_docstring(node.body)
        node.name = rename(node.name)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self._mark_docstring(node.body)
        node.name = rename(node.name)
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args = self.visit(node.args)
        node.returns = self._visit_annotation(node.returns)
        node.body = self._visit_stmts(node.body)
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        # Same fields (incl. type_params on Python >= 3.12), different class.
        new = ast.FunctionDef(**{f: getattr(node, f) for f in node._fields})
        ast.copy_location(new, node)
        return self.visit_FunctionDef(new)

    def _visit_stmts(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            res = self.visit(stmt)
            if res is None:
                continue
            if isinstance(res, list):
                out.extend(res)
            else:
                out.append(res)
        return out

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = self._visit_annotation(node.annotation)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        is_alias = _tail_name(node.annotation) == "TypeAlias"
        node.target = self.visit(node.target)
        node.annotation = self._visit_annotation(node.annotation)
        if node.value is not None:
            if is_alias:
                node.value = self._visit_annotation(node.value)
            else:
                node.value = self.visit(node.value)
        return node

    # -- async constructs ------------------------------------------------

    def visit_Await(self, node: ast.Await) -> Any:
        return self.visit(node.value)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:
        new = ast.With(items=node.items, body=node.body, type_comment=node.type_comment)
        ast.copy_location(new, node)
        return self.generic_visit(new)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        new = ast.For(
            target=node.target,
            iter=node.iter,
            body=node.body,
            orelse=node.orelse,
            type_comment=node.type_comment,
        )
        ast.copy_location(new, node)
        return self.generic_visit(new)

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        node.is_async = 0
        return self.generic_visit(node)

    # -- the SYNC escape hatch -------------------------------------------

    def visit_If(self, node: ast.If) -> Any:
        if _is_sync_flag(node.test):
            return self._visit_stmts(node.body)
        if _is_not_sync_flag(node.test):
            return self._visit_stmts(node.orelse)
        return self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        if _is_sync_flag(node.test):
            return self.visit(node.body)
        if _is_not_sync_flag(node.test):
            return self.visit(node.orelse)
        return self.generic_visit(node)

    # -- names -------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = rename(node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        node.attr = rename(node.attr)
        return self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        if node.module:
            node.module = rename_module(node.module)
        seen: set[tuple[str, str | None]] = set()
        names: list[ast.alias] = []
        for alias in node.names:
            alias.name = rename(alias.name)
            if alias.asname:
                alias.asname = rename(alias.asname)
            key = (alias.name, alias.asname)
            if key not in seen:
                seen.add(key)
                names.append(alias)
        node.names = names
        return node

    def visit_Import(self, node: ast.Import) -> ast.AST:
        for alias in node.names:
            alias.name = rename_module(alias.name)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str) and id(node) not in self._docstrings:
            if self._annotation_depth:
                node.value = transform_annotation_string(node.value)
            elif node.value in RENAMES:
                node.value = RENAMES[node.value]
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        # cast("AsyncX", y): the first argument is a type expression.
        if _tail_name(node.func) == "cast" and node.args:
            node.func = self.visit(node.func)
            node.args = [self._visit_annotation(node.args[0])] + [
                self.visit(a) for a in node.args[1:]
            ]
            node.keywords = [self.visit(k) for k in node.keywords]
            return node
        return self.generic_visit(node)

    # -- types -------------------------------------------------------------

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        base = _tail_name(node.value)
        slc = node.slice
        if base == "Coroutine" and isinstance(slc, ast.Tuple) and len(slc.elts) == 3:
            return self.visit(slc.elts[2])
        if base == "Awaitable" and not isinstance(slc, ast.Tuple):
            return self.visit(slc)
        if base == "AsyncGenerator" and isinstance(slc, ast.Tuple) and len(slc.elts) == 2:
            slc.elts.append(ast.Constant(value=None))
        return self.generic_visit(node)


# -- post-processing ---------------------------------------------------------


def _docstring_ids(tree: ast.AST) -> set[int]:
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = _docstring_node(node.body)
            if doc is not None:
                docstrings.add(id(doc))
    return docstrings


def _referenced_names(tree: ast.AST) -> set[str]:
    """Names the module uses (conservatively, strings count too)."""
    docstrings = _docstring_ids(tree)
    refs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            refs.add(node.id)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            refs.update(_IDENT_RE.findall(node.value))
    return refs


def _is_prunable_from(module: str | None) -> bool:
    if not module:
        return False
    return module in PRUNABLE_MODULES or module.rsplit(".", 1)[-1] == "_compat"


class _PruneImports(ast.NodeTransformer):
    def __init__(self, refs: set[str]) -> None:
        self.refs = refs

    def visit_Import(self, node: ast.Import) -> ast.AST | None:
        node.names = [
            a
            for a in node.names
            if not (a.name in PRUNABLE_PLAIN_IMPORTS and (a.asname or a.name) not in self.refs)
        ]
        return node if node.names else None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        if node.level == 0 and node.module == "__future__":
            return node
        if _is_prunable_from(node.module):
            node.names = [
                a for a in node.names if a.name == "*" or (a.asname or a.name) in self.refs
            ]
        return node if node.names else None


def _fill_empty_bodies(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module):
            continue
        for field in ("body",):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and not stmts:
                setattr(node, field, [ast.Pass()])
        if isinstance(node, ast.Try) and not node.handlers and not node.finalbody:
            node.finalbody = [ast.Pass()]


def _remaining_asyncio(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "asyncio" for n in ast.walk(tree))


# -- implicit string concatenation -------------------------------------------
#
# ast merges ``"abc" "def"`` into one constant, which unparses as one long
# line.  Untouched concatenations are swapped for placeholder names before
# unparsing and replaced afterwards by their pieces on one line, which ruff
# format then splits (or joins) as it sees fit.

_FSTRING_START = getattr(tokenize, "FSTRING_START", -1)  # Python >= 3.12
_FSTRING_END = getattr(tokenize, "FSTRING_END", -1)
_PLACEHOLDER = "__a2s_concat_{}__"
_PLACEHOLDER_RE = re.compile(r"\b__a2s_concat_(\d+)__\b")
_SKIP_TOKENS = frozenset({tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.ENDMARKER})


def _string_pieces(segment: str) -> list[str]:
    """The source of each string literal of an implicit concatenation."""
    text = f"({segment})"
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))

    def off(pos: tuple[int, int]) -> int:
        return offsets[pos[0] - 1] + pos[1]

    pieces: list[str] = []
    depth = 0
    start = (0, 0)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == _FSTRING_START:
                if depth == 0:
                    start = tok.start
                depth += 1
            elif tok.type == _FSTRING_END:
                depth -= 1
                if depth == 0:
                    pieces.append(text[off(start) : off(tok.end)])
            elif depth:
                continue
            elif tok.type == tokenize.STRING:
                pieces.append(tok.string)
            elif tok.type == tokenize.OP:
                if tok.string not in ("(", ")"):
                    return []
            elif tok.type not in _SKIP_TOKENS:
                return []
    except (tokenize.TokenError, SyntaxError):
        return []
    return pieces


class _Concat:
    __slots__ = ("dump", "node", "text")

    def __init__(self, node: ast.expr, text: str) -> None:
        self.node = node  # keeps the node alive, so its id() stays unique
        self.dump = ast.dump(node)
        self.text = text


def _find_concats(source: str, tree: ast.AST) -> dict[int, _Concat]:
    docstrings = _docstring_ids(tree)
    found: dict[int, _Concat] = {}
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and id(node) not in docstrings:
            if isinstance(node, ast.JoinedStr) or isinstance(node.value, (str, bytes)):
                segment = ast.get_source_segment(source, node)
                pieces = _string_pieces(segment) if segment else []
                if len(pieces) > 1:
                    found[id(node)] = _Concat(node, " ".join(pieces))
            continue  # never look inside f-strings
        todo.extend(ast.iter_child_nodes(node))
    return found


class _HideConcats(ast.NodeTransformer):
    def __init__(self, concats: dict[int, _Concat]) -> None:
        self.concats = concats
        self.texts: list[str] = []

    def _hide(self, node: ast.expr) -> ast.expr:
        concat = self.concats.get(id(node))
        if concat is None or concat.node is not node or ast.dump(node) != concat.dump:
            return node
        self.texts.append(concat.text)
        return ast.Name(id=_PLACEHOLDER.format(len(self.texts) - 1), ctx=ast.Load())

    def visit_Constant(self, node: ast.Constant) -> ast.expr:
        return self._hide(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.expr:
        return self._hide(node)


# -- comments ----------------------------------------------------------------
#
# ast drops comments. Before parsing, each comment becomes a placeholder statement
# ``__a2s_comment__("text")`` (``__a2s_comment__("text", True)`` for a comment at the end
# of a line), placed where a statement may stand: a comment line between statements stays
# where it is (indented as the statement after it, or as the one before it when an
# ``else:``/``except:``/... follows); a comment inside brackets moves above its statement; a
# comment after a docstring's place stays below the docstring. After unparsing, the
# placeholders become comments again (a trailing one goes back to the end of the line
# before it) and ruff formats them. A comment in a branch the transformation drops goes
# with it.

_COMMENT_CALL = "__a2s_comment__"
_COMMENT_RE = re.compile(r"^(\s*)" + _COMMENT_CALL + r"\((.*)\)$")
_CONTINUES = frozenset({"else", "elif", "except", "finally", "case"})


class _Logical:
    __slots__ = ("end", "first", "header", "indent", "only_string", "start")

    def __init__(self, start: int, indent: int, first: str) -> None:
        self.start = self.end = start
        self.indent = indent
        self.first = first
        self.header = False
        self.only_string = True


def _comments_to_placeholders(source: str) -> str:
    lines = source.splitlines()
    logical: list[_Logical] = []
    found: list[tuple[int, int, str, int, bool]] = []  # row, col, text, depth, alone
    current: _Logical | None = None
    last_significant = ""
    depth = 0
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            alone = not lines[row - 1][:col].strip()
            found.append((row, col, tok.string, depth, alone))
            continue
        if tok.type == tokenize.NEWLINE:
            if current is not None:
                current.end = tok.start[0]
                current.header = last_significant == ":"
            current = None
            continue
        if tok.type in skip:
            continue
        if current is None:
            current = _Logical(tok.start[0], tok.start[1], tok.string)
            logical.append(current)
        if tok.type != tokenize.STRING:
            current.only_string = False
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        last_significant = tok.string
    if not found:
        return source
    inserts: dict[int, list[str]] = {}  # before source row (1-based)

    def put(row: int, indent: int, text: str, trailing: int = 0) -> None:
        # trailing: 1 at the end of the line before, 2 at the end of the def/class line
        # before (a header whose docstring comes first).
        call = (
            f"{_COMMENT_CALL}({text!r}, {trailing})" if trailing else f"{_COMMENT_CALL}({text!r})"
        )
        inserts.setdefault(row, []).append(" " * indent + call)

    def next_logical(row: int) -> _Logical | None:
        for lg in logical:
            if lg.start > row:
                return lg
        return None

    def previous_logical(row: int) -> _Logical | None:
        before = [lg for lg in logical if lg.end < row]
        return before[-1] if before else None

    def placed(lg: _Logical | None, row: int) -> tuple[int, int]:
        """Where a comment standing before ``lg`` goes: (before row, indent)."""
        if lg is None:
            return len(lines) + 1, 0
        prev = previous_logical(lg.start)
        if lg.first in _CONTINUES and prev is not None:
            return row, prev.indent
        if lg.only_string and prev is not None and prev.header:
            return lg.end + 1, lg.indent  # not above a docstring
        return row, lg.indent

    for row, _col, text, depth_at, alone in found:
        text = rename_words(text)
        if alone and depth_at == 0:
            at, indent = placed(next_logical(row), row)
            put(at, indent, text)
        elif depth_at == 0:
            lg = next(lg for lg in logical if lg.end == row or lg.start <= row <= lg.end)
            if lg.header:
                body = next_logical(lg.end)
                if body is not None and body.indent > lg.indent:
                    at, indent = placed(body, body.start)
                    put(
                        lg.end + 1 if at == body.start else at, indent, text, 1 + (at != body.start)
                    )
                    continue
            put(lg.end + 1, lg.indent, text, 1)
        else:  # inside brackets: above its statement
            lg = [lg for lg in logical if lg.start <= row][-1]
            at, indent = placed(lg, lg.start)
            put(at, indent, text)
    out = list(lines)
    for row, col, _text, _depth, alone in found:
        out[row - 1] = "" if alone else out[row - 1][:col].rstrip()
    result: list[str] = []
    for row in range(1, len(out) + 2):
        result.extend(inserts.get(row, ()))
        if row <= len(out):
            result.append(out[row - 1])
    return "\n".join(result) + "\n"


_HEADERS = ("def ", "async def ", "class ")


def _next_code(lines: list[str], n: int) -> str:
    """The first line after ``lines[n]`` that is neither blank nor a comment placeholder,
    stripped."""
    for line in lines[n + 1 :]:
        if line.strip() and not _COMMENT_RE.match(line):
            return line.lstrip()
    return ""


def _placeholders_to_comments(code: str) -> str:
    out: list[str] = []
    code_lines = code.splitlines()
    leading = False  # the last line out is a comment that leads a def or class
    for n, line in enumerate(code_lines):
        m = _COMMENT_RE.match(line)
        if m is None:
            if not (leading and not line.strip()):  # unparse's blank line before a def
                out.append(line)
                leading = False
            continue
        args = ast.literal_eval(f"({m.group(2)},)")
        text, trailing = args[0], args[1] if len(args) > 1 else 0
        if trailing:
            for i in range(len(out) - 1, -1, -1):
                line = out[i].lstrip()
                if line if trailing == 1 else line.startswith(_HEADERS):
                    out[i] = f"{out[i]}  {text}"
                    break
            continue
        leading = _next_code(code_lines, n).startswith((*_HEADERS, "@"))
        if (
            leading
            and out
            and out[-1].strip()
            and not out[-1].rstrip().endswith(":")
            and not out[-1].lstrip().startswith("#")
        ):
            out.append("")  # apart from what is before it: ruff then keeps it on the def
        out.append(m.group(1) + text)
    return "\n".join(out)


# -- driver -------------------------------------------------------------------


def find_ruff() -> str:
    """Find ruff next to the running interpreter, else on PATH."""
    exe_dir = Path(sys.executable).parent
    for name in ("ruff", "ruff.exe"):
        cand = exe_dir / name
        if cand.is_file():
            return str(cand)
    found = shutil.which("ruff")
    if found is None:
        raise SystemExit("async_to_sync: cannot find the 'ruff' executable")
    return found


def _run_ruff(args: list[str], source: str, filename: Path, root: Path) -> str:
    proc = subprocess.run(
        [find_ruff(), *args, "--stdin-filename", str(filename), "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"async_to_sync: `ruff {' '.join(args)}` failed on {filename}:\n{proc.stderr}"
        )
    return proc.stdout


def ruff_format(source: str, filename: Path, root: Path) -> str:
    """Lint-fix and format source text with ruff, using the repo config.

    Runs ``ruff check --fix-only -`` (safe fixes of the repo's lint rules:
    import sorting, since ast loses the blank lines between import groups,
    ``__all__`` order after renames, nested ``with`` merging, ...) then
    ``ruff format -``.
    """
    source = _run_ruff(
        ["check", "--fix-only", "--exit-zero", "--quiet"],
        source,
        filename,
        root,
    )
    return _run_ruff(["format", "--quiet"], source, filename, root)


def convert_source(source: str, filename: str = "<async>") -> str:
    """Convert async source text into (unformatted, header-less) sync code."""
    source = _comments_to_placeholders(source)
    tree = ast.parse(source, filename=filename)
    concats = _find_concats(source, tree)
    tree = AsyncToSync().visit(tree)
    tree = _PruneImports(_referenced_names(tree)).visit(tree)
    _fill_empty_bodies(tree)
    hider = _HideConcats(concats)
    tree = hider.visit(tree)
    ast.fix_missing_locations(tree)
    if _remaining_asyncio(tree):
        print(
            f"async_to_sync: warning: {filename}: 'asyncio' is still referenced in the sync output",
            file=sys.stderr,
        )
    code = ast.unparse(tree)
    code = _PLACEHOLDER_RE.sub(lambda m: hider.texts[int(m.group(1))], code)
    return _placeholders_to_comments(code) + "\n"


def generate(src: Path, root: Path) -> str:
    """Return the complete, formatted sync twin of the async module ``src``."""
    name = src.relative_to(root).as_posix() if src.is_relative_to(root) else str(src)
    code = convert_source(src.read_text(encoding="utf-8"), name)
    dst = src.parent.parent / "_sync" / src.name
    text = HEADER.format(name=name) + code
    return ruff_format(text, dst, root)


def _is_generated(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().startswith(HEADER_MARK)
    except OSError:
        return False


def run(root: Path, *, check: bool, diff: bool) -> int:
    package = root / PACKAGE_REL
    async_dirs = sorted(p for p in package.rglob("_async") if p.is_dir())
    if not async_dirs:
        print(f"async_to_sync: no _async package under {package}", file=sys.stderr)
        return 2
    status = 0
    for async_dir in async_dirs:
        status = max(status, run_one(root, async_dir, check=check, diff=diff))
    if status and check:
        print(f"async_to_sync: run `{FIX_COMMAND}` to fix.")
    return status


def run_one(root: Path, async_dir: Path, *, check: bool, diff: bool) -> int:
    sync_dir = async_dir.parent / "_sync"
    sources = sorted(async_dir.glob("*.py"))
    expected = {src.name for src in sources}
    stale = (
        sorted(p for p in sync_dir.glob("*.py") if p.name not in expected)
        if sync_dir.is_dir()
        else []
    )

    outdated: list[Path] = []
    for src in sources:
        dst = sync_dir / src.name
        new = generate(src, root)
        old = dst.read_text(encoding="utf-8") if dst.exists() else None
        if new == old:
            continue
        outdated.append(dst)
        if check:
            if diff:
                _print_diff(old or "", new, dst.relative_to(root))
        else:
            sync_dir.mkdir(parents=True, exist_ok=True)
            dst.write_text(new, encoding="utf-8")
            print(f"async_to_sync: wrote {dst.relative_to(root)}")

    if check:
        if not outdated and not stale:
            return 0
        for path in outdated:
            print(f"async_to_sync: out of date: {path.relative_to(root)}")
        for path in stale:
            print(f"async_to_sync: stale file without async source: {path.relative_to(root)}")
        return 1

    for path in stale:
        if _is_generated(path):
            path.unlink()
            print(f"async_to_sync: removed stale {path.relative_to(root)}")
        else:
            print(
                f"async_to_sync: warning: {path.relative_to(root)} has no async"
                " source and was not generated; leaving it alone",
                file=sys.stderr,
            )
    return 0


def _print_diff(old: str, new: str, path: Path) -> None:
    sys.stdout.writelines(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"{path} (on disk)",
            f"{path} (generated)",
        )
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Generate every src/tenure/**/_sync package from its _async twin."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="don't write; exit 1 if any generated file is out of date",
    )
    parser.add_argument("--diff", action="store_true", help="with --check, print a unified diff")
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="repository root (default: the parent of tools/)",
    )
    args = parser.parse_args(None if argv is None else list(argv))
    return run(args.root.resolve(), check=args.check, diff=args.diff)


if __name__ == "__main__":
    sys.exit(main())
