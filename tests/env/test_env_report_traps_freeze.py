"""%gpuenv and gpumagic.env(): the real report on this machine, the trap rules on small inputs,
and --freeze files that pip/packaging and YAML can read back."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path

import pytest
from cell_outputs import run_showing
from IPython.core.error import UsageError

from gpumagic.environment import checks
from gpumagic.environment.checks import Finding
from gpumagic.environment.collect import read_cgroup_quota
from gpumagic.environment.freeze import Header, Installed, environment_text, pin_line, torch_index

torch = pytest.importorskip("torch")

NO_CUDA = not torch.cuda.is_available()
# Independent of the code under test: does this machine show an NVIDIA driver at all?
DRIVER_VISIBLE = (
    Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None
)


def _plain(run_result) -> str:
    return "".join(b.get("text/plain", "") for b in run_result.bundles)


@pytest.fixture
def show(ip, run):
    """show(cell) -> Outputs: the cell's display() bundles and its Out[] bundle."""
    return lambda cell: run_showing(ip, run, cell)


def _requirements(text: str) -> list[str]:
    """The requirement lines of a requirements.txt: no comments, no pip options."""
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append(line)
    return out


# --- the magic on this machine ---------------------------------------------------------------


@pytest.mark.skipif(not NO_CUDA, reason="the CPU path: torch sees no GPU here")
def test_gpuenv_on_cpu_says_no_gpu_and_why(show, ip):
    r = show("%gpuenv")
    assert r.result.error_in_exec is None, r.result.error_in_exec
    assert len(r.bundles) == 1
    bundle = r.bundles[0]
    assert set(bundle) >= {"text/plain", "text/html"}
    html = r.html()
    assert '<div class="gpumagic gpumagic-env">' in html
    text = bundle["text/plain"]
    report = ip.user_ns["_gpuenv"]

    assert "No GPU" in text
    assert torch.__version__ in text
    if torch.version.cuda is None:
        assert "CPU-only" in text and "CPU-only" in html
    if not DRIVER_VISIBLE:
        assert "no NVIDIA driver was found" in text
        assert "/proc/driver/nvidia/version" in text  # says where it looked
        assert not report.driver.present
    elif torch.version.cuda is None:
        assert "cpu-only-torch" in [f.code for f in report.findings]

    for flag in (
        "torch.backends.cudnn.benchmark",
        "torch.backends.cudnn.deterministic",
        "torch.are_deterministic_algorithms_enabled()",
        "torch.backends.cuda.matmul.allow_tf32",
        "torch.backends.cudnn.allow_tf32",
        "torch.get_float32_matmul_precision()",
        "CUDA_VISIBLE_DEVICES",
        "PYTORCH_CUDA_ALLOC_CONF",
    ):
        assert flag in text and flag in html

    affinity = len(os.sched_getaffinity(0))
    assert report.cpu.affinity == affinity
    assert report.cpu.logical == os.cpu_count()
    assert report.cpu.usable <= affinity
    assert report.num_workers == checks.suggest_num_workers(report.cpu.usable, 0)[0]
    if report.cpu.usable > 1:
        assert report.num_workers >= 1
    assert f"DataLoader num_workers {report.num_workers}" in text
    assert report.torch_threads == torch.get_num_threads()
    assert report.packages["torch"] == importlib.metadata.version("torch")
    assert report.packages["ipython"] == importlib.metadata.version("ipython")


def test_env_returns_the_same_report_as_data(show, ip):
    import gpumagic

    r = show("%gpuenv")
    assert r.result.error_in_exec is None
    shown = ip.user_ns["_gpuenv"]
    data = gpumagic.env()
    assert type(data).__name__ == "EnvReport"
    assert data.torch_version == torch.__version__
    assert data.cuda_runtime == torch.version.cuda
    assert data.cuda_available == torch.cuda.is_available()
    assert data.flags["torch.backends.cudnn.benchmark"] == torch.backends.cudnn.benchmark
    assert (
        data.flags["torch.get_float32_matmul_precision()"] == torch.get_float32_matmul_precision()
    )
    d = data.to_dict()
    json.dumps(d)  # plain data all the way down
    s = shown.to_dict()
    for key in (
        "torch_version",
        "torch_build",
        "cuda_runtime",
        "gpu_summary",
        "flags",
        "env_vars",
        "cpu",
        "num_workers",
        "packages",
        "findings",
        "gpus",
        "driver",
    ):
        if key == "gpus":
            # used_memory is NVML's device-wide count: on a shared GPU another process can
            # allocate between the two reports; everything else must agree
            d[key] = [{**g, "used_memory": None} for g in d[key]]
            s[key] = [{**g, "used_memory": None} for g in s[key]]
        assert d[key] == s[key], key
    bundle = data._repr_mimebundle_()
    if not data.gpus:
        assert bundle["text/plain"] == r.bundles[0]["text/plain"]
    else:  # the used column can differ (above); the rest of the text cannot
        strip = lambda t: [ln for ln in t.splitlines() if not ln.lstrip()[:1].isdigit()]  # noqa: E731
        assert strip(bundle["text/plain"]) == strip(r.bundles[0]["text/plain"])


def test_gpuenv_returns_the_report_shown_once_as_out(show, ip):
    r = show("%gpuenv")
    report = ip.user_ns["_gpuenv"]
    assert r.value is report  # the magic returned it, and IPython showed it as Out[]
    assert ip.user_ns["Out"][r.result.execution_count] is report
    assert r.displayed == [] and len(r.reports("env")) == 1  # shown once, not display()ed too

    r = show("e = %gpuenv")
    assert r.bundles == [] and r.value is None
    assert ip.user_ns["e"] is ip.user_ns["_gpuenv"]
    assert type(ip.user_ns["e"]).__name__ == "EnvReport"

    for silenced in ("%gpuenv ;", "%gpuenv ;  # no output, please"):
        before = ip.user_ns["_gpuenv"]
        r = show(silenced)
        assert r.result.error_in_exec is None, r.result.error_in_exec
        assert r.bundles == [] and r.value is None, silenced
        assert ip.user_ns["_gpuenv"] is not before  # it ran, and kept the new report


def test_freeze_says_where_it_wrote_and_keeps_the_report_without_showing_it(show, ip, tmp_path):
    target = tmp_path / "req.txt"
    before = ip.user_ns.get("_gpuenv")
    r = show(f"%gpuenv --freeze {target}")
    assert r.result.error_in_exec is None, r.result.error_in_exec
    assert target.exists()
    # the note on the file, and nothing else: the whole report is not rendered again
    assert [str(target) in b["text/plain"] for b in r.bundles] == [True]
    assert r.out == [] and r.value is None and r.reports("env") == []
    assert ip.user_ns["_gpuenv"] is not before  # the report it pinned is kept

    target.unlink()
    r = show(f"%gpuenv --freeze {target} ;")
    assert r.result.error_in_exec is None, r.result.error_in_exec
    assert target.exists()
    # the note on the file is shown even when the report is not: a file was written
    assert len(r.displayed) == 1 and str(target) in r.displayed[0]["text/plain"]
    assert r.out == [] and r.value is None

    r = show(f"e = %gpuenv --freeze {target}")
    assert len(r.displayed) == 1 and r.out == []
    assert ip.user_ns["e"] is None  # the report is _gpuenv; %gpuenv alone returns it


def test_gpuenv_shows_once_in_a_kernel():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    cells = ["%load_ext gpumagic", "%gpuenv", "%gpuenv ;", "e = %gpuenv", "print(type(e).__name__)"]
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    shown, silenced, assigned, kept = (c.outputs for c in nb.cells[1:])
    assert [o.output_type for o in shown] == ["execute_result"]
    assert '<div class="gpumagic gpumagic-env">' in shown[0]["data"]["text/html"]
    assert silenced == [] and assigned == []
    assert kept[0]["text"].strip() == "EnvReport"


def test_public_functions_survive_importing_their_packages():
    # Importing a submodule binds the package attribute of that name to the module; the
    # packages are named apart from the public functions so that can never happen.
    import gpumagic

    importlib.import_module("gpumagic.environment")
    importlib.import_module("gpumagic.monitor")
    assert type(gpumagic.env()).__name__ == "EnvReport"
    # watch() starts the NVML watcher or the job watcher (issue 20): it lives in monitor.start
    assert gpumagic.watch.__module__ == "gpumagic.monitor.start"


def test_live_flags_feed_the_traps(show, ip):
    bench, det = torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled()
    try:
        r = show(
            "import torch\n"
            "torch.backends.cudnn.benchmark = True\n"
            "torch.use_deterministic_algorithms(True)\n"
            "%gpuenv"
        )
        assert r.result.error_in_exec is None
        codes = [f.code for f in ip.user_ns["_gpuenv"].findings]
        assert "deterministic-with-benchmark" in codes
        assert "cudnn.benchmark = False" in r.html()
        if torch.version.cuda and os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None:
            assert "cublas-workspace" in codes
    finally:
        torch.backends.cudnn.benchmark = bench
        torch.use_deterministic_algorithms(det)


@pytest.mark.skipif(not NO_CUDA, reason="changing CUDA_VISIBLE_DEVICES must not touch a live GPU")
def test_empty_visible_devices_is_flagged(show, ip, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    r = show("%gpuenv")
    assert r.result.error_in_exec is None
    assert "visible-devices-empty" in [f.code for f in ip.user_ns["_gpuenv"].findings]
    assert '"" (set, empty)' in _plain(r)


def test_everything_shown_in_html_is_escaped():
    import gpumagic

    report = dataclasses.replace(
        gpumagic.env(),
        gpu_summary="<img src=x onerror=alert(1)>",
        gpus=[checks_gpu("<b>evil</b>")],
        findings=[Finding("warning", "x<y", "a <script>b</script>", "c & d")],
        packages={"<pkg>": "1.0<"},
    )
    html = report._html()
    assert "<script>" not in html and "<b>evil</b>" not in html and "<img" not in html
    assert "&lt;script&gt;" in html and "&lt;b&gt;evil&lt;/b&gt;" in html and "c &amp; d" in html
    assert "&lt;pkg&gt;" in html


def checks_gpu(name: str):
    from gpumagic.environment import GpuInfo

    return GpuInfo(index=0, name=name, source="torch", total_memory=2**30, capability="8.0")


# --- bad arguments and paths -------------------------------------------------------------------


@pytest.mark.parametrize("line", ["--bogus", "extra words", "--freeze"])
def test_bad_arguments_raise_usage_error(run, line):
    r = run(f"%gpuenv {line}")
    assert isinstance(r.result.error_in_exec, UsageError)
    assert "usage: %gpuenv" in str(r.result.error_in_exec)


def test_freeze_with_unknown_extension_is_a_usage_error(run, tmp_path):
    target = tmp_path / "pins.json"
    r = run(f"%gpuenv --freeze {target}")
    err = r.result.error_in_exec
    assert isinstance(err, UsageError)
    assert ".txt" in str(err) and ".yml" in str(err) and "usage: %gpuenv" in str(err)
    assert not target.exists()


@pytest.mark.parametrize("where", ["missing-dir/req.txt", "a-directory.txt"])
def test_freeze_to_unwritable_path_names_the_path(run, tmp_path, where):
    (tmp_path / "a-directory.txt").mkdir()
    target = tmp_path / where
    r = run(f"%gpuenv --freeze {target}")
    err = r.result.error_in_exec
    assert isinstance(err, UsageError)
    assert str(target) in str(err) and "cannot write" in str(err)


# --- --freeze files ------------------------------------------------------------------------------


def test_freeze_requirements_txt_pins_every_distribution(show, tmp_path):
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    target = tmp_path / "req.txt"
    r = show(f"%gpuenv --freeze {target}")
    assert r.result.error_in_exec is None, r.result.error_in_exec
    assert str(target) in _plain(r) and str(target) in r.html()  # says where it wrote

    text = target.read_text()
    reqs = [Requirement(line) for line in _requirements(text)]  # all parse
    pins = {canonicalize_name(q.name): str(q.specifier) for q in reqs}
    assert pins["torch"] == "==" + importlib.metadata.version("torch")
    assert pins["ipython"] == "==" + importlib.metadata.version("ipython")
    assert list(pins) == sorted(pins)  # sorted, one line each
    assert len(pins) == len(reqs)

    import platform

    assert f"# Python {platform.python_version()} on {platform.platform()}" in text
    assert f"torch {torch.__version__}" in text
    if "+cpu" in torch.__version__:
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text.splitlines()

    # an editable install is a comment, never a pin no index could satisfy
    gm = importlib.metadata.distribution("gpumagic").read_text("direct_url.json")
    if gm and '"editable": true' in gm:
        assert "gpumagic" not in pins
        assert any(
            line.startswith("# gpumagic==") and "pip install -e" in line
            for line in text.splitlines()
        )


def test_freeze_environment_yml_is_conda_yaml(run, tmp_path):
    yaml = pytest.importorskip("yaml")
    target = tmp_path / "env.yml"
    r = run(f"%gpuenv --freeze {target}")
    assert r.result.error_in_exec is None, r.result.error_in_exec
    doc = yaml.safe_load(target.read_text())
    assert isinstance(doc["name"], str) and doc["name"]
    assert doc["channels"] == ["conda-forge"]
    import platform

    py = ".".join(platform.python_version_tuple()[:2])
    deps = doc["dependencies"]
    assert f"python={py}" in deps and "pip" in deps
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict))
    assert f"torch=={importlib.metadata.version('torch')}" in pip_section
    assert f"ipython=={importlib.metadata.version('ipython')}" in pip_section
    if "+cpu" in torch.__version__:
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip_section


def test_report_freeze_method_yaml_extension(tmp_path):
    import gpumagic

    result = gpumagic.env().freeze(tmp_path / "environment.yaml")
    assert result.format == "environment" and result.pinned > 10
    assert Path(result.path).read_text().count("==") >= result.pinned


# --- the rules, on small inputs -------------------------------------------------------------------


def test_driver_too_old_for_torchs_cuda():
    old = checks.driver_too_old(driver="470.57", cuda="12.1")
    assert old is not None and old.level == "error" and "470.57" in old.message
    assert "530.30.02" in old.fix  # the driver CUDA 12.1 shipped with
    # above the 12.x minor-version floor but older than 12.1's own driver: runs, PTX JIT may not
    compat = checks.driver_too_old(driver="525.60.13", cuda="12.1")
    assert compat is not None and compat.level == "warning"
    assert checks.driver_too_old(driver="535.104.05", cuda="12.1") is None
    assert checks.driver_too_old(driver="440.33", cuda="11.8").level == "error"
    assert checks.driver_too_old(driver="470.82.01", cuda="11.8").level == "warning"
    assert checks.driver_too_old(driver="580.65.06", cuda="13.0") is None
    assert checks.driver_too_old(driver="575.51.03", cuda="13.0").level == "error"
    # unknown to the tables, or unknown values: no verdict rather than a guess
    assert checks.driver_too_old(driver="999.1", cuda="14.0") is None
    assert checks.driver_too_old(driver=None, cuda="12.1") is None
    assert checks.driver_too_old(driver="535.1", cuda=None) is None


def test_driver_table_is_ordered_like_nvidias():
    # Newer toolkits never need an older driver; a typo in the table would break this.
    rows = sorted(checks.TOOLKIT_DRIVER.items())
    drivers = [checks.version_tuple(v) for _, v in rows]
    assert drivers == sorted(drivers)
    for (major, minor), v in rows:
        floor = checks.MINOR_COMPAT_DRIVER.get(major)
        if floor and (major, minor) != (11, 0):  # 11.0 GA predates the 11.x floor (footnote)
            assert checks.version_tuple(v) >= checks.version_tuple(floor)
    assert checks.driver_too_old(driver="450.51.05", cuda="11.0") is None


def test_cpu_only_torch_with_a_driver():
    f = checks.cpu_only_torch(
        "2.13.0+cpu", None, None, "535.104.05", True, ["NVIDIA A100-SXM4-80GB"], "12.2"
    )
    assert f is not None and f.level == "error"
    assert "NVIDIA A100-SXM4-80GB" in f.message and "535.104.05" in f.message and "12.2" in f.fix
    assert checks.cpu_only_torch("2.13.0+cu121", "12.1", None, "535.104.05", True, []) is None
    assert checks.cpu_only_torch("2.13.0+cpu", None, None, None, False, []) is None
    assert checks.cpu_only_torch(None, None, None, "535.104.05", True, []) is None


def test_visible_devices():
    assert checks.visible_devices("").level == "warning"
    assert checks.visible_devices("  ").level == "warning"
    assert checks.visible_devices("-1").level == "info"
    assert checks.visible_devices(None) is None
    assert checks.visible_devices("0,1") is None


def test_determinism_traps():
    assert checks.deterministic_with_benchmark(True, False, True).level == "warning"
    assert checks.deterministic_with_benchmark(False, True, True) is not None
    assert checks.deterministic_with_benchmark(True, True, False) is None
    assert checks.deterministic_with_benchmark(False, False, True) is None
    assert checks.cublas_workspace(True, "12.1", None).level == "warning"
    assert checks.cublas_workspace(True, "12.1", ":4096:8") is None
    assert checks.cublas_workspace(True, None, None) is None
    assert checks.cublas_workspace(False, "12.1", None) is None


def test_tf32_only_on_gpus_that_have_it():
    assert checks.tf32_off(["8.0"], False, "highest").level == "info"
    assert checks.tf32_off(["7.5"], False, "highest") is None
    assert checks.tf32_off(["9.0"], True, "highest") is None
    assert checks.tf32_off(["8.6"], False, "high") is None
    assert checks.tf32_off([], False, "highest") is None


def test_cpu_rules():
    assert checks.suggest_num_workers(1, 0)[0] == 0
    assert checks.suggest_num_workers(2, 0)[0] == 1
    assert checks.suggest_num_workers(16, 0)[0] == 8
    assert checks.suggest_num_workers(64, 8)[0] == 7
    assert checks.suggest_num_workers(8, 4)[0] == 1
    assert checks.suggest_num_workers(2, 4)[0] == 1  # never 0 with more than one CPU
    assert "min(" in checks.suggest_num_workers(4, 1)[1]
    assert checks.usable_cpus(64, 64, 2.0) == 2
    assert checks.usable_cpus(8, 4, None) == 4
    assert checks.usable_cpus(8, None, 0.5) == 1
    assert checks.parse_cpu_max("max 100000\n") is None
    assert checks.parse_cpu_max("200000 100000\n") == 2.0
    assert checks.parse_cpu_max("150000 100000") == 1.5
    assert checks.threads_oversubscribed(4, 2).level == "warning"
    assert checks.threads_oversubscribed(2, 2) is None
    assert checks.cpu_quota_below_visible(64, 2.0) is not None
    assert checks.cpu_quota_below_visible(2, None) is None


def test_env_var_rules():
    assert (
        checks.alloc_conf_conflict("expandable_segments:True", "max_split_size_mb:128") is not None
    )
    assert checks.alloc_conf_conflict("a", "a") is None
    assert checks.alloc_conf_conflict(None, "a") is None
    assert checks.launch_blocking("1").level == "warning"
    assert checks.launch_blocking("0") is None
    assert checks.launch_blocking(None) is None


def test_parsers():
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc 12\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)\n"
    assert checks.parse_proc_driver_version(proprietary) == "535.104.05"
    assert checks.parse_proc_driver_version(open_module) == "570.86.15"
    assert checks.parse_proc_driver_version("garbage") is None
    assert checks.format_cudnn(90100) == "9.1.0"
    assert checks.format_cudnn(8902) == "8.9.2"
    assert checks.format_cuda_driver_version(12040) == "12.4"
    assert checks.cuda_tag("12.1") == "cu121"


def test_cgroup_quota_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "kubepods" / "cpu.max").write_text("400000 100000\n")
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("150000 100000\n")
    proc = tmp_path / "cgroup-v2"
    proc.write_text("0::/kubepods/pod1\n")
    assert read_cgroup_quota(v2, proc) == 1.5  # the tightest on the path
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("max 100000\n")
    assert read_cgroup_quota(v2, proc) == 4.0  # an ancestor's limit still applies

    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "docker" / "abc").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    proc1 = tmp_path / "cgroup-v1"
    proc1.write_text("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n")
    assert read_cgroup_quota(v1, proc1) == 2.0
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("-1\n")
    assert read_cgroup_quota(v1, proc1) is None
    assert read_cgroup_quota(v1, tmp_path / "no-such-file") is None


def _header(version: str | None, cuda: str | None = None, hip: str | None = None) -> Header:
    return Header(
        "3.11.7",
        "Linux-x86_64",
        version,
        "build",
        cuda,
        hip,
        "2026-01-01 00:00 UTC",
        "gpumagic 0.1.0",
    )


def test_torch_index_from_the_build():
    base = "https://download.pytorch.org/whl"
    assert torch_index(_header("2.13.0+cpu")) == (f"{base}/cpu", True)
    assert torch_index(_header("2.3.1+cu121", "12.1")) == (f"{base}/cu121", True)
    assert torch_index(_header("2.5.1+rocm6.2", hip="6.2.41133-dd7f95766")) == (
        f"{base}/rocm6.2",
        True,
    )
    assert torch_index(_header("2.5.1", "12.4")) == (f"{base}/cu124", False)  # PyPI's build: a hint
    assert torch_index(_header(None)) == (None, False)


def test_pin_lines_by_install_kind():
    assert pin_line(Installed("numpy", "2.1.0")) == ("numpy==2.1.0", True)
    vcs = Installed(
        "foo",
        "0.1",
        {"url": "https://github.com/o/foo", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
    )
    assert pin_line(vcs) == ("foo @ git+https://github.com/o/foo@abc123", True)
    editable = Installed(
        "gpumagic", "0.1.0", {"url": "file:///work/main", "dir_info": {"editable": True}}
    )
    line, pinned = pin_line(editable)
    assert (
        not pinned and line.startswith("# gpumagic==0.1.0") and "pip install -e /work/main" in line
    )
    local_dir = Installed("bar", "1.0", {"url": "file:///src/bar", "dir_info": {}})
    assert pin_line(local_dir)[1] is False
    wheel = Installed(
        "baz", "1.0", {"url": "file:///tmp/baz-1.0-py3-none-any.whl", "archive_info": {}}
    )
    assert pin_line(wheel) == (
        "baz==1.0  # installed from file:///tmp/baz-1.0-py3-none-any.whl",
        True,
    )
    remote = Installed(
        "qux", "2.0", {"url": "https://example.org/qux-2.0.tar.gz", "archive_info": {}}
    )
    assert pin_line(remote) == ("qux @ https://example.org/qux-2.0.tar.gz", True)


def test_environment_text_quotes_what_yaml_would_misread():
    yaml = pytest.importorskip("yaml")
    installed = [
        Installed("a-b", "1.0"),
        Installed("odd", "1.0", {"url": "file:///x: y #z", "dir_info": {"editable": True}}),
    ]
    doc = yaml.safe_load(environment_text(installed, _header("2.13.0+cpu"), "my env"))
    assert doc["name"] == "my env"
    assert doc["dependencies"][-1]["pip"] == [
        "--extra-index-url https://download.pytorch.org/whl/cpu",
        "a-b==1.0",
    ]


# --- the CUDA paths on the CPU (tests/cuda_double.py and the NVML double) ------------------------
# torch.cuda.get_device_properties runs _lazy_init (torch's CUDA state, and no fork afterwards), so
# %gpuenv reads NVML unless CUDA was initialised already, and one that raises costs one GPU row.


@pytest.fixture
def nvml_double(monkeypatch):
    """install(gpus) -> FakeNvml as `import pynvml` (the watcher tests' double)."""
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "watch"))
    from watch_nvml_double import FakeNvml

    def install(gpus):
        fake = FakeNvml(gpus)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def _three_gpus():
    from watch_nvml_double import MIB, gpu

    return [
        gpu("NVIDIA A", "GPU-aaaa0000-0000-0000-0000-000000000000", mem_used=100 * MIB, mem_reserved=500 * MIB, capability=(8, 0)),
        gpu("NVIDIA B", "GPU-bbbb0000-0000-0000-0000-000000000000", mem_used=200 * MIB, capability=(8, 6)),
        gpu("NVIDIA C", "GPU-cccc0000-0000-0000-0000-000000000000", mem_used=300 * MIB, capability=(9, 0)),
    ]


def test_gpuenv_never_initialises_cuda(show, ip, monkeypatch, nvml_double):
    from cuda_double import FakeCuda

    nvml_double(_three_gpus())
    cuda = FakeCuda(monkeypatch, devices=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    r = show("%gpuenv")
    assert r.result.error_in_exec is None, r.result.error_in_exec
    assert cuda.init_attempts == []  # no get_device_properties: no _lazy_init
    report = ip.user_ns["_gpuenv"]
    assert [(g.index, g.name, g.source, g.capability) for g in report.gpus] == [
        (0, "NVIDIA C", "nvml", "9.0"),  # torch's cuda:0 is NVML's GPU 2 here
        (1, "NVIDIA A", "nvml", "8.0"),
    ]
    assert report.gpus[1].used_memory == 100 * 2**20  # v2: without the driver's reservation
    text = r.bundles[0]["text/plain"]
    assert "NVIDIA C" in text and "NVIDIA B" not in text
    # once something else initialised CUDA, torch's own properties are read
    cuda.initialized = True
    r = show("%gpuenv")
    gpus = ip.user_ns["_gpuenv"].gpus
    assert [(g.source, g.name, g.multiprocessors) for g in gpus] == [("torch", "Fake H200", 132)] * 2


def test_gpuenv_survives_device_properties_that_raise(show, ip, monkeypatch, nvml_double):
    from cuda_double import FakeCuda

    nvml_double(_three_gpus())
    cuda = FakeCuda(monkeypatch, devices=1)
    cuda.initialized = True

    def broken(index=0):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    r = show("%gpuenv")
    assert r.result.error_in_exec is None, r.result.error_in_exec  # "never raises for a missing piece"
    assert [(g.name, g.source) for g in ip.user_ns["_gpuenv"].gpus] == [("NVIDIA A", "nvml")]


# --- on a GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpuenv_on_a_gpu(show, ip):
    """The GPU-positive report, whichever source described the GPUs: torch's device properties
    when CUDA was initialised before (earlier tests), NVML's otherwise (reading torch's would run
    _lazy_init)."""
    r = show("%gpuenv")
    assert r.result.error_in_exec is None, r.result.error_in_exec
    report = ip.user_ns["_gpuenv"]
    text = r.bundles[0]["text/plain"]
    assert report.cuda_available
    assert len(report.gpus) == torch.cuda.device_count() > 0
    for g in report.gpus:
        props = torch.cuda.get_device_properties(g.index)
        assert g.source in ("torch", "nvml"), g
        assert g.name == props.name and g.name in text
        assert g.capability == f"{props.major}.{props.minor}"
        assert g.uuid is not None and g.uuid.lower().removeprefix("gpu-") == str(props.uuid).lower()
        if g.source == "torch":
            assert g.total_memory == props.total_memory
        else:  # NVML counts the whole framebuffer; CUDA's totalGlobalMem leaves out a little
            assert props.total_memory <= g.total_memory <= 1.05 * props.total_memory
    assert report.driver.present and report.driver.version
    assert report.driver.version in text
    assert report.cuda_runtime == torch.version.cuda
    codes = [f.code for f in report.findings]
    assert "cpu-only-torch" not in codes and "driver-too-old" not in codes
    assert "No GPU" not in report.gpu_summary
    assert report.num_workers == checks.suggest_num_workers(report.cpu.usable, len(report.gpus))[0]
    if report.driver.source == "NVML":
        assert all(g.used_memory is not None for g in report.gpus)


def test_without_torch_the_report_says_so(monkeypatch):
    import sys

    from gpumagic.environment.collect import collect

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails as if not installed
    report = collect()
    assert report.torch_version is None and report.torch_build == "not installed"
    assert report.gpu_summary == "torch is not installed."
    assert "torch is not installed." in report._text()
