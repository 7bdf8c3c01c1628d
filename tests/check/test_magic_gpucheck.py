"""%gpucheck through a real shell on this machine: the report shown once and kept in
``_gpucheck``, ``-o`` as ``%timeit -o``, ``gpumagic.gpucheck()`` for scripts, its options and
their errors, its help from the parser."""

from __future__ import annotations

import re

import pytest
from cell_outputs import run_showing
from IPython.core.error import UsageError

import gpumagic
from gpumagic.environment.check import last_check
from gpumagic.environment.check.result import GpuCheck
from gpumagic.magics import gpucheck as magic

torch = pytest.importorskip("torch")
NO_CUDA = not torch.cuda.is_available()


@pytest.fixture
def show(ip, run):
    return lambda cell: run_showing(ip, run, cell)


@pytest.mark.skipif(not NO_CUDA, reason="the host path: torch sees no GPU here")
def test_gpucheck_without_a_gpu_checks_the_host_and_says_what_it_could_not(show, ip):
    ip.user_ns.pop("_gpucheck", None)
    out = show("%gpucheck --seconds 0.02")
    assert out.result.error_in_exec is None, out.result.error_in_exec
    assert out.value is None and len(out.reports("gpucheck")) == 1  # shown once, no Out[]
    r = ip.user_ns["_gpucheck"]
    assert isinstance(r, GpuCheck) and r is last_check()
    text = out.plain()
    assert r.host.measurements[0].key == "cpu_matmul"
    assert "FP32 matmul, torch's threads" in text and "memory copy" in text
    assert any(line.startswith("Not measured: the GPU measurements") for line in r.unchecked)
    if r.findings:
        assert text.index(r.findings[0].title) < text.index("host:")
    else:
        assert "Nothing found" in text


def test_o_returns_the_check_as_timeit_o_does(show, ip):
    out = show("%gpucheck -o --no-measure")
    assert isinstance(out.value, GpuCheck) and out.value is ip.user_ns["_gpucheck"]
    assert len(out.reports("gpucheck")) == 1 and out.out and not out.displayed
    assert out.value.measured is False and out.value.host.measurements == []
    assert "Not measured: the GPU and host figures (readings only)." in out.value.unchecked
    quiet = show("r = %gpucheck -o --no-measure")
    assert not quiet.bundles and isinstance(ip.user_ns["r"], GpuCheck)


def test_the_function_returns_the_same_kind_of_result():
    r = gpumagic.gpucheck(measure=False)
    assert isinstance(r, GpuCheck) and r is last_check()
    assert repr(r).startswith("<GpuCheck: ")
    bundle = r._repr_mimebundle_()
    assert 'class="gpumagic gpumagic-gpucheck"' in bundle["text/html"]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("%gpucheck --seconds 0", "--seconds must be above 0"),
        ("%gpucheck --seconds 11", "at most 10"),
        ("%gpucheck --id x", "argument --id: takes CUDA indexes"),
        ("%gpucheck --id -1", "argument --id: takes CUDA indexes"),
        ("%gpucheck --id 7 --no-measure", "no visible GPU 7"),
        ("%gpucheck --no-measur3", "did you mean --no-measure"),
    ],
)
def test_bad_options_are_usage_errors(run, ip, line, said):
    ip.user_ns.pop("_gpucheck", None)
    r = run(line)
    assert isinstance(r.result.error_in_exec, UsageError), r.result.error_in_exec
    assert said in str(r.result.error_in_exec)
    assert "_gpucheck" not in ip.user_ns


def test_help_comes_from_the_parser(ip, run):
    text = ip.object_inspect_text("%gpucheck")
    flat = " ".join(text.split())
    for action in magic.PARSER._actions:
        for option in action.option_strings:
            assert re.search(rf"(^|[\s\[,]){re.escape(option)}([\s,\]=]|$)", text), option
        assert " ".join(action.help.replace("%%", "%").split()) in flat
    assert "_gpucheck" in text and "usage: %gpucheck" in text
    r = run("%gpucheck -h")
    assert r.result.success and "usage: %gpucheck" in r.plain_stdout and not r.outputs
