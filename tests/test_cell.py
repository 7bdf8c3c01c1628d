"""The shared cell runner, through %%memtrace: a cell behaves exactly as without the magic."""

from __future__ import annotations

import builtins
import re
import sys

import pytest


def test_variables_land_in_user_namespace_and_nothing_else(ip, run):
    before_builtins = set(vars(builtins))
    r = run("%%memtrace -q\na = 1\nb = a + 1\n")
    assert r.result.success
    assert ip.user_ns["a"] == 1 and ip.user_ns["b"] == 2
    assert not [k for k in ip.user_ns if "gpumagic_enter" in k or "gpumagic_loop" in k]
    assert set(vars(builtins)) - before_builtins == set()


def test_last_expression_is_returned_and_shown(ip, run):
    r = run("%%memtrace -q\nx = 20\nx + 22\n")
    assert r.result.result == 42
    assert ip.user_ns["Out"][r.result.execution_count] == 42


def test_trailing_semicolon_silences_output(ip, run):
    r = run("%%memtrace -q\nx = 20\nx + 22;\n")
    assert r.result.success
    assert r.result.result is None
    assert r.result.execution_count not in ip.user_ns["Out"]


def test_no_last_expression_returns_none(run):
    r = run("%%memtrace -q\nx = 1\n")
    assert r.result.result is None


def test_ipython_syntax_inside_the_cell(ip, run, capfd):
    r = run("%%memtrace -q\nout = !echo hello-from-shell\n%alias_magic gmtest_alias time\nn = len(out)\n")
    assert r.result.success, r.stdout
    assert ip.user_ns["out"][0] == "hello-from-shell"
    assert ip.user_ns["n"] == 1
    rows = ip.user_ns["_memtrace"].lines
    # the raw source is shown, as typed, not the transformed get_ipython() call
    assert "out = !echo hello-from-shell" in list(rows["source"])


def test_traceback_shows_cell_source_and_notebook_line_numbers(run):
    r = run("%%memtrace -q\nx = 1\ndef f():\n    return 1 / 0\nf()\n")
    err = r.result.error_in_exec
    assert isinstance(err, ZeroDivisionError)
    out = r.plain_stdout
    # the magic's line is line 1, so f() is line 5 and the division line 4
    assert re.search(r"Cell In\[\d+\], line 5", out), out
    assert "----> 5 f()" in out
    assert "----> 4     return 1 / 0" in out
    # shown once, and none of the runner's own frames
    assert out.count("ZeroDivisionError: division by zero") == 1
    assert "gpumagic/cell.py" not in out and "gpumagic/magics" not in out


def test_error_on_first_body_line_is_line_2(run):
    r = run("%%memtrace -q\nundefined_name_xyz\n")
    assert isinstance(r.result.error_in_exec, NameError)
    assert re.search(r"Cell In\[\d+\], line 2", r.plain_stdout)


def _normalise_syntax(text: str) -> str:
    text = re.sub(r"Cell In\[\d+\], line \d+", "Cell In[N], line L", text)
    return text.strip()


def test_syntax_error_is_reported_as_ipython_reports_one(run):
    plain = run("x = 1\nprint(3\n")
    magic = run("%%memtrace\nx = 1\nprint(3\n")
    assert isinstance(magic.result.error_in_exec, SyntaxError)
    assert "run_cell_magic" not in magic.plain_stdout
    assert _normalise_syntax(plain.plain_stdout) == _normalise_syntax(magic.plain_stdout)
    # and it points at the notebook's line: 3 with the magic line counted
    assert re.search(r"Cell In\[\d+\], line 3", magic.plain_stdout), magic.plain_stdout


def test_no_settrace_inside_the_cell(ip, run):
    run("%%memtrace -q\nimport sys\ntracer = sys.gettrace()\n")
    assert ip.user_ns["tracer"] is sys.gettrace()


def test_unload_removes_magics_and_reload_works(ip, run):
    run("%unload_ext gpumagic")
    r = run("%%memtrace\nx = 1\n")
    assert not r.result.success
    assert "not found" in str(r.result.error_in_exec)
    assert "memtrace" not in ip.magics_manager.magics["cell"]
    run("%load_ext gpumagic")
    r = run("%%memtrace -q\nx = 1\n")
    assert r.result.success


@pytest.mark.parametrize(
    "line, expected",
    [
        ("%%memtrace --bogus\nx = 1\n", "unrecognized"),
        # -o returns the result, as %timeit -o does (test_magic_help.py): it takes no name
        ("%%memtrace -o kept\nx = 1\n", "unrecognized arguments: kept"),
        ("%%memtrace stray words\nx = 1\n", "unrecognized arguments"),
        ("%memtrace --bogus x = 1", "unrecognized option"),
        ("%memtrace", "give a statement"),
    ],
)
def test_bad_arguments_raise_usage_error_with_usage(run, line, expected):
    from IPython.core.error import UsageError

    r = run(line)
    assert isinstance(r.result.error_in_exec, UsageError)
    text = str(r.result.error_in_exec)
    assert expected in text
    assert "usage: %%memtrace" in text


def test_unknown_device_names_the_devices_there_are(run):
    from IPython.core.error import UsageError

    r = run("%%memtrace --device cuda:7\nx = 1\n")
    assert isinstance(r.result.error_in_exec, UsageError)
    assert "cuda:7" in str(r.result.error_in_exec)
    assert "devices here: host" in str(r.result.error_in_exec)


def test_exception_propagates_once_and_kernel_keeps_working(ip, run):
    r = run("%%memtrace -q\nraise KeyError('boom')\n")
    assert isinstance(r.result.error_in_exec, KeyError)
    assert r.plain_stdout.count("KeyError: 'boom'") == 1
    r = run("%%memtrace -q\nfine = True\n")
    assert r.result.success and ip.user_ns["fine"] is True


def test_ast_node_interactivity_is_honoured(ip, run):
    old = ip.ast_node_interactivity
    try:
        ip.ast_node_interactivity = "last_expr_or_assign"
        assert run("%%memtrace -q\nx = 6\ny = x * 7\n").result.result == 42
        ip.ast_node_interactivity = "none"
        assert run("%%memtrace -q\n6 * 7\n").result.result is None
    finally:
        ip.ast_node_interactivity = old


def test_future_imports_of_the_cell_apply(ip, run):
    r = run("%%memtrace -q\nfrom __future__ import annotations\ndef f(x: UndefinedType) -> int:\n    return 1\nf(0)\n")
    assert r.result.success, r.stdout
    assert r.result.result == 1
