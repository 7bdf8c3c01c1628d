"""The shared cell runner without a shell: a script's cell, a plain dict for its namespace and
plain Python's compiler (``PythonCompiler``), as ``gpumagic.memfit(source, globals())`` and
the tests' real runs use it. The magics' path, through IPython, is in ``test_cell.py``."""

from __future__ import annotations

import builtins

import pytest


class _Entries:
    """A probe that records which statement starts, in order."""

    def __init__(self) -> None:
        self.entered: list[int] = []

    def enter(self, index: int) -> None:
        self.entered.append(index)


def test_a_cell_runs_in_a_plain_dict_without_a_shell():
    from gpumagic.cell import PythonCompiler, execute, prepare

    ns: dict = {}
    prepared = prepare(PythonCompiler(), "x = 1\ny = x + 1\ny * 10\n", None)
    assert execute(ns, prepared) == 20  # the trailing expression's value
    assert ns["x"] == 1 and ns["y"] == 2
    assert not [name for name in vars(builtins) if name.startswith("_gpumagic")]


def test_an_instrumented_cell_calls_the_probe_before_each_statement_without_a_shell():
    from gpumagic.cell import PythonCompiler, execute, prepare

    prepared = prepare(PythonCompiler(), "a = 0\nfor i in range(2):\n    a += i\nb = a\n", None, instrument=True)
    assert [s.source for s in prepared.statements] == ["a = 0", "for i in range(2):", "a += i", "b = a"]
    assert [s.line for s in prepared.statements] == [1, 2, 3, 4]  # no magic line: a script's line 1
    probe, ns = _Entries(), {}
    assert execute(ns, prepared, probe) is None
    # each iteration re-enters the loop's own row, then its body
    assert probe.entered == [0, 1, 2, 1, 2, 1, 3]
    assert ns["b"] == 1
    assert not [name for name in vars(builtins) if name.startswith("_gpumagic")]


def test_a_script_cells_traceback_shows_its_own_lines():
    import traceback

    from gpumagic.cell import PythonCompiler, execute, prepare

    prepared = prepare(PythonCompiler("script"), "a = 1\nb = a / 0\n", "%%header")
    with pytest.raises(ZeroDivisionError) as info:
        execute({}, prepared)
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert frame.filename == prepared.filename and frame.filename.startswith("<script-")
    assert (frame.lineno, frame.line) == (3, "b = a / 0")  # the header is line 1


def test_a_future_import_applies_to_the_statements_after_it_without_a_shell():
    from gpumagic.cell import PythonCompiler, execute, prepare

    # compiled one statement at a time, as IPython does: the compiler remembers the import
    cell = "from __future__ import annotations\ndef f(x: UndefinedType) -> int:\n    return 1\nf(0)\n"
    assert execute({}, prepare(PythonCompiler(), cell, None)) == 1
    # and none of the caller's (this test module imports annotations from __future__)
    with pytest.raises(NameError):
        execute({}, prepare(PythonCompiler(), "def f(x: UndefinedType) -> int:\n    return 1\n", None))


def test_locals_apart_from_globals_as_in_an_embedded_shell():
    from gpumagic.cell import PythonCompiler, execute, prepare

    glob, loc = {"g": 2}, {}
    assert execute(glob, prepare(PythonCompiler(), "y = g * 3\ny + 1\n", None), local_ns=loc) == 7
    assert loc == {"y": 6} and "y" not in glob


def test_a_statement_that_does_not_compile_stops_the_cell_when_reached_without_a_shell():
    from gpumagic.cell import PythonCompiler, execute, prepare

    prepared = prepare(PythonCompiler(), "x = 1\nreturn 5\nz = 3\n", None, instrument=True)
    assert isinstance(prepared.compile_error, SyntaxError)
    probe, ns = _Entries(), {}
    for _ in range(2):  # a cell run twice (--repeat) fails the same way, with a fresh traceback
        with pytest.raises(SyntaxError, match="'return' outside function") as info:
            execute(ns, prepared, probe)
        assert info.value.lineno == 2
        assert len(info.traceback) == 2  # this test's frame and execute's: nothing piles up
    assert ns["x"] == 1 and "z" not in ns  # the statement before ran; none after
    assert probe.entered == [0, 1, 0, 1]  # the failing statement was entered: a report charges it
    # a dry run wants it before anything runs
    with pytest.raises(SyntaxError, match="'return' outside function"):
        prepare(PythonCompiler(), "x = 1\nreturn 5\n", None, raise_compile_errors=True)


def test_a_parse_error_stops_the_cell_before_anything_runs_without_a_shell():
    from gpumagic.cell import PythonCompiler, prepare

    with pytest.raises(SyntaxError) as info:
        prepare(PythonCompiler(), "x = 1\nprint(3\n", "%%header")
    assert info.value.lineno == 3
    assert "never closed" in info.value.msg  # plain Python's message, not IPython's "incomplete input"
