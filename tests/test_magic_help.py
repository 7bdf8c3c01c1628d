"""Each magic's help comes from its argument parser: ``%memtrace?`` (IPython's inspector)
and ``-h`` on the magic's line list every option with its help; a misspelt option is named
in the error; the option names follow IPython's, torch.profiler's, nvidia-smi's and nvitop's
where they overlap, the old spellings still accepted; ``-o`` works as ``%timeit -o``."""

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
        ("%gpuselect --min-fee 1GiB", "--min-fee", "--min-free"),
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
    # a unique prefix of a long option still works, as argparse allows
    opts = profile.PARSER.parse_line("--keep --no-attr")
    assert opts is not None and opts.keep_first and opts.no_attribution


@pytest.mark.parametrize(
    ("parser", "old", "new"),
    [
        (profile.PARSER, "--memory --shapes --stack --flops", "--profile-memory --record-shapes --with-stack --with-flops"),
        (watch.PARSER, "-i 0.5 --log a.csv --gpus 0,1", "-l 0.5 -f a.csv --id 0,1"),
        (watch.PARSER, "-i 0.5 --log a.csv", "--loop 0.5 --filename a.csv"),
        (select.PARSER, "2 --min-free 8GiB --max-util 30", "2 -f 8GiB -G 30"),
        (select.PARSER, "--min-free 8GiB --max-util 30", "--min-free-memory 8GiB --max-gpu-utilization 30"),
    ],
)
def test_old_spellings_and_the_conventional_names_mean_the_same(parser, old, new) -> None:
    assert parser.parse_line(old) == parser.parse_line(new)


def test_gpuselect_takes_n_as_nvisel_does(run, monkeypatch) -> None:
    import gpumagic.monitor.choose as choose

    seen: list[int] = []

    def fake_select(count, **kw):
        seen.append(count)

    monkeypatch.setattr(choose, "select_gpus", fake_select)
    run("%gpuselect -n 3")
    run("%gpuselect 2")
    assert seen == [3, 2]
    r = run("%gpuselect 2 -n 3")
    assert isinstance(r.result.error_in_exec, UsageError) and "give N once" in str(r.result.error_in_exec)


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


def test_memtrace_o_name_still_stores_and_keeps_the_cells_value(ip, run) -> None:
    from gpumagic.memory.trace.result import MemTrace

    r = run("%%memtrace -o kept\nz = 2\nz * 21\n")
    assert r.result.success
    assert isinstance(ip.user_ns["kept"], MemTrace) and r.result.result == 42


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
