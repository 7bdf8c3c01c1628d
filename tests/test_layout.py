"""The tree stays one a reader can hold in mind (issue 15): no package module over 600 lines,
no function in the cores over 80 lines unless a comment at its top says why it stays whole.

A long function is allowed when splitting it would hurt (a hot loop, a decoder that must
touch every event once): the comment saying so starts with ``# Kept whole:`` on one of the
first lines of its body, where the next reader sees it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gpumagic

PACKAGE = Path(gpumagic.__file__).parent
CORES = ("memory", "profile", "monitor", "environment")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
KEPT_WHOLE = "# Kept whole:"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        length = (node.end_lineno or node.lineno) - first + 1
        if length <= limit:
            continue
        body_start = node.body[0].lineno
        head = lines[node.lineno - 1 : body_start + 4]  # the signature, the docstring's start
        if any(line.strip().startswith(KEPT_WHOLE) for line in head):
            continue
        found.append((node.name, length))
    return found


def test_the_check_sees_a_long_function() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(5))
    assert long_functions(f"def f():\n{body}", limit=4) == [("f", 6)]
    kept = f"def f():\n    {KEPT_WHOLE} one pass over the events\n{body}"
    assert long_functions(kept, limit=4) == []


def test_no_module_over_600_lines() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the package was found
    long = {
        str(f.relative_to(PACKAGE)): n
        for f in files
        if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_magics_are_glue_under_1000_lines() -> None:
    """``magics/`` parses, runs and shows: what a core, a renderer or the option language
    (gpumagic/usage.py) can hold lives there (issue 28: 1,362 lines before)."""
    lines = sum(len(p.read_text().splitlines()) for p in (PACKAGE / "magics").glob("*.py"))
    assert lines < 1000, lines


def test_no_core_function_over_80_lines_unless_kept_whole_on_purpose() -> None:
    offences = {}
    for core in CORES:
        for f in sorted((PACKAGE / core).rglob("*.py")):
            if found := long_functions(f.read_text(encoding="utf-8")):
                offences[str(f.relative_to(PACKAGE))] = found
    assert offences == {}


ROOT = PACKAGE.parent


def _tree_block() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    start = text.index("```\ngpumagic/")
    return text[start : text.index("```", start + 3)]


def test_contributing_names_every_package_and_only_modules_that_exist() -> None:
    """CONTRIBUTING.md's tree matches the tree: each subpackage is named in it, and each
    module it names exists (so a move that forgets the map fails here)."""
    import re

    block = _tree_block()
    packages = sorted(p.parent.relative_to(PACKAGE) for p in PACKAGE.rglob("__init__.py"))
    missing = [str(p) for p in packages if str(p) != "." and f"{p.name}/" not in block]
    assert missing == []
    named = set(re.findall(r"\b([a-z_]+\.py)\b", block))
    existing = {p.name for p in PACKAGE.rglob("*.py")}
    assert named - existing == set()
    assert len(named) > 30  # the map was read


def _room(block: str, room: str) -> str:
    """The lines of the map under ``  room/``, up to the next entry of the package's top."""
    import re

    start = block.index(f"\n  {room}/")
    following = re.search(r"\n  [^ ]", block[start + 1 :])
    return block[start : start + 1 + following.start()] if following else block[start:]


def test_contributing_names_every_module_of_memory_monitor_and_namespace() -> None:
    """The map of ``memory/`` (the engine both memory magics run on, and the two magics), of
    ``monitor/`` (one watcher over its sources) and of ``namespace/`` names every module and
    subpackage they hold: a room shows its engine only if its map does (issue 28)."""
    block = _tree_block()
    for room in ("memory", "monitor", "namespace"):
        text = _room(block, room)
        unnamed = [
            str(p.relative_to(PACKAGE))
            for p in sorted((PACKAGE / room).rglob("*"))
            if (p.suffix == ".py" and p.name != "__init__.py" and p.name not in text)
            or (p.is_dir() and p.name != "__pycache__" and f"{p.name}/" not in text)
        ]
        assert unnamed == [], room
