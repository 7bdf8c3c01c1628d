"""Statement instrumentation for the shared cell runner (:mod:`gpumagic.cell`).

:class:`Instrumenter` puts a probe call, ``enter(i)``, before each statement of a cell,
including statements inside ``for``/``while``/``if``/``with``/``try``/``match`` bodies, and
records a :class:`Statement` (the row of a per-statement report) for each; the module
docstring of :mod:`gpumagic.cell` says why it works this way. The cell's lines are split where
Python's tokenizer splits them, and each row carries its statement's own text.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["SOURCE_LIMIT", "Instrumenter", "Statement", "source_lines", "units"]

# Python ends a source line at \n, \r\n or \r only; str.splitlines() also splits at form
# feed, U+2028 and other characters Python's tokenizer treats as plain text, which would
# shift every later line against the ast's line numbers.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# A statement's source as a report row shows it: longer ones are cut (one 1 MB literal would
# otherwise be copied into every table, tooltip and DataFrame that names the row).
SOURCE_LIMIT = 1000


def source_lines(text: str) -> list[str]:
    """``text`` split into lines where Python's tokenizer splits it (not ``str.splitlines``)."""
    lines = _LINE_BREAK.split(text)
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()  # a final line break ends the last line; it does not start another
    return lines


def _capped(text: str) -> str:
    if len(text) <= SOURCE_LIMIT:
        return text
    return f"{text[:SOURCE_LIMIT]} … ({len(text) - SOURCE_LIMIT:,} more characters)"


@dataclass(frozen=True)
class Statement:
    """One row of a per-statement report."""

    index: int
    line: int  # first line as the notebook numbers it: the magic's own line is line 1
    end_line: int
    source: str  # the statement's own source as typed (a compound statement: its header only;
    # at most SOURCE_LIMIT characters, then a marker)
    kind: str  # ast class name: "Assign", "For", "Expr", ...
    depth: int  # 0 at the top of the cell, +1 inside each for/while/if/with/try/match body


def units(nodes: list[ast.stmt], enter_name: str | None) -> Iterator[list[ast.stmt]]:
    """The top-level statements one by one, each with the probe call put before it."""
    pending: list[ast.stmt] = []
    for node in nodes:
        pending.append(node)
        if not _is_enter_call(node, enter_name):
            yield pending
            pending = []
    if pending:
        yield pending


def _is_enter_call(node: ast.stmt, enter_name: str | None) -> bool:
    return (
        enter_name is not None
        and isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == enter_name
    )


class Instrumenter:
    """Rewrites statement lists so that each statement starts with ``enter(i)``."""

    def __init__(
        self,
        raw_lines: list[str],
        code_lines: list[str],
        names: dict[str, str],
        out: list[Statement],
        first_line: int,
    ) -> None:
        self.raw_lines = raw_lines  # as typed
        self.code_lines = code_lines  # as transformed: what the ast's columns refer to
        self.first_line = first_line  # the notebook line number of raw_lines[0]
        self.names = names
        self.out = out

    # -- helpers ---------------------------------------------------------------------------
    def _source(self, node: ast.stmt, header_only: bool) -> str:
        """The statement's own text: from its first column to its last, so that of
        ``a = 1; b = 2`` each row shows its own statement, not the whole line."""
        first = node.lineno - self.first_line
        last = (node.end_lineno or node.lineno) - self.first_line
        if not 0 <= first < len(self.raw_lines):
            text = ast.unparse(node)
            return _capped(text.splitlines()[0] if header_only else text)
        start, end = node.col_offset, node.end_col_offset
        body = getattr(node, "body", None) if header_only else None
        if header_only:
            end = None
            if body and body[0].lineno == node.lineno:
                # one-line compound statement ("for x in y: f(x)"): the header ends where
                # the body starts
                last, end = first, body[0].col_offset
            elif body:
                last = max(first, body[0].lineno - self.first_line - 1)
            elif isinstance(node, ast.Match) and node.cases:
                last = max(first, node.cases[0].pattern.lineno - self.first_line - 1)
        lines = self.raw_lines[first : last + 1]
        indent = len(lines[0]) - len(lines[0].lstrip())
        # the ast's columns are byte offsets into the transformed line: usable on a line the
        # transform left as typed (a %magic or !command line is shown whole)
        if end is not None and self._as_typed(last):
            lines[-1] = _cut(lines[-1], None, end)
        if start is not None and self._as_typed(first):
            lines[0] = _cut(lines[0], start, None)
        # nested statements: drop the indentation of their first line
        text = "\n".join(
            [lines[0].strip()]
            + [ln[indent:] if ln[:indent].isspace() else ln.lstrip() for ln in lines[1:]]
        ).rstrip()
        return _capped(text)

    def _as_typed(self, index: int) -> bool:
        return index < len(self.code_lines) and self.code_lines[index] == self.raw_lines[index]

    def _register(self, node: ast.stmt, depth: int, header_only: bool) -> int:
        index = len(self.out)
        self.out.append(
            Statement(
                index=index,
                line=node.lineno,
                end_line=node.end_lineno or node.lineno,
                source=self._source(node, header_only),
                kind=type(node).__name__,
                depth=depth,
            )
        )
        return index

    def _call(self, role: str, args: list[ast.expr], like: ast.AST) -> ast.Call:
        call = ast.Call(func=ast.Name(id=self.names[role], ctx=ast.Load()), args=args, keywords=[])
        return ast.copy_location(call, like)

    def _enter_stmt(self, index: int, like: ast.stmt) -> ast.stmt:
        call = self._call("enter", [ast.Constant(index)], like)
        node = ast.Expr(value=call)
        ast.copy_location(node, like)
        return ast.fix_missing_locations(node)

    def _enter_then(self, index: int, expr: ast.expr) -> ast.expr:
        """``enter(i) or EXPR``: enter returns None, so the value is EXPR's, evaluated after."""
        call = self._call("enter", [ast.Constant(index)], expr)
        node = ast.BoolOp(op=ast.Or(), values=[call, expr])
        ast.copy_location(node, expr)
        return ast.fix_missing_locations(node)

    # -- the rewrite -----------------------------------------------------------------------
    def block(self, body: list[ast.stmt], depth: int) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in body:
            out.extend(self.statement(node, depth))
        return out

    def statement(self, node: ast.stmt, depth: int) -> list[ast.stmt]:
        if isinstance(node, ast.For):
            index = self._register(node, depth, header_only=True)
            # for T in loop(i, enter(i) or ITER): the iterable is built inside row i and
            # every later next() re-enters row i (hits = iterations + 1, as line profilers count)
            node.iter = ast.fix_missing_locations(
                ast.copy_location(
                    self._call(
                        "loop", [ast.Constant(index), self._enter_then(index, node.iter)], node.iter
                    ),
                    node.iter,
                )
            )
            node.body = self.block(node.body, depth + 1)
            node.orelse = self.block(node.orelse, depth + 1)
            return [node]
        if isinstance(node, (ast.While, ast.If)):
            index = self._register(node, depth, header_only=True)
            node.test = self._enter_then(index, node.test)
            node.body = self.block(node.body, depth + 1)
            if (
                isinstance(node, ast.If)
                and len(node.orelse) == 1
                and isinstance(node.orelse[0], ast.If)
            ):
                # elif: a row of its own at the same depth as the if
                node.orelse = self.statement(node.orelse[0], depth)
            else:
                node.orelse = self.block(node.orelse, depth + 1)
            return [node]
        if isinstance(node, ast.With):
            index = self._register(node, depth, header_only=True)
            node.body = self.block(node.body, depth + 1)
            return [self._enter_stmt(index, node), node]
        if isinstance(node, (ast.Try, *_TRY_STAR)):
            # 'try:' evaluates nothing: no row of its own, only its bodies
            node.body = self.block(node.body, depth + 1)  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                handler.body = self.block(handler.body, depth + 1)
            node.orelse = self.block(node.orelse, depth + 1)  # type: ignore[attr-defined]
            node.finalbody = self.block(node.finalbody, depth + 1)  # type: ignore[attr-defined]
            return [node]
        if isinstance(node, ast.Match):
            index = self._register(node, depth, header_only=True)
            node.subject = self._enter_then(index, node.subject)
            for case in node.cases:
                case.body = self.block(case.body, depth + 1)
            return [node]
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            return [node]  # must stay first in the cell; it does nothing at run time
        # Simple statements, def/class (their bodies run later, charged to the caller),
        # async constructs (only valid inside functions here).
        index = self._register(
            node,
            depth,
            header_only=isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)),
        )
        if isinstance(node, ast.Expr):
            # keep the expression a bare Expr so the runner can still split off the last one
            node.value = self._enter_then(index, node.value)
            return [node]
        return [self._enter_stmt(index, node), node]


_TRY_STAR: tuple[type, ...] = (ast.TryStar,) if hasattr(ast, "TryStar") else ()


def _cut(line: str, start: int | None, end: int | None) -> str:
    """``line[start:end]`` in UTF-8 bytes, as the ast counts columns."""
    return line.encode()[start:end].decode(errors="replace")
