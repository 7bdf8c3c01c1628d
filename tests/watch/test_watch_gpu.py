"""The real NVML path; skipped without a CUDA GPU and a working NVIDIA driver."""

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
from svg_images import inline_svg
from watch_helpers import nvml_and_cuda, wait_for

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml_and_cuda(), reason="needs a CUDA GPU and NVML"),
]


# No fixture clears CUDA_VISIBLE_DEVICES here: torch read it when it started and caches its device
# count, and a watcher reading another value than torch did would watch other GPUs than torch's.


def _watched_gpus(w: Any) -> int:
    return sum(d.kind == "cuda" for d in w.devices)


def test_real_samples() -> None:
    import torch

    from gpumagic.monitor import watch

    w = watch(interval=0.1, cells=False)
    assert w.reason is None
    assert wait_for(lambda: w.samples_taken >= 5, 5.0)
    result = w.stop()
    gpus = result.samples[result.samples["device"] != "host"]
    assert len(gpus) >= 5 * _watched_gpus(w) > 0  # the watcher's own GPUs, not torch's count
    first = gpus[gpus["cuda_index"] == 0]
    assert (first["name"] == torch.cuda.get_device_name(0)).all()
    total = torch.cuda.get_device_properties(0).total_memory
    assert first["memory_total"].iloc[-1] == pytest.approx(total, rel=0.05)
    assert first["utilization_gpu"].between(0, 100).all()
    # an idle H100/H200 shows 0 MiB used in NVML's v2 struct (as nvidia-smi does): >= 0
    assert first["memory_used"].between(0, first["memory_total"].iloc[-1]).all()
    assert first["temperature"].between(1, 120).all()
    assert first["clock_sm"].gt(0).all() and first["clock_mem"].gt(0).all()
    assert first["power_limit"].gt(0).all() and first["power_draw"].gt(0).all()
    assert first["throttle_reasons"].notna().all()
    host = result.samples[result.samples["device"] == "host"]
    assert host["host_memory_total"].gt(0).all()  # the host is sampled alongside the GPUs


def test_kernels_own_memory_after_a_cuda_tensor() -> None:
    import torch

    from gpumagic.monitor import Watcher

    x = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    w = Watcher(cells=False)
    w.sample_now()
    entry = w.status()["cuda:0"]
    assert entry["memory_used"] >= GIB
    own = entry["process_memory_used"]
    if math.isnan(own):
        # Inside a container's PID namespace NVML cannot match us; the note must say so.
        assert any("PID namespace" in n for n in w.notes())
    else:
        assert own >= GIB  # the tensor, plus the CUDA context
    del x


def test_torch_uuids_match_nvml() -> None:
    import torch

    from gpumagic.monitor.devices import map_from_torch, torch_visible_uuids
    from gpumagic.monitor.nvml import nvml_state

    torch.zeros(1, device="cuda:0")  # CUDA initialised: torch's order is authoritative
    uuids = torch_visible_uuids()
    assert uuids is not None and len(uuids) == torch.cuda.device_count()
    order = map_from_torch(uuids, [g.uuid for g in nvml_state().gpus])
    assert order is not None and len(order) == len(uuids)


_TORCH_AND_PARSE = """
import json, os, torch
from gpumagic.monitor.devices import parse_visible_devices
from gpumagic.monitor.nvml import nvml_state
nvml_uuids = [g.uuid for g in nvml_state().gpus]
order, notes = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), nvml_uuids)
torch_nvml_count = torch.cuda.device_count()  # torch's own parser, before CUDA starts
runtime_count = torch._C._cuda_getDeviceCount()  # cudaGetDeviceCount: what CUDA exposes
uuids = []
if runtime_count > 0:
    torch.cuda.init()
    uuids = ["GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(runtime_count)]
print(json.dumps({"ours": [nvml_uuids[i] for i in order], "runtime": uuids,
                  "torch_parser": torch_nvml_count, "notes": notes}))
"""


def _subprocess_env(env_value: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if env_value is not None:
        env["CUDA_VISIBLE_DEVICES"] = env_value
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the kit's site dir too
    return env


def test_visible_devices_parsed_as_cuda_exposes_them() -> None:
    """In a fresh process per value, the GPUs parse_visible_devices picks are the ones the CUDA
    runtime exposes to torch (a repeated entry exposes none, ordinals are read like strtoul,
    UUID prefixes select)."""
    from gpumagic.monitor.nvml import nvml_state

    gpus = nvml_state().gpus
    first, last = gpus[0], gpus[-1]
    assert first.uuid is not None and last.uuid is not None
    cases = [
        str(last.nvml_index),
        f"{last.nvml_index},99",
        f"{last.nvml_index},{last.nvml_index}",  # a repeat: CUDA exposes nothing
        f"{first.nvml_index}gpu",  # strtoul: the leading digits
        last.uuid[:12],
        f"{last.uuid},{last.uuid[:12]}",  # one GPU twice, by UUID and by prefix
        "",
        "-1",
    ]
    if len(gpus) > 1:
        cases += [f"{last.nvml_index},{first.nvml_index}", f"{first.nvml_index},{last.nvml_index},{first.nvml_index}"]
    for value in cases:
        out = subprocess.run(
            [sys.executable, "-c", _TORCH_AND_PARSE],
            cwd=REPO,
            env=_subprocess_env(value),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen["ours"] == seen["runtime"], (value, seen, out.stderr[-2000:])


def _devices_in_subprocess(env_value: str | None) -> dict[str, Any]:
    code = (
        "import json; from gpumagic.monitor import Watcher\n"
        "w = Watcher(cells=False)\n"
        "print(json.dumps({'reason': w.reason, 'notes': w.notes(), 'gpus': "
        "[[d.cuda_index, d.nvml_index, d.uuid] for d in w.devices if d.kind == 'cuda']}))"
    )
    env = _subprocess_env(env_value)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cuda_visible_devices_mapping() -> None:
    from gpumagic.monitor.nvml import nvml_state

    gpus = nvml_state().gpus
    last = gpus[-1]
    by_index = _devices_in_subprocess(str(last.nvml_index))
    assert by_index["gpus"] == [[0, last.nvml_index, last.uuid]]
    assert last.uuid is not None
    by_uuid = _devices_in_subprocess(last.uuid[:12])  # CUDA accepts a unique UUID prefix
    assert by_uuid["gpus"] == [[0, last.nvml_index, last.uuid]]
    stops = _devices_in_subprocess(f"{last.nvml_index},99")
    assert stops["gpus"] == [[0, last.nvml_index, last.uuid]] and any(
        "'99'" in n for n in stops["notes"]
    )
    hidden = _devices_in_subprocess("")
    assert hidden["gpus"] == [] and "hides every GPU" in hidden["reason"]


def test_busy_cell_shows_high_utilization(wshell: Any) -> None:
    import torch

    from gpumagic.monitor import watch

    wshell.user_ns["torch"] = torch
    w = watch(interval=0.1, shell=wshell)
    wshell.run_cell(
        "a = torch.randn(8192, 8192, device='cuda:0')\n"
        "import time\nt0 = time.perf_counter()\n"
        "while time.perf_counter() - t0 < 1.5:\n"
        "    b = a @ a\n"
        "    torch.cuda.synchronize()\n",
        store_history=True,
    )
    time.sleep(0.2)
    result = w.stop()
    cell = result.cells.iloc[-1]
    assert cell["samples"] >= 5
    assert cell["peak_utilization"] >= 50
    assert cell["utilization_of"] == "cuda:0"  # the GPU this process used, not the busiest
    assert cell["peak_memory"] >= 256 * 1024**2  # two 256 MiB matrices
    html = inline_svg(result._repr_mimebundle_()["text/html"])
    assert html.count("<svg") == 4 * _watched_gpus(w) + 2  # per watched GPU, not torch's count
    wshell.user_ns.pop("a", None)
    wshell.user_ns.pop("b", None)
    torch.cuda.empty_cache()
