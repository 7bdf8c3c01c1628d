"""Two machines side by side: %gpuenv --save writes the report as versioned JSON, --diff and
gpumagic.env_diff compare, what is known to change speed first, each with why; a bad file is
a one-line error naming it, and nothing else changes."""

from __future__ import annotations

import json
import os

import pytest
from cell_outputs import run_showing
from IPython.core.error import UsageError

import gpumagic
from gpumagic.environment.check import _last
from gpumagic.environment.diff import EnvDiff, diff, env_diff
from gpumagic.environment.saved import VERSION, SavedEnvError, current, load

torch = pytest.importorskip("torch")

# What the settings below change, in the order the diff must rank them: cuDNN flags, then
# matmul precision, then CPU threads, then visible devices, then other environment variables.
CHANGED = [
    "torch.backends.cudnn.benchmark",
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.get_float32_matmul_precision()",
    "torch.backends.cuda.matmul.fp32_precision",
    "torch threads",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
]


@pytest.fixture
def show(ip, run):
    return lambda cell: run_showing(ip, run, cell)


@pytest.fixture
def settings(monkeypatch):
    """Change the settings the test names, and put every one back afterwards."""
    threads = torch.get_num_threads()
    benchmark = torch.backends.cudnn.benchmark
    precision = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    saved_last = list(_last)
    _last.clear()

    def change():
        torch.set_num_threads(max(1, threads - 1) if threads > 1 else 2)
        torch.backends.cudnn.benchmark = not benchmark
        torch.set_float32_matmul_precision("high")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")

    yield change
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = benchmark
    torch.set_float32_matmul_precision(precision[0])  # both of torch 2.9's settings, as they were
    torch.backends.cuda.matmul.fp32_precision = precision[1]
    _last[:] = saved_last


def test_two_reports_saved_here_with_settings_changed_between_them(tmp_path, show, ip, settings):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    out = show(f"%gpuenv --save {before}")
    assert out.result.error_in_exec is None, out.result.error_in_exec
    assert out.value is None and "Wrote" in out.plain() and str(before) in out.plain()
    settings()
    show(f"%gpuenv --save {after}")
    d = gpumagic.env_diff(before, after)
    assert isinstance(d, EnvDiff) and (d.a, d.b) == ("before.json", "after.json")
    assert d.settings == CHANGED  # each difference found, ranked, nothing else
    assert {x.tier for x in d.differences} == {"speed"}
    rows = {x.setting: x for x in d.differences}
    assert (rows["torch.backends.cudnn.benchmark"].a, rows["torch.backends.cudnn.benchmark"].b) == ("False", "True")
    assert (rows["CUDA_VISIBLE_DEVICES"].a, rows["CUDA_VISIBLE_DEVICES"].b) == ("unset", "1")
    assert "tensor cores" in rows["torch.get_float32_matmul_precision()"].why
    assert rows["torch threads"].why == "the threads torch's CPU ops use"
    text = d._text()
    assert text.index("torch.backends.cudnn.benchmark") < text.index("OMP_NUM_THREADS")
    assert f"{len(CHANGED)} settings differ, {len(CHANGED)} known to change speed" in text
    assert d.frame.shape == (len(CHANGED), 5)


def test_diff_compares_this_machine_with_a_saved_report(tmp_path, show, ip, settings):
    saved = tmp_path / "theirs.json"
    show(f"%gpuenv --save {saved}")
    same = show(f"%gpuenv --diff {saved}")
    assert isinstance(same.value, EnvDiff) and same.value.differences == []
    assert "nothing differs" in same.plain() and len(same.reports("envdiff")) == 1
    settings()
    d = show(f"d = %gpuenv --diff {saved}")
    assert not d.bundles
    d = ip.user_ns["d"]
    assert (d.a, d.b) == ("theirs.json", "this machine") and d.settings == CHANGED


def test_the_file_is_data_with_a_format_version(tmp_path, show, ip, settings):
    path = tmp_path / "env.json"
    show(f"%gpuenv --save {path}")
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == ("gpumagic-env", VERSION)
    assert data["gpumagic"] == gpumagic.__version__ and data["check"] is None
    assert data["env"] == json.loads(json.dumps(ip.user_ns["_gpuenv"].to_dict()))
    # with --check the check runs now and is saved beside the report
    out = show(f"%gpuenv --save {path} --check")
    assert out.result.error_in_exec is None, out.result.error_in_exec
    data = json.loads(path.read_text())
    assert data["check"]["host"]["measurements"][0]["key"] == "cpu_matmul"
    assert "and the %gpucheck of" in out.plain()
    assert load(path).check == data["check"]
    # from a script
    from gpumagic.environment import save

    written = save(tmp_path / "script.json", check=_last[0])
    again = load(written)
    assert again.check == data["check"] and again.env["flags"] == data["env"]["flags"]


def test_cannot_matter_is_listed_last_and_folded_and_figures_have_a_tolerance(tmp_path):
    from gpumagic.environment import env
    from gpumagic.environment.check import gpucheck

    report, check = env(), gpucheck(seconds=0.01)
    a = current(report, check)
    env_b = json.loads(json.dumps(a.env))
    env_b["packages"]["matplotlib"] = "0.0.1"
    env_b["python_executable"] = "/elsewhere/bin/python"
    env_b["packages"]["numpy"] = "0.0.2"
    check_b = json.loads(json.dumps(a.check))
    m = check_b["host"]["measurements"]
    m[0]["value"] *= 1.05  # noise: not a difference
    m[-1]["value"] *= 3  # three times the memory bandwidth: a difference
    b = type(a)(env_b, check_b, "b.json")
    d = diff(a, b)
    assert d.settings == ["host: memory copy", "package numpy", "Python executable", "package matplotlib"]
    assert [x.tier for x in d.differences] == ["measured", "maybe", "none", "none"]
    html = d._html()
    assert "3 settings differ, 0 known to change speed; 1 measured figure beyond the noise" in d._text()
    assert "<details><summary>cannot change speed (2)</summary>" in html  # folded


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ('{"format": "gpumagic-env", "version": 99, "gpumagic": "9.0", "env": {}}',
         "a gpumagic environment report of format version 99, written by gpumagic 9.0; this gpumagic reads version 1"),
        ('{"format": "gpumagic-env", "version": 1, "env": {"torch_ver', "not valid JSON, cut short"),
        ("torch==2.13.0\nnumpy==2.1.0\n", "not valid JSON"),
        ('{"name": "my env", "dependencies": []}', "not a gpumagic environment report"),
        ('{"format": "gpumagic-env", "version": 1, "env": {"torch_version": "2.13"}}', "without its environment"),
    ],
    ids=["other-version", "truncated", "requirements", "other-json", "cut-env"],
)
def test_bad_input_is_one_line_naming_the_file_and_changes_nothing(tmp_path, show, ip, content, said):
    path = tmp_path / "theirs.json"
    path.write_text(content)
    ip.user_ns["_gpuenv"] = sentinel = object()
    out = show(f"%gpuenv --diff {path}")
    err = out.result.error_in_exec
    assert isinstance(err, UsageError), err
    message = str(err)
    assert "\n" not in message and str(path) in message and said in message, message
    assert ip.user_ns["_gpuenv"] is sentinel and not out.bundles
    with pytest.raises(SavedEnvError, match=said.replace("(", r"\(")):
        env_diff(path, path)


def test_a_missing_file_and_bad_option_combinations(tmp_path, run, ip):
    cases = [
        (f"%gpuenv --diff {tmp_path / 'nope.json'}", "cannot read it (No such file or directory)"),
        ("%gpuenv --check", "--check goes with --save"),
        (f"%gpuenv --save {tmp_path / 'env.txt'}", "--save writes JSON"),
        (f"%gpuenv --save {tmp_path / 'a.json'} --diff {tmp_path / 'a.json'}", "--diff compares: give it alone"),
        (f"%gpuenv --save {tmp_path / 'no' / 'dir' / 'a.json'}", "cannot write"),
    ]
    for line, said in cases:
        r = run(line)
        assert isinstance(r.result.error_in_exec, UsageError), line
        assert said in str(r.result.error_in_exec), (line, str(r.result.error_in_exec))
    assert os.listdir(tmp_path) == []
