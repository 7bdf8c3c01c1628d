"""The GPU check kit (``make gpu-wheels``, ``make gpu-check``) as far as a CPU can test it.

- Without CUDA, ``make gpu-check`` and ``bash tools/gpu-check.sh`` stop at once with their
  message and a non-zero status, having made nothing.
- tools/check_wheels.py on wheels built here: tags, one version each, pins, closure,
  markers, size; and the installed-set check the GPU machine runs.
- tools/gpu_check.py's plumbing in self-test mode: child processes, timeouts, the log,
  JUnit, the summary, the HTML copies; every GPU assertion reported "not on a GPU".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"
sys.path.insert(0, str(TOOLS))

import check_wheels as cw  # noqa: E402
import gpu_check as gc  # noqa: E402


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# Where CUDA is there, these commands run the whole GPU check: not a unit test's business.
no_cuda = pytest.mark.skipif(_cuda(), reason="with CUDA the command runs the whole GPU check")


def _env_with_this_python() -> dict[str, str]:
    """python3 on PATH = this interpreter (it has torch), as on the GPU machine."""
    env = dict(os.environ)
    bindir = Path(sys.executable).parent
    shim = bindir / "python3"
    if not shim.exists():
        pytest.skip(f"no python3 beside {sys.executable}")
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env.pop(gc.SELFTEST_ENV, None)
    return env


# -- without CUDA: stop at once ------------------------------------------------------------------


def _assert_stopped(proc: subprocess.CompletedProcess[str], out: Path) -> None:
    assert proc.returncode != 0
    assert "gpu-check: no CUDA GPU here" in proc.stderr, proc.stderr
    assert "torch.cuda.is_available() is False" in proc.stderr
    assert "Nothing was run." in proc.stderr
    assert not out.exists(), "it wrote output although it had nothing to check"


@no_cuda
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_without_cuda_stops_with_its_message(tmp_path):
    env = _env_with_this_python()
    env["OUT"] = str(tmp_path / "out")
    proc = subprocess.run(
        ["make", "-s", "gpu-check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    _assert_stopped(proc, tmp_path / "out")


@no_cuda
def test_gpu_check_sh_without_cuda_exits_2_before_anything_else(tmp_path):
    env = _env_with_this_python()
    env["OUT"] = str(tmp_path / "out")
    proc = subprocess.run(
        ["bash", str(TOOLS / "gpu-check.sh")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    _assert_stopped(proc, tmp_path / "out")


# -- the wheel checker ---------------------------------------------------------------------------


def make_wheel(folder: Path, name: str, version: str, requires=(), tag: str = "py3-none-any") -> Path:
    """A real, installable wheel holding one module."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = f"{dist}.dist-info/RECORD"
    files[record] = "".join(f"{f},,\n" for f in files) + f"{record},,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def _check(folder, pins=None, machine=None, **kw):
    return cw.check_folder(folder, pins, machine or {}, **kw)


def test_a_closed_set_passes_and_machine_packages_count(tmp_path):
    make_wheel(tmp_path, "alpha", "1.0", ["beta>=2", "packaging"])
    make_wheel(tmp_path, "beta", "2.1")
    rep = _check(tmp_path, {"alpha": "1.0", "beta": "2.1"}, {"packaging": None})
    assert rep.errors == []
    assert (rep.wheels, rep.by_set, rep.by_machine) == (2, 1, 1)


def test_a_requirement_neither_in_the_set_nor_on_the_machine_fails(tmp_path):
    make_wheel(tmp_path, "alpha", "1.0", ["gamma"])
    rep = _check(tmp_path)
    assert rep.errors == ["alpha 1.0 needs gamma: neither in the set nor on the machine"]


def test_a_version_the_set_does_not_satisfy_fails(tmp_path):
    make_wheel(tmp_path, "alpha", "1.0", ["beta<2"])
    make_wheel(tmp_path, "beta", "2.1")
    rep = _check(tmp_path)
    assert rep.errors == ["alpha 1.0 needs beta<2; the set has beta 2.1"]


def test_a_machine_version_is_checked_where_known(tmp_path):
    make_wheel(tmp_path, "alpha", "1.0", ["numpy>=3", "psutil>=7"])
    rep = _check(tmp_path, machine={"numpy": "2.5.2", "psutil": None})
    assert rep.errors == ["alpha 1.0 needs numpy>=3; the machine has numpy 2.5.2"]
    assert rep.unchecked == {"psutil>=7"}  # known there only: checked by --installed


def test_markers_and_extras_are_read_for_cpython_312_on_linux(tmp_path):
    make_wheel(
        tmp_path,
        "alpha",
        "1.0",
        [
            'appnope; sys_platform == "darwin"',
            'typing-extensions>=4.6; python_version < "3.12"',
            'sphinx; extra == "docs"',
            'tomli; python_version >= "3.12"',
        ],
    )
    rep = _check(tmp_path)
    assert rep.errors == ["alpha 1.0 needs tomli; python_version >= \"3.12\": neither in the set nor on the machine"]


def test_two_versions_of_one_project_fail(tmp_path):
    make_wheel(tmp_path, "alpha", "1.0")
    make_wheel(tmp_path, "Alpha", "1.1")
    rep = _check(tmp_path)
    assert len(rep.errors) == 1 and "two versions" in rep.errors[0] and "pip refuses" in rep.errors[0]


@pytest.mark.parametrize(
    "tag, ok",
    [
        ("py3-none-any", True),
        ("py2.py3-none-any", True),
        ("cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64", True),
        ("cp310-abi3-manylinux2014_x86_64", True),  # abi3 runs on later CPythons
        ("cp311-cp311-manylinux_2_17_x86_64", False),  # another interpreter's binary
        ("cp313-abi3-manylinux_2_17_x86_64", False),  # abi3 from a later one
        ("cp312-cp312-macosx_11_0_arm64", False),
        ("cp312-cp312-manylinux_2_34_x86_64", False),  # newer glibc than asked for
        ("cp312-cp312-manylinux_2_17_aarch64", False),
    ],
)
def test_tags_the_machine_takes_and_refuses(tmp_path, tag, ok):
    make_wheel(tmp_path, "alpha", "1.0", tag=tag)
    errors = _check(tmp_path).errors
    assert (errors == []) is ok, errors
    if not ok:
        assert "do not fit CPython 3.12 on manylinux x86-64" in errors[0]


def test_the_folder_must_hold_exactly_the_pinned_versions(tmp_path):
    make_wheel(tmp_path, "alpha", "1.0")
    make_wheel(tmp_path, "stale", "0.1")
    rep = _check(tmp_path, {"alpha": "1.1", "beta": "2.0"})
    assert sorted(rep.errors) == sorted(
        [
            "alpha: wheel 1.0, pinned 1.1",
            "beta==2.0: pinned in gpu_wheels.txt, no wheel for it",
            "stale-0.1-py3-none-any.whl: not in gpu_wheels.txt (stale? rerun make gpu-wheels)",
        ]
    )


def test_size_limit_and_files_that_are_not_wheels(tmp_path):
    make_wheel(tmp_path, "alpha", "1.0")
    (tmp_path / "beta-1.0.tar.gz").write_bytes(os.urandom(300_000))
    rep = _check(tmp_path, max_mib=0.1)
    assert any("not a wheel" in e for e in rep.errors)
    assert any("MiB of wheels: over 0.1 MiB" in e for e in rep.errors)


def test_the_installed_check_reads_the_real_versions(tmp_path, monkeypatch):
    site, other = tmp_path / "site", tmp_path / "machine"
    for folder, name, version, requires in (
        (site, "alpha", "1.0", ["beta>=2", "gamma"]),
        (other, "beta", "1.5", []),
    ):
        dist = folder / f"{name}-{version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        )
    monkeypatch.syspath_prepend(str(other))
    monkeypatch.syspath_prepend(str(site))
    rep = cw.check_installed(site)
    assert rep.errors == ["alpha 1.0 needs gamma: not installed"]
    assert rep.notes == ["alpha 1.0 asks for beta>=2; found 1.5"]
    assert rep.by_machine == 1


def test_the_projects_pins_are_what_the_machine_lacks():
    pins = cw.read_list(cw.PINS)
    machine = cw.read_list(cw.MACHINE)
    assert pins and all(v for v in pins.values()), "every wheel pinned to one version"
    assert not set(pins) & set(machine), "carried although the machine has it"
    for dist in ("ipython", "ipywidgets", "msgspec", "ipykernel", "nbclient", "nbformat", "nbconvert", "pyzmq"):
        assert dist in pins
    assert {"torch", "pandas", "matplotlib", "psutil", "nvidia-ml-py", "pytest", "jinja2"} <= set(machine)


@pytest.mark.skipif(not (REPO / ".gpu-wheels").is_dir(), reason="run `make gpu-wheels` first")
def test_the_downloaded_wheels_are_a_closed_set(capsys):
    assert cw.main([str(REPO / ".gpu-wheels")]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "0 problems: ok" in out and "of 64 MiB" in out


# -- the runner's plumbing -----------------------------------------------------------------------


def test_a_child_that_outlives_its_timeout_is_interrupted_then_killed_with_its_group(tmp_path):
    log = gc.Log(tmp_path / "log")
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)  # deaf to the polite stop\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    res = gc.run_child([sys.executable, "-c", code], 1.5, log, "t", grace=0.5)
    log.close()
    assert res.timed_out and res.returncode is None
    assert time.monotonic() - t0 < 10
    assert "started" in res.tail
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # the group's SIGKILL reached the grandchild too
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the grandchild survived its group's kill")
    text = (tmp_path / "log").read_text()
    assert "[t] started" in text and "timeout after 2 s: SIGINT, then SIGKILL" in text


def test_a_child_that_ends_reports_its_status_and_output(tmp_path):
    log = gc.Log(tmp_path / "log")
    res = gc.run_child([sys.executable, "-c", "print('one'); print('two'); raise SystemExit(4)"], 30, log, "t")
    log.close()
    assert (res.returncode, res.timed_out) == (4, False)
    assert res.tail.splitlines() == ["one", "two"]
    assert "-- exit 4 after" in (tmp_path / "log").read_text()


def test_junit_holds_pytests_suite_and_one_case_per_check(tmp_path):
    pytest_xml = tmp_path / "p.xml"
    pytest_xml.write_text(
        '<testsuites><testsuite name="pytest-gpu" tests="2" failures="1" errors="0" skipped="0">'
        '<testcase classname="tests.t" name="a"/><testcase classname="tests.t" name="b">'
        '<failure message="boom">tb</failure></testcase></testsuite></testsuites>'
    )
    checks = [
        gc.Check("cells", "ok", gc.PASSED, 1.0, "fine"),
        gc.Check("cells", "bad", gc.FAILED, 2.0, "x <y> & z"),
        gc.Check("bench", "slow", gc.TIMEOUT, 3.0, "ran past"),
        gc.Check("pytest", "cpu", gc.NO_GPU, 0.0, "skipped without CUDA"),
    ]
    gc.write_junit(tmp_path / "junit.xml", checks, pytest_xml)
    root = ET.parse(tmp_path / "junit.xml").getroot()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"pytest-gpu", "gpu-check"}
    ours = suites["gpu-check"]
    assert (ours.get("tests"), ours.get("failures"), ours.get("skipped")) == ("4", "2", "1")
    cases = {c.get("name"): c for c in ours.iter("testcase")}
    assert cases["bad"].find("failure").get("message") == "failed: x <y> & z"
    assert cases["slow"].find("failure").get("message").startswith("timeout")
    assert cases["cpu"].find("skipped") is not None
    counts, failures = gc.parse_junit(pytest_xml)
    assert counts == {"tests": 2, "failures": 1, "errors": 0, "skipped": 0}
    assert failures == [{"kind": "failure", "test": "tests.t::b", "message": "boom"}]


def test_the_children_see_the_repository_first_then_the_site(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("JUPYTER_PATH", "")
    log = gc.Log(tmp_path / "log")
    args = gc.parse_args(["--self-test", "--out", str(tmp_path)])
    ctx = gc.Context(args, log, tmp_path, tmp_path)
    site = tmp_path / "site"
    (site / "probe_pkg").mkdir(parents=True)
    (site / "probe_pkg" / "__init__.py").write_text("")
    ctx.set_site(site)
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(REPO), str(site), "/elsewhere"]
    assert os.environ["JUPYTER_PATH"] == str(site / "share" / "jupyter")
    # a grandchild (a child's own subprocess) imports from the site and gpumagic from the repo
    code = (
        "import subprocess, sys\n"
        "sys.exit(subprocess.call([sys.executable, '-c', 'import probe_pkg, gpumagic; print(gpumagic.__file__)']))\n"
    )
    res = run_in(ctx, code, tmp_path)
    log.close()
    assert res.returncode == 0, res.tail
    assert res.tail.strip() == str(REPO / "gpumagic" / "__init__.py")


def run_in(ctx: gc.Context, code: str, cwd: Path) -> gc.ChildResult:
    return gc.run_child([sys.executable, "-c", code], 60, ctx.log, "t", env=ctx.env, cwd=cwd)


def _selftest(tmp_path: Path, *args: str, inject: str = "") -> tuple[subprocess.CompletedProcess[str], dict]:
    env = dict(os.environ, **{gc.SELFTEST_ENV: "1"})
    env.pop("OUT", None)
    if inject:
        env[gc.INJECT_ENV] = inject
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "gpu_check.py"), "--out", str(out), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    return proc, summary


@no_cuda
def test_self_test_runs_the_plumbing_and_never_claims_a_gpu_result(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "gpucheck-probe", "1.0")
    proc, summary = _selftest(
        tmp_path,
        "--only", "wheels,pytest,cells,bench",
        "--wheels", str(wheels),
        "--pytest-args", "tests/memory/test_memtrace_cuda.py",
        inject="fail,timeout",
    )  # fmt: skip
    out = tmp_path / "out"
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # the injected two
    assert summary["gpu_result"] is False and summary["mode"] == "self-test (no GPU)"
    status = {(c["part"], c["name"]): c["status"] for c in summary["checks"]}
    # the plumbing that is not a GPU result
    assert status[("wheels", "install")] == "passed"
    assert status[("wheels", "requirements")] == "passed"
    assert status[("wheels", "imports")] == "passed"
    assert status[("cells", "shell")] == "passed"
    assert status[("inject", "fail")] == "failed" and status[("inject", "timeout")] == "timeout"
    # every GPU assertion: not on a GPU, never passed
    gpu = {k: v for k, v in status.items() if k[0] in ("pytest", "bench") or (k[0] == "cells" and k[1] != "shell")}
    assert set(gpu) >= {
        ("pytest", "pytest -m gpu"),
        ("cells", "gpuenv"),
        ("cells", "gpuwatch"),
        ("cells", "memtrace_resnet"),
        ("cells", "gpuprofile_slow_loop"),
        ("cells", "memtrace_oom"),
        ("cells", "memfit_resnet"),
        ("bench", "memtrace overhead, CUDA training cell"),
        ("bench", "probe cost per statement"),
        ("bench", "NVML cost per sample"),
    }
    assert set(gpu.values()) == {"not on a GPU"}, gpu
    pytest_check = next(c for c in summary["checks"] if c["part"] == "pytest")
    assert pytest_check["data"]["counts"]["tests"] == pytest_check["data"]["counts"]["skipped"] > 0
    # the files, at most 8, all in $OUT
    names = sorted(p.name for p in out.iterdir())
    assert names == ["gpu-check.log", "junit.xml", "summary.json"]
    root = ET.parse(out / "junit.xml").getroot()
    suites = {s.get("name") for s in root.iter("testsuite")}
    assert suites == {"pytest-gpu", "gpu-check"}
    log = (out / "gpu-check.log").read_text()
    assert "SELF-TEST on a machine without CUDA: no result below is a GPU result" in log
    assert "[pytest] $ " in log and "-m gpu" in log and "--junitxml=" in log
    assert "a deliberate failure" in log
    assert "gpu-check FAILED (self-test: plumbing only, no GPU result)" in proc.stdout
    assert "== summary" in proc.stdout and "memtrace_oom" in proc.stdout


@no_cuda
def test_a_spent_budget_reports_each_part_as_not_started(tmp_path):
    proc, summary = _selftest(tmp_path, "--budget", "3")
    assert proc.returncode == 1
    parts = [(c["part"], c["status"], c["detail"]) for c in summary["checks"]]
    assert [p for p, _, _ in parts] == list(gc.PARTS)
    assert all(s == "timeout" and "not started" in d for _, s, d in parts), parts


@pytest.mark.notebooks
@no_cuda
def test_self_test_executes_a_notebook_and_writes_its_html(tmp_path):
    nb = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
             "source": ["import torch\n", "print('device=' + ('cuda' if torch.cuda.is_available() else 'cpu'))"]},
            {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
             "source": ["%load_ext gpumagic\n", "%gpuenv"]},
            {"cell_type": "code", "metadata": {"tags": ["raises-exception"]}, "execution_count": None,
             "outputs": [], "source": ["1 / 0"]},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }  # fmt: skip
    path = tmp_path / "nb" / "07_tiny.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(nb))
    proc, summary = _selftest(tmp_path, "--only", "notebooks", "--notebooks", str(path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    (check,) = summary["checks"]
    assert check["status"] == "passed"
    assert check["detail"].startswith("on the CPU (self-test): not a GPU result")
    assert check["data"]["parameters"] == "device=cpu" and check["data"]["reports"] >= 1
    html = (tmp_path / "out" / "07_tiny.html").read_text()
    assert "ZeroDivisionError" in html and 'class="gpumagic' in html


@no_cuda
def test_bench_results_become_checks():
    """The bench JSON the runner reads on the GPU, produced for real on this CPU."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "m.json"
        proc = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "bench_memtrace.py"), "--repeats", "1", "--steps", "2",
             "--json", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        data = json.loads(out.read_text())
        res = gc.ChildResult(proc.returncode, 1.0, proc.stdout)
        overhead, probe = gc.memtrace_bench_checks(data, res, cuda=False)
        assert overhead.name == "memtrace overhead, CUDA training cell"
        assert overhead.detail.startswith("ratio ") and "cpu time, cpu" in overhead.detail
        assert overhead.status == (gc.FAILED if data["workloads"]["cnn"]["failed"] else gc.PASSED)
        assert probe.status == gc.PASSED and "µs per statement, probing cpu" in probe.detail
        # on a GPU machine the probe must be the CUDA one
        assert gc.memtrace_bench_checks(data, res, cuda=True)[1].status == gc.FAILED

        out = Path(d) / "w.json"
        proc = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "bench_watch.py"), "--sample-cost-only", "--json", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        data = json.loads(out.read_text())
        res = gc.ChildResult(proc.returncode, 1.0, proc.stdout)
        (cpu,) = gc.watch_bench_checks(data, res, cuda=False)
        assert cpu.status == gc.NO_GPU and "sampled the host, not NVML" in cpu.detail
        assert "µs CPU per sample" in cpu.detail
        (gpu,) = gc.watch_bench_checks(data, res, cuda=True)
        assert gpu.status == gc.FAILED  # a GPU machine sampling the host is a failure
    missing = gc.memtrace_bench_checks({"error": "no CUDA", "cuda": False}, res, cuda=False)
    assert [c.status for c in missing] == [gc.NO_GPU, gc.NO_GPU]
    assert [c.status for c in gc.memtrace_bench_checks(None, gc.ChildResult(None, 50, ""), cuda=True)] == [
        gc.TIMEOUT,
        gc.TIMEOUT,
    ]
