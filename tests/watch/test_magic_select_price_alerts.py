"""Issue 12 through a real IPython shell on this CPU machine (no NVIDIA driver): %gpuselect
refuses and changes nothing, --price costs the cells, --idle-alert fires on the host path,
and %gpuenv --freeze Dockerfile writes an image definition for this environment."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from gpumagic.environment.docker import CUDA_IMAGES, choose_base_image
from gpumagic.environment.freeze import Header, Installed, freeze_dockerfile


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpumagic-watch" and t.is_alive()]


@pytest.fixture(autouse=True)
def _stop_after(ip):
    yield
    ip.run_cell("%gpuwatch stop", store_history=False)
    assert _sampler_threads() == []


def _no_driver() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return True
    return False


needs_no_driver = pytest.mark.skipif(not _no_driver(), reason="this machine has an NVIDIA driver")


# -- %gpuselect ----------------------------------------------------------------------------
@needs_no_driver
def test_gpuselect_refuses_without_nvml_and_changes_nothing(run):
    import torch

    before = dict(os.environ)
    r = run("%gpuselect 2 --min-free-memory 8GiB --max-gpu-utilization 30 --no-others")
    err = r.result.error_in_exec
    assert isinstance(err, UsageError), r.stdout
    assert "no NVIDIA GPU to choose from: NVML unavailable" in str(err)
    # said plainly: no usage line, which would suggest a mistyped option
    assert "usage:" not in str(err) and str(err).endswith("nothing was changed")
    assert dict(os.environ) == before
    assert not torch.cuda.is_initialized()
    assert r.bundles == []


@needs_no_driver
def test_select_gpus_from_a_script_raises_value_error(ip):
    import gpumagic

    before = dict(os.environ)
    with pytest.raises(ValueError, match="NVML unavailable"):
        gpumagic.select_gpus(1)
    assert dict(os.environ) == before


def test_select_gpus_never_imports_torch():
    import subprocess

    code = (
        "import sys\n"
        "import gpumagic\n"
        "try:\n"
        "    gpumagic.select_gpus(1)\n"
        "except ValueError as exc:\n"
        "    print('refused:', exc)\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "torch imported: False" in out


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("%gpuselect two", "argument N: must be a whole number"),
        ("%gpuselect 0", "count must be"),
        ("%gpuselect --min-free-memory 8XB", "size unit"),
        ("%gpuselect --max-gpu-utilization lots", "--max-gpu-utilization: must be a percentage"),
        ("%gpuselect --max-gpu-utilization 150", "0-100"),
        ("%gpuselect --bogus", "unrecognized"),
    ],
)
def test_gpuselect_bad_arguments_are_usage_errors(run, line, expected):
    before = dict(os.environ)
    r = run(line)
    assert isinstance(r.result.error_in_exec, UsageError), r.stdout
    assert expected in str(r.result.error_in_exec)
    assert dict(os.environ) == before


# -- %gpuwatch --price and --idle-alert --------------------------------------------------------
def test_price_costs_every_cell_and_the_summary(ip, run):
    r = run("%gpuwatch -i 0.1 --price 3.60")
    assert r.result.success, r.result.error_in_exec
    run("import time; time.sleep(0.3)")
    run("x = 1")
    r = run("%gpuwatch stop")
    result = r.result.result
    cells = result.cells
    assert "cost_usd" in cells.columns and len(cells) >= 2
    # $3.60/h is $0.001 per second of the cell
    expected = cells["duration_us"] / 1e6 * 0.001
    assert (cells["cost_usd"] - expected).abs().max() < 1e-12
    sleepy = cells[cells["source"].str.contains("sleep")].iloc[0]
    assert sleepy["cost_usd"] >= 0.0003
    cost = result.cost
    assert cost.price == 3.60
    assert cost.total_usd == pytest.approx(cost.metered_s * 0.001)
    assert 0 < cost.idle_s < cost.metered_s  # the sleeping cell was busy time
    assert cost.idle_usd == pytest.approx(cost.idle_s * 0.001)
    text = r.stdout
    assert "cost: $" in text and "at $3.60/h" in text and "while idle" in text
    assert "idle means: no cell running" in text
    html = result._repr_mimebundle_()["text/html"]
    assert "at $3.60/h" in html and '">cost</th>' in html


def test_idle_alert_fires_on_the_host_path(ip, run):
    from gpumagic.monitor import current
    from gpumagic.render.watch_views import LiveFrame

    r = run("%gpuwatch -i 0.1 --price 2 --idle-alert 0.4")
    assert r.result.success, r.result.error_in_exec
    watcher = current()
    assert watcher is not None
    time.sleep(1.0)  # no cell runs: the kernel waits on the user
    active = [a for a in watcher.status().alerts if a.kind == "idle"]
    assert len(active) == 1
    assert "no cell has run for 400 ms or more: the instance is idle and costing $2.00/h" in active[0].message
    assert "the instance is idle and costing $2.00/h" in LiveFrame(watcher)()  # the live view
    r = run("%gpuwatch status")
    status = r.result.result
    idle = [a for a in status.alerts if a.kind == "idle"]
    assert len(idle) == 1 and "costing $2.00/h" in idle[0].message
    assert "costing $2.00/h" in r.stdout
    r = run("%gpuwatch stop")
    assert any(a.kind == "idle" for a, _, _ in r.result.result.alerts)


def test_on_idle_is_called_from_a_script():
    import gpumagic

    fired = []
    w = gpumagic.watch(interval=0.1, idle_alert="0.3", on_idle=fired.append)
    deadline = time.monotonic() + 5
    while not fired and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    w.stop()
    assert len(fired) == 1 and fired[0].kind == "idle"
    assert "give --price" in fired[0].message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("%gpuwatch --idle-alert soon", "duration must be"),
        ("%gpuwatch --idle-alert 0", "duration must be"),
        ("%gpuwatch --idle-alert 1h30", "duration must be"),
        ("%gpuwatch --price -1", "price must be"),
        ("%gpuwatch --price free", "price must be"),
        ("%gpuwatch stop --price 2", "given when starting"),
    ],
)
def test_bad_price_or_duration_is_a_usage_error_before_any_thread(run, line, expected):
    r = run(line)
    assert isinstance(r.result.error_in_exec, UsageError), r.stdout
    assert expected in str(r.result.error_in_exec)
    assert _sampler_threads() == []


# -- %gpuenv --freeze Dockerfile -----------------------------------------------------------------
def _parse(path: Path):
    from dockerfile_parse import DockerfileParser

    return DockerfileParser(path=str(path))


@pytest.mark.parametrize("name", ["Dockerfile", "train.Dockerfile"])
def test_freeze_dockerfile_for_this_cpu_environment(run, tmp_path, name):
    import torch

    target = tmp_path / name
    r = run(f"%gpuenv --freeze {target} ;")
    assert r.result.success, r.result.error_in_exec
    requirements = tmp_path / (
        "requirements.frozen.txt" if name == "Dockerfile" else "train.requirements.frozen.txt"
    )
    note = r.bundles[0]["text/plain"]
    assert str(target) in note and str(requirements) in note
    parsed = _parse(target)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert torch.version.cuda is None  # this machine's torch is the CPU build
    assert parsed.baseimage == f"python:{py}-slim"
    runs = [i["value"] for i in parsed.structure if i["instruction"] == "RUN"]
    pin = f"torch=={torch.__version__}"
    torch_runs = [v for v in runs if pin in v.split()]
    assert torch_runs, runs
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_runs[0]
    assert any(f"-r /tmp/{requirements.name}" in v for v in runs)
    copies = [i["value"].split() for i in parsed.structure if i["instruction"] == "COPY"]
    assert [requirements.name, f"/tmp/{requirements.name}"] in copies
    cmd = next(i["value"] for i in parsed.structure if i["instruction"] == "CMD")
    assert json.loads(cmd)[:2] == ["jupyter", "lab"] and "--ip=0.0.0.0" in json.loads(cmd)
    assert any(i["instruction"] == "EXPOSE" and i["value"] == "8888" for i in parsed.structure)
    lines = requirements.read_text().splitlines()
    assert pin in lines
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines


def test_freeze_to_an_unknown_name_says_which_names_work(run, tmp_path):
    r = run(f"%gpuenv --freeze {tmp_path / 'image.docker'}")
    assert isinstance(r.result.error_in_exec, UsageError)
    assert "Dockerfile" in str(r.result.error_in_exec)


def _header(cuda: str | None, cudnn: str | None, torch_version: str, python: str = "3.11.9") -> Header:
    return Header(
        python=python,
        platform="Linux-6.8.0-x86_64-with-glibc2.35",
        torch_version=torch_version,
        torch_build=f"CUDA {cuda}" if cuda else "CPU-only",
        cuda=cuda,
        hip=None,
        when="2026-01-01 00:00 UTC",
        by="gpumagic test",
        cudnn=cudnn,
    )


def test_freeze_dockerfile_for_a_cuda_build(tmp_path):
    installed = [
        Installed("torch", "2.5.1+cu124"),
        Installed("torchvision", "0.20.1+cu124"),
        Installed("nvidia-cudnn-cu12", "9.1.0.70"),
        Installed("jupyterlab", "4.3.0"),
    ]
    target = tmp_path / "Dockerfile"
    result = freeze_dockerfile(target, _header("12.4", "9.1.0", "2.5.1+cu124"), installed)
    parsed = _parse(target)
    assert parsed.baseimage == "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
    assert result.base_image == parsed.baseimage
    runs = [i["value"] for i in parsed.structure if i["instruction"] == "RUN"]
    assert any(
        "--index-url https://download.pytorch.org/whl/cu124 torch==2.5.1+cu124 torchvision==0.20.1+cu124"
        in v
        for v in runs
    )
    assert any("ppa:deadsnakes/ppa" in v and "python3.11-venv" in v for v in runs)
    assert any("python3.11 -m venv /opt/venv" in v for v in runs)
    text = target.read_text()
    assert "last CUDA 12.4 release with cuDNN 9" in text
    assert "jupyterlab" not in " ".join(runs)  # pinned in the requirements already
    req = (tmp_path / "requirements.frozen.txt").read_text().splitlines()
    assert "torch==2.5.1+cu124" in req and "nvidia-cudnn-cu12==9.1.0.70" in req


@pytest.mark.parametrize(
    ("cuda", "cudnn", "python", "tag", "exact", "why"),
    [
        ("12.4", "9.1.0", "3.10.12", "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", True, "whose own Python is 3.10"),
        ("12.6", "9.5.1", "3.12.3", "nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04", True, "whose own Python is 3.12"),
        ("11.8", "8.7.0", "3.10.4", "nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04", True, "cuDNN 8"),
        # torch 2.4 cu121 wheels carry cuDNN 9; NVIDIA's cuDNN 9 images start at CUDA 12.3
        ("12.1", "9.1.0", "3.11.9", "nvidia/cuda:12.3.2-cudnn9-runtime-ubuntu22.04", False, "publishes no cuDNN runtime image of CUDA 12.1"),
        ("12.7", "9.5.0", "3.11.9", "nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04", False, "nearest"),
        ("13.9", "9.9.0", "3.12.1", "nvidia/cuda:13.2.1-cudnn-runtime-ubuntu24.04", False, "nearest"),
        (None, None, "3.13.1", "python:3.13-slim", True, "CPU build"),
    ],
)
def test_base_image_choice(cuda, cudnn, python, tag, exact, why):
    base = choose_base_image(cuda, cudnn, python)
    assert base.tag == tag
    assert base.exact is exact
    assert any(why in w for w in base.why), base.why


def test_every_listed_image_has_a_well_formed_tag():
    for image in CUDA_IMAGES:
        for ubuntu in image.ubuntu:
            tag = image.tag(ubuntu)
            assert tag.startswith(f"nvidia/cuda:{image.version}-cudnn") and tag.endswith(
                f"-runtime-ubuntu{ubuntu}"
            )
