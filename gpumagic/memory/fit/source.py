"""A cell's source prepared without IPython (``gpumagic.memfit`` from a script): the shared
runner's :func:`gpumagic.cell.prepare` given the few things it asks of a shell, with no
IPython syntax to transform. Tracebacks name the source ``<memfit-N>``, which linecache
holds, so they still show its lines."""

from __future__ import annotations

import ast
import itertools
import linecache
from typing import Any

from gpumagic.cell import PreparedCell, prepare

_numbers = itertools.count(1)


class _Compiler:
    def __init__(self) -> None:
        self._filename_map: dict[str, int] = {}  # read by cell.running_cell_number: no cells here

    def cache(self, text: str, number: int = 0, raw_code: str | None = None) -> str:
        name = f"<memfit-{next(_numbers)}>"
        linecache.cache[name] = (len(text), None, text.splitlines(keepends=True), name)
        return name

    def ast_parse(self, source: str, filename: str = "<unknown>", symbol: str = "exec") -> ast.Module:
        return ast.parse(source, filename, symbol)  # type: ignore[return-value]

    def __call__(self, node: Any, filename: str, mode: str) -> Any:
        return compile(node, filename, mode, dont_inherit=True)


class _ScriptShell:
    ast_node_interactivity = "last_expr"
    execution_count = 0

    def __init__(self) -> None:
        self.compile = _Compiler()

    def transform_cell(self, cell: str) -> str:
        return cell

    def transform_ast(self, tree: ast.Module) -> ast.Module:
        return tree


def prepare_source(source: str) -> PreparedCell:
    """``source`` compiled and instrumented as a cell whose first line is line 1."""
    return prepare(_ScriptShell(), source, None, instrument=True)
