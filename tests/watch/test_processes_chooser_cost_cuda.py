"""Issue 12 on a real GPU: the process table, energy per cell, and %gpuselect's choice taking
effect (and its refusal once CUDA started). Skipped without a CUDA GPU and NVML."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from watch_helpers import nvml_and_cuda

REPO = Path(__file__).resolve().parents[2]
MIB = 1024**2


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml_and_cuda(), reason="needs a CUDA GPU and NVML"),
]


def test_process_table_shows_this_kernel_with_its_memory() -> None:
    import psutil
    import torch

    from gpumagic.monitor import Watcher

    x = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda:0")  # a context and 512 MiB
    torch.cuda.synchronize()
    try:
        w = Watcher(cells=False)
        status = w.status()
        frame = status.processes
        assert len(frame) >= 1, status.snapshot.processes
        mine = frame[frame["this_kernel"]]
        if len(mine):
            row = mine.iloc[0]
            assert row["pid"] == os.getpid()
            assert row["gpu_memory"] >= 512 * MIB  # the tensor, plus the CUDA context
            assert row["user"] == psutil.Process().username()
            assert sys.executable in row["command"] or "python" in row["command"]
            assert "this kernel" in str(status)
        else:
            # Inside a container NVML lists host PIDs: the table must say so and still show
            # memory, one of the rows being ours.
            notes = status.snapshot.processes.notes if status.snapshot.processes else []
            assert any("host PIDs" in n for n in notes), notes
            assert frame["gpu_memory"].max() >= 512 * MIB
        # nvidia-smi's bottom table lists the same pids (when it is there to ask).
        smi = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if smi.returncode == 0:
            smi_pids = {int(line.split(",")[0]) for line in smi.stdout.splitlines() if line.strip()}
            assert set(frame["pid"]) <= smi_pids | {os.getpid()}
    finally:
        del x
        torch.cuda.empty_cache()


def test_energy_per_cell_on_a_busy_cell(wshell: Any) -> None:
    import pandas as pd
    import torch

    from gpumagic.monitor import watch

    major, _ = torch.cuda.get_device_capability(0)
    wshell.user_ns["torch"] = torch
    w = watch(interval=0.1, shell=wshell)
    wshell.run_cell(
        "a = torch.randn(8192, 8192, device='cuda:0')\n"
        "import time\nt0 = time.perf_counter()\n"
        "while time.perf_counter() - t0 < 2.0:\n"
        "    b = a @ a\n"
        "    torch.cuda.synchronize()\n",
        store_history=True,
    )
    time.sleep(0.3)
    result = w.stop()
    wshell.user_ns.pop("a", None)
    wshell.user_ns.pop("b", None)
    torch.cuda.empty_cache()
    if major < 7:  # NVML's total-energy counter is Volta and later
        assert any("energy per cell not available" in n for n in result.notes)
        return
    assert not any("energy" in n for n in result.notes), result.notes
    cell = result.cells.iloc[-1]
    seconds = cell["duration_us"] / 1e6
    assert seconds >= 2.0
    energy_wh = cell["energy_wh"]
    assert energy_wh > 0
    # The counter against the power samples taken while the cell ran: the same energy
    # within a factor of two (power is sampled, the counter integrates).
    samples = result.samples
    gpus = samples[samples["device"] != "host"]
    start = cell["start"]
    end = start + pd.Timedelta(seconds=seconds)
    inside = gpus[(gpus["time"] >= start) & (gpus["time"] <= end)]
    watts = inside.groupby("time")["power_draw"].sum().mean()
    assert not math.isnan(watts) and watts > 0
    sampled_wh = watts * seconds / 3600
    assert 0.5 * sampled_wh <= energy_wh <= 2.0 * sampled_wh, (energy_wh, sampled_wh)
    limit = gpus["power_limit"].groupby(gpus["time"]).sum().max()
    assert energy_wh <= 1.2 * limit * seconds / 3600


def _python(code: str, env_value: str | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("CUDA_DEVICE_ORDER", None)
    if env_value is not None:
        env["CUDA_VISIBLE_DEVICES"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_gpuselect_choice_is_the_gpu_torch_then_uses() -> None:
    code = (
        "import json, os\n"
        "from gpumagic.monitor.choose import select_gpus\n"
        "c = select_gpus(1)\n"
        "import torch\n"
        "print(json.dumps({'chosen': c.uuids[0], 'env': os.environ['CUDA_VISIBLE_DEVICES'],\n"
        "  'count': torch.cuda.device_count(),\n"
        "  'torch': 'GPU-' + str(torch.cuda.get_device_properties(0).uuid)}))\n"
    )
    got = _python(code)
    assert got["count"] == 1
    assert got["chosen"].lower() == got["torch"].lower()


def test_gpuselect_refuses_after_cuda_started_or_its_choice_still_holds() -> None:
    # torch.cuda.is_available() runs cudaGetDeviceCount, which initialises the driver: a
    # CUDA_VISIBLE_DEVICES set after it no longer counts. The chooser must refuse then; if
    # this driver did not initialise, a choice it makes must be what torch uses.
    code = (
        "import json, os, torch\n"
        "assert torch.cuda.is_available()\n"
        "from gpumagic.monitor.choose import select_gpus\n"
        "try:\n"
        "    c = select_gpus(1)\n"
        "except ValueError as exc:\n"
        "    print(json.dumps({'refused': str(exc), 'env': os.environ.get('CUDA_VISIBLE_DEVICES')}))\n"
        "else:\n"
        "    print(json.dumps({'refused': None, 'chosen': c.uuids[0], 'count': torch.cuda.device_count(),\n"
        "      'torch': 'GPU-' + str(torch.cuda.get_device_properties(0).uuid)}))\n"
    )
    got = _python(code)
    if got["refused"] is not None:
        assert "already initialised" in got["refused"] and "restart the kernel" in got["refused"]
        assert got["env"] == os.environ.get("CUDA_VISIBLE_DEVICES")  # unchanged
    else:
        assert got["count"] == 1 and got["chosen"].lower() == got["torch"].lower()


def test_gpuselect_refuses_once_a_tensor_exists() -> None:
    code = (
        "import json, os, torch\n"
        "torch.zeros(1, device='cuda')\n"
        "from gpumagic.monitor.choose import select_gpus\n"
        "before = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        "try:\n"
        "    select_gpus(1)\n"
        "    print(json.dumps({'refused': None}))\n"
        "except ValueError as exc:\n"
        "    print(json.dumps({'refused': str(exc), 'same': before == os.environ.get('CUDA_VISIBLE_DEVICES')}))\n"
    )
    got = _python(code)
    assert got["refused"] and "already initialised" in got["refused"] and got["same"]
