"""Hostile cells and misuse, through a real IPython shell on real torch (issue 21).

Each case here broke a magic once: a kernel killed, a user's profiler destroyed, a cell
failing only under the magic, a report of hundreds of megabytes, the runner's frames in a
traceback. The rule they check is the package's first promise: a cell behaves exactly as
it would without the magic, whatever it holds, and nothing the user has is disturbed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

MAGICS = ["%%memtrace -q", "%%gpuprofile -q"]


@pytest.fixture(autouse=True)
def _torch_imported(ip):
    ip.user_ns["torch"] = torch


def _sources(ip, magic: str) -> dict[int, str]:
    if magic.startswith("%%memtrace"):
        lines = ip.user_ns["_memtrace"].lines
    else:
        lines = ip.user_ns["_gpuprofile"].lines
    return dict(zip(lines["line"].astype(int), lines["source"]))


# -- line numbers: Python's line breaks, not str.splitlines()'s ---------------------------------


@pytest.mark.parametrize("magic", MAGICS)
def test_a_form_feed_line_does_not_shift_the_lines_after_it(ip, run, magic):
    r = run(f"{magic}\na = 1\n\x0c\nb = 2\nc = 3\n")
    assert r.result.success, r.stdout
    assert _sources(ip, magic) == {2: "a = 1", 4: "b = 2", 5: "c = 3"}


# IPython's own transform splits the cell with str.splitlines() and says so, for a plain cell too
@pytest.mark.filterwarnings("ignore:`make_tokens_by_line` received a list of lines")
@pytest.mark.parametrize("magic", MAGICS)
def test_a_line_separator_inside_a_string_is_no_line_break(ip, run, magic):
    assert run('s = "x\u2028y\u2029z\x85"\n').result.success  # a plain cell runs it
    r = run(f'{magic}\ns = "x\u2028y\u2029z\x85"\nb = 2\n')
    assert r.result.success, r.stdout
    assert ip.user_ns["s"] == "x\u2028y\u2029z\x85"
    assert _sources(ip, magic) == {2: 's = "x\u2028y\u2029z\x85"', 3: "b = 2"}


# -- each statement's own source -----------------------------------------------------------------


@pytest.mark.parametrize("magic", MAGICS)
def test_statements_sharing_a_line_each_show_their_own_source(ip, run, magic):
    r = run(f"{magic}\na = 1; b = 2\nfor i in range(2): c = i; d = c\nif a: e = 5\n")
    assert r.result.success, r.stdout
    if magic.startswith("%%memtrace"):
        rows = ip.user_ns["_memtrace"].lines
    else:
        rows = ip.user_ns["_gpuprofile"].lines
    assert list(rows["source"]) == ["a = 1", "b = 2", "for i in range(2):", "c = i", "d = c", "if a:", "e = 5"]


def test_a_long_line_of_statements_gives_a_report_its_statements_size(ip, run):
    """2,000 statements on one 26 KB line made a 104 MB %%memtrace report: every row carried
    the whole line. Each row now carries its statement, so one line costs what 2,000 do."""
    statements = [f"v{i} = {i}" for i in range(2000)]
    sizes = {}
    for layout, body in (("one line", "; ".join(statements)), ("one per line", "\n".join(statements))):
        r = run(f"%%memtrace -q\n{body}\n")
        assert r.result.success, r.stdout[-2000:]
        bundle = ip.user_ns["_memtrace"]._repr_mimebundle_()
        sizes[layout] = sum(len(v) for v in bundle.values() if isinstance(v, str))
        assert ip.user_ns["_memtrace"].lines["source"].iloc[-1] == "v1999 = 1999"
    assert sizes["one line"] < 2 * sizes["one per line"], sizes


def test_a_long_line_of_statements_gives_a_profile_its_statements_size(ip, run):
    statements = [f"v{i} = {i}" for i in range(300)]
    sizes = {}
    for layout, body in (("one line", "; ".join(statements)), ("one per line", "\n".join(statements))):
        r = run(f"%%gpuprofile -q\n{body}\n")
        assert r.result.success, r.stdout[-2000:]
        bundle = ip.user_ns["_gpuprofile"]._repr_mimebundle_()
        sizes[layout] = sum(len(v) for v in bundle.values() if isinstance(v, str))
    assert sizes["one line"] < 2 * sizes["one per line"], sizes


@pytest.mark.parametrize("magic", MAGICS)
def test_a_huge_statement_is_cut_with_a_marker(ip, run, magic):
    from gpumagic.cell import SOURCE_LIMIT

    literal = "[" + ", ".join(str(i) for i in range(3000)) + "]"
    r = run(f"{magic}\nbig = {literal}\nn = len(big)\n")
    assert r.result.success, r.stdout[-2000:]
    assert ip.user_ns["n"] == 3000
    source = _sources(ip, magic)[2]
    assert source.startswith("big = [0, 1, 2")
    more = len(f"big = {literal}") - SOURCE_LIMIT
    assert source.endswith(f" … ({more:,} more characters)")
    assert len(source) < SOURCE_LIMIT + 40


# -- compiled as IPython compiles a plain cell -----------------------------------------------------

COMPILE_CASES = {
    "a docstring, then a __future__ import": '"""A cell with a docstring."""\nfrom __future__ import annotations\ndef f(x: Undefined) -> int:\n    return 1\nresult = f(0)\n',
    "global after an assignment": "gx = 1\nglobal gx\nresult = gx + 1\n",
    "a __future__ import after a statement": "y = 1\nfrom __future__ import annotations\nresult = y\n",
}


@pytest.mark.parametrize("case", list(COMPILE_CASES))
@pytest.mark.parametrize("magic", MAGICS)
def test_a_cell_ipython_runs_runs_under_the_magic(ip, run, magic, case):
    body = COMPILE_CASES[case]
    plain = run(body)
    assert plain.result.success, plain.stdout  # what IPython itself accepts
    expected = ip.user_ns.pop("result")
    r = run(f"{magic}\n{body}")
    assert r.result.success, r.stdout
    assert ip.user_ns["result"] == expected


# IPython parses the whole cell, then compiles and runs one top-level statement at a time
# (InteractiveShell.run_ast_nodes): a parse error stops the cell before its first line, a
# statement that parses but does not compile stops it when reached (issue 25, item 16)


@pytest.mark.parametrize("magic", MAGICS)
def test_a_parse_error_stops_the_cell_before_its_first_line(ip, run, magic):
    ip.user_ns.pop("ran", None)
    assert "ran" not in ip.user_ns and not run("ran = True\nprint(3\n").result.success
    r = run(f"{magic}\nran = True\nprint(3\n")
    assert isinstance(r.result.error_in_exec, SyntaxError)
    assert "ran" not in ip.user_ns


UNCOMPILABLE = {
    "return": "return 5\nx_after = 2\n",
    "yield": "yield 5\nx_after = 2\n",
    "yield as the cell's value": "(yield)\n",
    "break": "break\nx_after = 2\n",
    "continue": "continue\nx_after = 2\n",
    "return in a loop's body": "for i in range(2):\n    x_after = i\n    return i\n",
    "nonlocal at top level": "nonlocal q\nx_after = 2\n",
}
_SET = ("x_ret", "x_list", "x_after")


def _plain_and_magic(ip, run, magic: str, body: str):
    """The cell run plain, then under ``magic``: (names set, error, its text as shown) each."""
    outcomes = []
    for cell in (body, f"{magic}\n{body}"):
        for name in _SET:
            ip.user_ns.pop(name, None)
        r = run(cell)
        error = r.result.error_before_exec or r.result.error_in_exec
        shown = r.plain_stdout.strip()
        outcomes.append(({n: ip.user_ns[n] for n in _SET if n in ip.user_ns}, error, shown))
    return outcomes


def _assert_same_stop(plain, magic) -> None:
    """The same names set, the same error shown, one line further down under the magic (its
    own line is line 1)."""
    (plain_ns, plain_error, plain_shown), (ns, error, shown) = plain, magic
    assert ns == plain_ns == {"x_ret": 1, "x_list": [1]}, shown
    assert type(error) is type(plain_error) is SyntaxError
    assert (error.msg, error.lineno) == (plain_error.msg, plain_error.lineno + 1)
    where = re.compile(r"Cell In\[\d+\], line (\d+)")
    assert int(where.search(shown).group(1)) == int(where.search(plain_shown).group(1)) + 1
    assert where.sub("", shown) == where.sub("", plain_shown)  # the rest of the display alike


@pytest.mark.parametrize("case", list(UNCOMPILABLE))
@pytest.mark.parametrize("magic", MAGICS)
def test_a_statement_that_does_not_compile_stops_the_cell_where_a_plain_cell_stops(ip, run, magic, case):
    body = "x_ret = 1\nx_list = [x_ret]\n" + UNCOMPILABLE[case]
    _assert_same_stop(*_plain_and_magic(ip, run, magic, body))


def test_the_report_charges_a_compile_error_to_its_statement(ip, run):
    r = run("%%memtrace\nx_ret = 1\nreturn 5\n")
    assert isinstance(r.result.error_in_exec, SyntaxError)
    t = ip.user_ns["_memtrace"]
    assert t.statements[t.error_index].source == "return 5"
    assert t.error == "SyntaxError: 'return' outside function"  # no internal file name


@pytest.mark.parametrize("magic", MAGICS)
def test_a_top_level_await_with_autoawait_off_stops_where_a_plain_cell_stops(ip, run, magic):
    was = ip.autoawait
    ip.autoawait = False
    try:
        body = "import asyncio\nx_ret = 1\nx_list = [x_ret]\nawait asyncio.sleep(0)\nx_after = 2\n"
        _assert_same_stop(*_plain_and_magic(ip, run, magic, body))
    finally:
        ip.autoawait = was


@pytest.mark.parametrize("magic", MAGICS)
def test_a_top_level_await_under_a_magic_is_the_plain_pythons_compile_error(ip, run, magic):
    # with autoawait (IPython's default) a plain cell runs as a coroutine; a magic is called
    # synchronously, so its cell meets the await as plain Python does: after the lines before
    assert ip.autoawait
    body = "import asyncio\nx_ret = 1\nx_list = [x_ret]\nawait asyncio.sleep(0)\nx_after = 2\n"
    (plain_ns, plain_error, _), (ns, error, shown) = _plain_and_magic(ip, run, magic, body)
    assert plain_error is None and plain_ns == {"x_ret": 1, "x_list": [1], "x_after": 2}
    assert ns == {"x_ret": 1, "x_list": [1]}
    assert isinstance(error, SyntaxError) and error.msg == "'await' outside function"
    assert re.search(r"Cell In\[\d+\], line 5", shown), shown


# -- tracebacks: the cell's frames, as a plain cell shows them ------------------------------------


def _frames(text: str) -> list[str]:
    """The frame headers of a formatted traceback, in order ("Cell In[7], line 3", "File ...")."""
    return re.findall(r"^\s*(Cell In\[\d+\], line \d+|File .*?:\d+)", text, re.M)


def _below_the_cell(text: str) -> list[str]:
    """The frames from the cell's own first frame (line 2 or later) down to the innermost."""
    frames = _frames(text)
    for k, frame in enumerate(frames):
        m = re.match(r"Cell In\[\d+\], line (\d+)", frame)
        if m and int(m.group(1)) >= 2:
            return frames[k:]
    raise AssertionError(f"no frame of the cell's body in:\n{text}")


SELF_INTERRUPT = (
    "import os, signal, threading\n"
    "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
    "while True: pass\n"
)
FOR_HEADER = "d = {1: 1}\nfor k in d: d[k + 1] = 1\n"
GENERATOR = "def gen():\n    yield 1\n    raise ValueError('from the generator')\nfor x in gen(): pass\n"


@pytest.fixture(params=["Context", "Plain", "Verbose"])
def xmode(ip, request):
    ip.run_line_magic("xmode", request.param)
    yield request.param
    ip.run_line_magic("xmode", "Context")


@pytest.mark.parametrize(
    "cell, error, lines",
    [
        (SELF_INTERRUPT, KeyboardInterrupt, [4]),
        (FOR_HEADER, RuntimeError, [3]),
        (GENERATOR, ValueError, [5, 4]),  # the for line, then the generator's raise
    ],
    ids=["Ctrl-C in while True: pass", "dict changed in a for header", "a generator fails"],
)
@pytest.mark.parametrize("magic", ["%%memtrace", "%%gpuprofile -q"])
def test_a_failing_cell_shows_the_frames_a_plain_cell_shows(ip, run, xmode, magic, cell, error, lines):
    plain = run(cell)
    assert isinstance(plain.result.error_in_exec, error)
    r = run(f"{magic}\n{cell}")
    assert isinstance(r.result.error_in_exec, error)
    text = r.plain_stdout
    below = _below_the_cell(text)
    assert [_line(f) for f in below] == lines, text
    # the plain cell's frames, one line up (it has no magic line)
    assert [_line(f) for f in _frames(plain.plain_stdout)] == [n - 1 for n in lines]
    if xmode == "Plain":  # every frame is listed: the magic machinery's above the cell too
        assert not [f for f in below if "gpumagic" in f], text
    else:
        assert not [f for f in _frames(text) if "gpumagic" in f], text


def _line(frame: str) -> int:
    m = re.search(r"line (\d+)$", frame)
    assert m, frame
    return int(m.group(1))


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("this key cannot be printed")


@pytest.mark.parametrize("cell", ["raise Unprintable()\n", "{}[BadRepr()]\n"], ids=["__str__ raises", "a key whose __repr__ raises"])
@pytest.mark.parametrize("magic", ["%%memtrace", "%%gpuprofile"])
def test_an_error_that_cannot_be_printed_shows_the_cells_frames_only(ip, magic, cell, monkeypatch):
    """Issue 21, item 7: the magics' own reading of the error must neither fail, nor add
    frames, nor leave the live view's thread running."""
    import threading

    from IPython.utils.capture import capture_output

    monkeypatch.setenv("GPUMAGIC_LIVE", "display")  # live views with their threads, as in a kernel
    ip.user_ns.update(Unprintable=Unprintable, BadRepr=BadRepr)
    # not stored in the history: IPython's history calls str() on the error itself
    with capture_output() as cap:
        result = ip.run_cell(f"{magic}\nx = 1\n{cell}", store_history=False)
    assert isinstance(result.error_in_exec, (Unprintable, KeyError))
    text = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
    assert not [f for f in _frames(text) if "gpumagic" in f], text
    assert _below_the_cell(text)[-1].endswith("line 3"), text
    assert not [t for t in threading.enumerate() if t.name.startswith("gpumagic-live") and t.is_alive()]


# -- user objects that misbehave ------------------------------------------------------------------

LAZY_PROXY = """
class LazySettings:
    '''Like a lazy settings proxy: asking for its __class__ before setup raises.'''
    @property
    def __class__(self):
        raise RuntimeError("settings are not configured")
settings = LazySettings()
"""


@pytest.mark.parametrize("magic", ["%%memtrace", "%%gpuprofile"])
def test_an_object_whose_class_raises_breaks_no_magic(ip, run, magic):
    assert run(LAZY_PROXY).result.success
    ip.user_ns.pop("_memtrace", None)
    r = run(f"{magic} -q\nlin = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(lin.parameters(), lr=0.1)\ny = lin(torch.ones(2, 4)).sum()\ny.backward()\nz = 3\n")
    assert r.result.success, r.stdout[-3000:]
    assert ip.user_ns["z"] == 3
    if magic == "%%memtrace":
        lines = ip.user_ns["_memtrace"].lines
        assert list(lines["line"]) == [2, 3, 4, 5, 6]
        assert (lines["params_bytes"].dropna() > 0).all()  # the model is still measured
        assert lines["params_bytes"].notna().any()
    else:
        assert "aten::addmm" in set(ip.user_ns["_gpuprofile"].ops["name"])
        assert not ip.user_ns["_gpuprofile"].notes or all(
            "could not" not in n for n in ip.user_ns["_gpuprofile"].notes
        )


def test_an_object_whose_class_raises_leaves_gpuprofile_its_session_facts(ip, run):
    """The session facts (loaders, optimizers, DDP) are read by the namespace's rules: a
    proxy whose ``__class__`` raises is told by its type, not asked, so the rest is read."""
    assert run(LAZY_PROXY).result.success
    r = run(
        "%%gpuprofile -q\n"
        "lin = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(lin.parameters(), lr=0.1)\n"
        "lin(torch.ones(2, 4)).sum().backward()\n"
    )
    assert r.result.success, r.stdout[-3000:]
    live = ip.user_ns["_gpuprofile"].live
    assert live is not None and [o.name for o in live.optimizers] == ["opt"]


LYING_PROXY = """
asked = []
class Claims:
    '''A proxy that says it is a tensor, and records each question put to it.'''
    @property
    def __class__(self):
        return torch.Tensor
    def __getattr__(self, name):
        asked.append(name)
        raise AttributeError(name)
claims = Claims()
"""


def test_an_object_that_claims_to_be_a_tensor_is_asked_nothing_by_the_oom_report(ip, run):
    """The out-of-memory report names who holds memory (the namespace's tensors, and every
    tensor of the heap no name reaches): each object is told by its ``type()``, so a proxy
    that says it is a tensor is neither counted nor asked for its device or storage."""
    assert run(LYING_PROXY).result.success
    r = run("%%memtrace -q\nkeep = torch.ones(2**10)\nhuge = torch.empty(2**45, dtype=torch.uint8)\n")
    assert isinstance(r.result.error_in_exec, RuntimeError)
    oom = ip.user_ns["_memtrace"].oom
    assert oom is not None and "keep" in {h.name for h in oom.holders}
    assert "claims" not in {h.name for h in oom.holders}
    assert ip.user_ns["asked"] == []


def test_a_model_whose_parameters_raise_stops_only_the_model_split(ip, run):
    r = run(
        "%%memtrace -q\n"
        "class Odd(torch.nn.Module):\n"
        "    def parameters(self, recurse=True):\n"
        "        raise RuntimeError('no parameters today')\n"
        "odd = Odd()\n"
        "x = torch.ones(1000)\n"
    )
    assert r.result.success, r.stdout[-3000:]
    assert list(ip.user_ns["_memtrace"].lines["line"]) == [2, 5, 6]


# -- torch runs one profiler per process ---------------------------------------------------------

_OWN_PROFILER = textwrap.dedent(
    """
    import json
    import torch
    from IPython.testing import globalipapp
    globalipapp.start_ipython()
    ip = globalipapp.get_ipython()
    ip.run_cell("%load_ext gpumagic")
    ip.run_cell("import torch")
    cells = {
        "torch.profiler": "with torch.profiler.profile() as p:\\n    y = torch.ones(5) * 2\\n",
        "torch.autograd.profiler": "with torch.autograd.profiler.profile() as p:\\n    y = torch.ones(5) * 2\\n",
        "legacy": "with torch.autograd.profiler_legacy.profile() as p:\\n    y = torch.ones(5) * 2\\n",
        "started": "z = torch.ones(3) + 1\\np = torch.profiler.profile()\\np.start()\\ny = torch.ones(5) * 2\\np.stop()\\n",
    }
    out = {}
    for name, cell in cells.items():
        r = ip.run_cell("%%gpuprofile -q\\n" + cell)
        notes = ip.user_ns["_gpuprofile"].notes if "_gpuprofile" in ip.user_ns else []
        p = ip.user_ns["p"]
        events = len(p.events() if hasattr(p, "events") else p.function_events)
        ip.user_ns.pop("_gpuprofile", None)
        after = ip.run_cell("%%gpuprofile -q\\nw = torch.ones(4) @ torch.ones(4)\\n")
        out[name] = {
            "success": r.success,
            "error": repr(r.error_in_exec),
            "events": events,
            "notes": notes,
            "next profile": after.success and "aten::dot" in set(ip.user_ns["_gpuprofile"].ops["name"]),
            "profiler on": bool(torch.autograd._profiler_enabled()),
        }
    print(json.dumps(out))
    """
)


def test_a_cell_with_its_own_profiler_runs_and_the_kernel_lives(tmp_path):
    """Issue 21, item 1: a %%gpuprofile cell that ran its own torch profiler killed the
    process (segfault in export_chrome_trace after "disableProfiler called but no active
    profiling session found"). In a child process, so that a crash fails this test only."""
    import json

    script = tmp_path / "own_profiler.py"
    script.write_text(_OWN_PROFILER)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for name, got in results.items():
        assert got["success"], (name, got)
        assert got["events"] > 0, (name, got)  # the cell's own profiler recorded its work
        assert any("started a torch profiler of its own at line" in n for n in got["notes"]), got
        assert got["next profile"] and not got["profiler on"], (name, got)


def test_a_running_profiler_is_named_and_left_running(ip, run, tmp_path, monkeypatch):
    """Issue 21, item 2: a %%gpuprofile while the user's profiler ran ended it (0 events)."""
    import tempfile

    from IPython.core.error import UsageError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run("up = torch.profiler.profile()\nup.start()\n").result.success
    try:
        r = run("%%gpuprofile\nx = torch.ones(3) * 2\n")
        err = r.result.error_in_exec
        assert isinstance(err, UsageError), err
        assert "`up`" in str(err) and "up.stop()" in str(err) and "one profiler per process" in str(err)
        assert "x" not in ip.user_ns  # refused: the cell did not run
        assert list(tmp_path.glob("gpumagic-*")) == []  # nothing was made
    finally:
        r = run("y = torch.ones(4) + 1\nup.stop()\nn = len(up.events())\n")
    assert r.result.success and ip.user_ns["n"] > 0  # the user's profile is whole
    assert not torch.autograd._profiler_enabled()


def test_a_running_profiler_the_namespace_does_not_hold_is_refused_too(ip, run):
    from IPython.core.error import UsageError

    assert run("_hidden = torch.autograd.profiler.profile()\n_hidden.__enter__()\n").result.success
    try:
        r = run("%%gpuprofile\nx = 1\n")
        assert isinstance(r.result.error_in_exec, UsageError)
        assert "a torch profiler is running in this process" in str(r.result.error_in_exec)
    finally:
        run("_hidden.__exit__(None, None, None)\n")
    assert run("%%gpuprofile -q\nx = 1\n").result.success


# -- schedule arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, says",
    [
        ("--wait -1", "--wait must be 0 or more"),
        ("--warmup -2", "--warmup must be 0 or more"),
        ("--active -1", "--active must be at least 1"),
        ("--active 0", "--active must be at least 1"),
        ("--wait 1 --active 0", "--active must be at least 1"),
    ],
)
def test_a_schedule_torch_rejects_is_a_usage_error_that_leaves_nothing(ip, run, tmp_path, monkeypatch, options, says):
    import tempfile

    from IPython.core.error import UsageError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = run(f"%%gpuprofile {options}\nx = 1\n")
    err = r.result.error_in_exec
    assert isinstance(err, UsageError), err
    assert says in str(err) and "usage: %%gpuprofile" in str(err)
    assert list(tmp_path.glob("gpumagic-*")) == []
    assert not torch.autograd._profiler_enabled()


# -- --with-stack and the user's profile function -------------------------------------------------


def test_stack_gives_the_users_profile_function_back(ip, run):
    """Issue 21, item 11: torch's with_stack clears sys.setprofile's function when it stops."""
    ip.user_ns["seen"] = []
    assert run("import sys\ndef watch(frame, event, arg):\n    seen.append(event)\nsys.setprofile(watch)\n").result.success
    try:
        r = run("%%gpuprofile --with-stack -q\nx = torch.ones(3) * 2\n")
        assert r.result.success, r.stdout[-3000:]
        assert sys.getprofile() is ip.user_ns["watch"]
        notes = ip.user_ns["_gpuprofile"].notes
        assert any("sys.setprofile function (watch)" in n for n in notes), notes
    finally:
        sys.setprofile(None)


def test_stack_gives_a_running_cprofile_back(ip, run):
    import cProfile

    profiler = cProfile.Profile()
    ip.user_ns["profiler"] = profiler
    profiler.enable()
    try:
        r = run("%%gpuprofile --with-stack -q\nx = torch.ones(3) * 2\n")
        assert sys.getprofile() is profiler
    finally:
        profiler.disable()
    assert r.result.success, r.stdout[-3000:]


# -- run names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "%%gpuprofile -n lambda",
        "%%gpuprofile -n None",
    ],
)
def test_a_keyword_is_no_run_name(ip, run, line):
    from IPython.core.error import UsageError

    r = run(f"{line}\nran = 1\n")
    err = r.result.error_in_exec
    assert isinstance(err, UsageError), err
    assert "not a valid variable name (a Python keyword)" in str(err)
    assert "ran" not in ip.user_ns  # refused before the cell ran


def test_gpuwatch_stop_with_a_stray_word_keeps_watching(ip, run):
    from IPython.core.error import UsageError

    from gpumagic.monitor import current

    assert run("%gpuwatch -i 0.2").result.success
    try:
        r = run("%gpuwatch stop -o watched")  # -o takes no name: it returns the result
        assert isinstance(r.result.error_in_exec, UsageError)
        assert "unrecognized arguments: watched" in str(r.result.error_in_exec)
        assert current() is not None  # still watching: nothing was stopped
        r = run("%gpuwatch stop -o")
        assert r.result.success and ip.user_ns["_gpuwatch"] is r.result.result
    finally:
        ip.run_cell("%gpuwatch stop", store_history=False)


# -- Ctrl-C inside the probe's own bytecode -------------------------------------------------------


class _Range:
    """A stand-in for a profiler range that counts its entries and exits, and can raise
    KeyboardInterrupt as a signal would land: right after the C call returns."""

    interrupt_after: str | None = None

    def __init__(self, name: str) -> None:
        self.name, self.depth, self.unbalanced = name, 0, False

    def __enter__(self) -> None:
        self.depth += 1
        if _Range.interrupt_after == f"enter {self.name}":
            _Range.interrupt_after = None
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self.depth == 0:
            self.unbalanced = True  # an exit with nothing entered: torch asserts
            raise RuntimeError("no guard is set")
        self.depth -= 1
        if _Range.interrupt_after == f"exit {self.name}":
            _Range.interrupt_after = None
            raise KeyboardInterrupt


@pytest.mark.parametrize("at", ["enter 1", "exit 0"])
def test_ctrl_c_inside_a_statement_boundary_leaves_no_range_entered(at):
    """A range left entered crashes the process when collected under a later profiler
    (torch 2.13, _RecordFunctionFast); Ctrl-C during `while True: pass` under %%gpuprofile
    lands inside the probe's enter() most of the time."""
    from gpumagic.instrument import Statement
    from gpumagic.profile.record.probe import CodeProbe

    statements = [Statement(i, i + 2, i + 2, f"x{i} = {i}", "Assign", 0) for i in range(3)]
    ranges: list[_Range] = []

    def factory(name: str) -> _Range:
        ranges.append(_Range(str(len(ranges))))
        return ranges[-1]

    probe = CodeProbe(statements, {}, modules=False, factory=factory)
    probe.enter(0)
    _Range.interrupt_after = at
    with pytest.raises(KeyboardInterrupt):
        probe.enter(1)
    probe.stop()
    assert [r.depth for r in ranges] == [0, 0, 0]  # every range entered was exited
    assert not any(r.unbalanced for r in ranges)  # and none exited twice


_PROBE_SIGINTS = textwrap.dedent(
    """
    import gc, os, signal, threading
    from IPython.testing import globalipapp
    globalipapp.start_ipython()
    ip = globalipapp.get_ipython()
    ip.run_cell("%load_ext gpumagic")
    ip.run_cell("import torch")
    cell = (
        "%%gpuprofile -q\\nimport os, signal, threading\\n"
        "threading.Timer({delay}, os.kill, (os.getpid(), signal.SIGINT)).start()\\n"
        "while True: pass\\n"
    )
    for k in range(12):
        r = ip.run_cell(cell.format(delay=0.05 + 0.011 * k))
        assert isinstance(r.error_in_exec, KeyboardInterrupt), r.error_in_exec
        ip.user_ns.pop("_gpuprofile", None)
        gc.collect()  # a range left entered would be destroyed here, under the next profile
        assert ip.run_cell("%%gpuprofile -q\\nx = torch.ones(8) * 2\\n").success
        gc.collect()
    print("survived")
    """
)


def test_ctrl_c_in_a_tight_loop_under_gpuprofile_does_not_crash_later(tmp_path):
    """In a child process: the crash, when it comes, is a segfault in a later collection."""
    script = tmp_path / "probe_sigints.py"
    script.write_text(_PROBE_SIGINTS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert out.stdout.strip().endswith("survived")
