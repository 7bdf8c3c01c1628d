"""Each magic's help comes from its argument parser: ``%memtrace?`` (IPython's inspector)
and ``-h`` on the magic's line list every option with its help; a misspelt option is named
in the error; the option names follow IPython's, torch.profiler's, nvidia-smi's and nvitop's
where they overlap, each option with one spelling; ``-o`` works as ``%timeit -o``."""

from __future__ import annotations

import argparse
import re
import threading

import pytest
from IPython.core.error import UsageError

from gpumagic.magics import env, memfit, memtrace, profile, select, watch

PARSERS = {
    "%memtrace": memtrace.PARSER,
    "%%memtrace": memtrace.PARSER,
    "%gpuprofile": profile.PARSER,
    "%%gpuprofile": profile.PARSER,
    "%gpuwatch": watch.PARSER,
    "%gpuselect": select.PARSER,
    "%gpuenv": env.PARSER,
    "%%memfit": memfit.PARSER,
}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _assert_lists_every_option(text: str, parser: argparse.ArgumentParser) -> None:
    flat = _flat(text)
    for action in parser._actions:
        assert action.help, f"{parser.prog}: {action.option_strings or action.dest} has no help"
        for option in action.option_strings:
            assert re.search(rf"(^|[\s\[,]){re.escape(option)}([\s,\]=]|$)", text), option
        # the help text itself, as argparse prints it ("%%" is a literal "%")
        assert _flat(action.help.replace("%%", "%")) in flat, (parser.prog, action.help)


@pytest.mark.parametrize("magic", list(PARSERS))
def test_inspector_lists_every_option_with_its_help(ip, magic: str) -> None:
    text = ip.object_inspect_text(magic)
    _assert_lists_every_option(text, PARSERS[magic])
    assert f"usage: {PARSERS[magic].prog}" in text
    # the hand-written part stays: what the result holds
    prose = {
        "%memtrace": ".lines",
        "%gpuprofile": ".findings",
        "%gpuwatch": ".cells",
        "%gpuselect": "c.indices",
        "%gpuenv": "_gpuenv",
        "%memfit": ".peak_bytes",
    }
    assert prose["%" + magic.lstrip("%")] in text


def test_pinfo_shows_the_same_help(ip, capsys) -> None:
    from IPython.core import page

    shown: list[str] = []
    saved = page.page
    page.page = lambda data, *a, **kw: shown.append(data["text/plain"] if isinstance(data, dict) else data)
    try:
        ip.run_line_magic("pinfo", "%gpuwatch")
    finally:
        page.page = saved
    text = "".join(shown) or capsys.readouterr().out
    _assert_lists_every_option(text, watch.PARSER)


def test_every_form_of_a_magic_is_in_its_usage(ip) -> None:
    assert "%memtrace [options] STATEMENT" in ip.object_inspect_text("%memtrace")
    text = ip.object_inspect_text("%gpuprofile")
    assert "%gpuprofile --compare A B" in text and "%gpuprofile --load PATH" in text


@pytest.mark.parametrize(
    ("line", "ran"),
    [
        ("%%memtrace -h\nran = 1\n", "ran"),
        ("%%memtrace --device host --help\nran = 1\n", "ran"),
        ("%memtrace -h ran = 1", "ran"),
        ("%%gpuprofile --help\nran = 1\n", "ran"),
        ("%gpuenv -h", "_gpuenv"),
        ("%gpuselect -h", None),
        ("%gpuwatch stop -h", None),
    ],
)
def test_help_on_the_line_prints_the_help_and_runs_nothing(ip, run, line, ran) -> None:
    ip.user_ns.pop("_gpuenv", None)
    r = run(line)
    assert r.result.success, r.result.error_in_exec
    magic = line.split()[0].lstrip("%")
    _assert_lists_every_option(r.plain_stdout, PARSERS["%" + magic])
    assert r.result.result is None and not r.outputs
    if ran:
        assert ran not in ip.user_ns


def test_help_starts_no_watch(run) -> None:
    r = run("%gpuwatch -h -i 0.2")
    assert r.result.success and "usage: %gpuwatch" in r.plain_stdout
    assert not [t for t in threading.enumerate() if t.name == "gpumagic-watch"]


@pytest.mark.parametrize(
    ("line", "named", "suggested"),
    [
        ("%gpuwatch --intervall 1", "--intervall", "--interval"),
        ("%gpuwatch stop --outptu x", "--outptu", "--output"),
        ("%%gpuprofile --profil-memory\nx = 1\n", "--profil-memory", "--profile-memory"),
        ("%%memtrace --devcie host\nx = 1\n", "--devcie", "--device"),
        ("%memtrace --sycn x = 1", "--sycn", "--sync"),
        ("%gpuselect --min-fee 1GiB", "--min-fee", "--min-free-memory"),
        ("%gpuenv --frezee reqs.txt", "--frezee", "--freeze"),
    ],
)
def test_a_misspelt_option_is_named_with_the_nearest_one(run, line, named, suggested) -> None:
    r = run(line)
    err = r.result.error_in_exec
    assert isinstance(err, UsageError), r.stdout
    message = str(err).splitlines()[0]
    assert named in message and f"did you mean {suggested}" in message, message
    assert "invalid choice" not in message  # not blamed on the value after it
    assert not [t for t in threading.enumerate() if t.name == "gpumagic-watch"]


def test_values_that_look_like_options_are_values() -> None:
    # a negative number after an option is its value, as argparse reads it
    opts = profile.PARSER.parse_line("--wait -1 --rows 3")
    assert opts is not None and opts.wait == -1 and opts.rows == 3


@pytest.mark.parametrize(
    ("line", "named", "suggested"),
    [
        # the spellings of earlier versions, which never shipped, are gone
        ("%%gpuprofile --memory\nx = 1\n", "--memory", "--profile-memory"),
        ("%%gpuprofile --shapes\nx = 1\n", "--shapes", "--record-shapes"),
        ("%%gpuprofile --stack\nx = 1\n", "--stack", "--with-stack"),
        ("%%gpuprofile --flops\nx = 1\n", "--flops", "--with-flops"),
        ("%gpuselect --max-util 30", "--max-util", "--max-gpu-utilization"),
        # argparse's abbreviations are second spellings too
        ("%gpuselect --min-free 8GiB", "--min-free", "--min-free-memory"),
        ("%%gpuprofile --keep-f\nx = 1\n", "--keep-f", "--keep-first"),
        # nvidia-smi's and nvisel's names: their help names the option they are
        ("%gpuwatch -l 0.5", "-l", "--interval"),
        ("%gpuwatch --loop 0.5", "--loop", "--interval"),
        ("%gpuwatch -f gpu.csv", "-f", "--log"),
        ("%gpuwatch --filename gpu.csv", "--filename", "--log"),
        ("%gpuwatch --id 0,1", "--id", "--gpus"),
        ("%gpuselect -n 2", "-n", "N"),
    ],
)
def test_an_option_has_one_spelling(ip, run, line, named, suggested) -> None:
    r = run(line.replace("\nx = 1", "\nran = 1"))
    err = r.result.error_in_exec
    assert isinstance(err, UsageError), r.stdout
    message = str(err).splitlines()[0]
    assert f"unrecognized arguments: {named} (did you mean {suggested}?)" in message, message
    assert "ran" not in ip.user_ns
    assert not [t for t in threading.enumerate() if t.name == "gpumagic-watch"]


def test_nvisels_short_options_are_the_long_ones() -> None:
    long = select.PARSER.parse_line("2 --min-free-memory 8GiB --max-gpu-utilization 30")
    assert long == select.PARSER.parse_line("2 -f 8GiB -G 30")


def test_gpuselect_takes_n_as_its_first_word(run, monkeypatch) -> None:
    import gpumagic.monitor.choose as choose

    seen: list[int] = []

    def fake_select(count, **kw):
        seen.append(count)

    monkeypatch.setattr(choose, "select_gpus", fake_select)
    run("%gpuselect 2")
    run("%gpuselect")
    assert seen == [2, 1]


# -- -o as %timeit -o ----------------------------------------------------------------------------
def test_memtrace_o_returns_the_trace_as_the_cells_value(ip, run) -> None:
    from cell_outputs import run_showing

    from gpumagic.memory.trace.result import MemTrace

    out = run_showing(ip, run, "%%memtrace -o\nblock = [0] * 10_000\nlen(block)\n")
    assert out.result.success, out.result.error_in_exec
    assert isinstance(out.value, MemTrace) and out.value is ip.user_ns["_memtrace"]
    # shown once, as Out[], not also in the live view's place
    assert len(out.reports("memtrace")) == 1 and out.out and not out.displayed


def test_memtrace_line_o_returns_the_trace_and_runs_the_statement(ip, run) -> None:
    from gpumagic.memory.trace.result import MemTrace

    r = run("t = %memtrace -o y = sum(range(10))")
    assert r.result.success, r.result.error_in_exec
    assert isinstance(ip.user_ns["t"], MemTrace) and ip.user_ns["y"] == 45
    assert not r.outputs  # kept quietly, as `t = %timeit -o ...`


@pytest.mark.parametrize(
    "line",
    ["%%memtrace -o kept", "%%memfit -o kept", "%%gpuprofile -o kept", "%%gpuprofile -q -o kept -n a"],
)
def test_o_takes_no_name(ip, run, line) -> None:
    # one meaning: -o returns the result; a name after it is refused before the cell runs
    r = run(f"{line}\nran = 1\n")
    err = r.result.error_in_exec
    assert isinstance(err, UsageError) and "unrecognized arguments: kept" in str(err), err
    assert "ran" not in ip.user_ns and "kept" not in ip.user_ns


def test_memfit_o_returns_the_prediction_as_the_cells_value(ip, run) -> None:
    from gpumagic.memory.fit.result import MemFit

    cell = "import torch\nw = torch.ones(256, 256)\ny = w @ w\n"
    r = run("%%memfit -o\n" + cell)
    assert r.result.success, r.result.error_in_exec
    assert isinstance(r.result.result, MemFit) and r.result.result is ip.user_ns["_memfit"]
    assert r.result.result.peak_bytes > 0
    r = run("%%memfit -q -o\n" + cell)  # -q shows nothing; -o still returns the prediction
    assert r.result.success and r.outputs == []
    assert isinstance(r.result.result, MemFit) and r.result.result is ip.user_ns["_memfit"]
    assert run("%%memfit -q\n" + cell).result.result is None


def test_gpuprofile_o_returns_the_profile(ip, run) -> None:
    from gpumagic.profile.result import ProfileResult

    r = run("%%gpuprofile -o --rows 3\nimport torch\nw = torch.ones(64, 64) @ torch.ones(64, 64)\n")
    assert r.result.success, r.result.error_in_exec
    assert isinstance(r.result.result, ProfileResult) and r.result.result.display_rows == 3
    assert not [b for b in r.bundles if 'gpumagic-profile"' in b.get("text/html", "")]


def test_gpuwatch_o_returns_the_watcher(ip, run) -> None:
    from gpumagic.monitor import Watcher, current

    r = run("%gpuwatch -o -i 0.2")
    try:
        assert isinstance(r.result.result, Watcher) and r.result.result is current()
    finally:
        run("%gpuwatch stop")
