"""%%memtrace on CUDA: run on a machine with a GPU (marked ``gpu``; skipped without one)."""

from __future__ import annotations

import gc

import pytest

pytestmark = pytest.mark.gpu
MiB = 2**20
GiB = 2**30


@pytest.fixture(autouse=True)
def _cuda(ip):
    import torch

    ip.user_ns["torch"] = torch
    gc.collect()
    torch.cuda.empty_cache()
    yield
    gc.collect()
    torch.cuda.empty_cache()


def test_cuda_deltas_peaks_and_reserved(ip, run):
    r = run(
        "%%memtrace -q\n"
        "a = torch.zeros(16 * 2**20, device='cuda')\n"
        "b = (a * 2).sum()\n"
        "del a\n"
    )
    assert r.result.success, r.stdout
    t = ip.user_ns["_memtrace"]
    assert t.device.kind == "cuda" and t.device.label.startswith("cuda:0")
    rows = t.lines.set_index("line")
    assert rows.loc[2, "delta_bytes"] == 64 * MiB  # the allocator's exact bytes
    assert rows.loc[3, "peak_bytes"] >= 64 * MiB  # the temporary
    assert rows.loc[3, "delta_bytes"] < MiB
    assert rows.loc[4, "delta_bytes"] == -64 * MiB
    assert (rows["reserved_bytes"] >= rows["allocated_bytes"]).all()
    # host columns are measured separately on a GPU run
    assert "host_delta_bytes" in t.lines and t.device.kind != "host"


def test_cuda_loop_accumulates_hits(ip, run):
    r = run("%%memtrace -q\nxs = []\nfor i in range(4):\n    xs.append(torch.empty(2**20, device='cuda'))\n")
    assert r.result.success
    rows = ip.user_ns["_memtrace"].lines.set_index("line")
    assert rows.loc[4, "hits"] == 4
    assert rows.loc[4, "delta_bytes"] == 4 * 4 * MiB


def test_real_cuda_oom_report_and_memory_comes_back(ip, run):
    import torch

    baseline = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    ip.user_ns["too_much"] = int(total * 1.5)
    r = run(
        "%%memtrace\n"
        "def step():\n"
        "    activations = torch.ones(2**30, device='cuda')\n"  # 4 GiB held by the frame
        "    return torch.empty(too_much, dtype=torch.uint8, device='cuda')\n"
        "step()\n"
    )
    err = r.result.error_in_exec
    assert isinstance(err, torch.OutOfMemoryError)
    t = ip.user_ns["_memtrace"]
    assert t.oom is not None
    assert t.oom.requested is not None and abs(t.oom.requested - ip.user_ns["too_much"]) < 64 * MiB
    assert t.oom.free is not None and t.oom.total == total
    assert "Out of memory on cuda:0" in r.html()
    # it ends with the %%memfit line for this card (by the table's name, or its size)
    assert t.oom.memfit.startswith(("%%memfit --gpu ", "%%memfit --memory ")), t.oom.memfit
    gc.collect()
    assert torch.cuda.memory_allocated() == baseline, "the failed cell's frames still hold GPU memory"
    r = run("%%memtrace -q\nok = torch.ones(8, device='cuda').sum().item()\n")
    assert r.result.success and ip.user_ns["ok"] == 8.0


def test_device_host_on_a_gpu_machine(ip, run):
    r = run("%%memtrace -q --device host\nx = torch.ones(2**24)\n")
    assert r.result.success
    assert ip.user_ns["_memtrace"].device.kind == "host"


# -- CUDA behaviour on the GPU (issue 9): gpumagic never runs torch's _lazy_init; kernels run ------
# -- asynchronously, so a sync is charged the GPU time; a host OOM on a GPU machine is a host OOM --
_UNTOUCHED = r'''
import json, torch
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell("%load_ext gpumagic", store_history=False)
seen = {}
r = shell.run_cell("%%memtrace -q\nx = 1\ny = [x] * 3\n", store_history=True)
seen["memtrace_ok"] = bool(r.success)
seen["memtrace_device"] = shell.user_ns["_memtrace"].device.kind
seen["after_memtrace"] = torch.cuda.is_initialized()
r = shell.run_cell("e = %gpuenv", store_history=True)
report = shell.user_ns["e"]
seen["env_ok"] = bool(r.success)
seen["env_gpus"] = [[g.name, g.source, g.total_memory] for g in report.gpus]
seen["after_gpuenv"] = torch.cuda.is_initialized()
from gpumagic.monitor import Watcher
from gpumagic.monitor.nvml import cuda_in_use
w = Watcher(cells=False)
w.sample_now()
w.stop()
seen["after_watcher"] = torch.cuda.is_initialized()
seen["in_use_before"] = cuda_in_use()
seen["has_primary_context_api"] = hasattr(torch._C, "_cuda_hasPrimaryContext")
torch.cuda.init()  # _lazy_init: initialised, still no context
seen["in_use_after_lazy_init"] = cuda_in_use()
t = torch.ones(1, device="cuda")
seen["in_use_after_tensor"] = cuda_in_use()
print(json.dumps(seen))
'''


def test_memtrace_gpuenv_and_the_watcher_leave_cuda_uninitialised():
    """Nothing of gpumagic initialises CUDA on a GPU machine, in a fresh process (this one's
    CUDA was initialised by the fixtures)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run(
        [sys.executable, "-c", _UNTOUCHED],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["memtrace_ok"] and seen["memtrace_device"] == "cuda", seen  # CUDA was tracked
    assert seen["after_memtrace"] is False, seen
    assert seen["env_ok"] and seen["env_gpus"], seen  # names and memory, from NVML
    assert all(name and name != "?" and total for name, _, total in seen["env_gpus"]), seen
    assert seen["after_gpuenv"] is False, seen
    assert seen["after_watcher"] is False, seen
    assert seen["in_use_before"] is False
    assert seen["in_use_after_lazy_init"] is False, seen  # initialised is not "in use"
    assert seen["in_use_after_tensor"] is True, seen  # a context is


def test_sync_moves_the_gpu_time_to_the_statement_that_queued_it(ip, run):
    cell = (
        "a = torch.randn(8192, 8192, device='cuda')\n"
        "torch.cuda.synchronize()\n"
        "for _ in range(20):\n"
        "    b = a @ a\n"  # ~20 x 1.1 TFLOP: hundreds of ms of GPU work, microseconds to launch
        "s = b.sum().item()\n"  # waits for all of it
    )
    # first-call costs (cuBLAS handle and workspace, lazy module loading) out of the way
    warm = run("_w = torch.randn(8192, 8192, device='cuda')\n_w = _w @ _w\ntorch.cuda.synchronize()\n")
    assert warm.result.success
    ip.user_ns.pop("_w", None)
    r = run("%%memtrace -q\n" + cell)
    assert r.result.success, r.stdout
    host = ip.user_ns["_memtrace"]
    assert host.time_label == "host time" and "asynchronously" in host.time_note
    t = host.lines.set_index("line")["time_us"]
    assert t.loc[6] > t.loc[5], t  # without --sync the .item() is charged the matmuls
    r = run("%%memtrace -q --sync\n" + cell)
    assert r.result.success, r.stdout
    synced = ip.user_ns["_memtrace"]
    assert synced.synced and synced.time_label == "time (synced)"
    t = synced.lines.set_index("line")["time_us"]
    assert t.loc[5] > 10 * t.loc[6], t  # with it, the matmul line is
    assert synced.sync_count >= 20 and synced.sync_ns / 1000 >= 0.5 * t.loc[5]
    assert "The waits took" in synced.time_note
    ip.user_ns.pop("a", None)
    ip.user_ns.pop("b", None)


def test_host_oom_on_the_gpu_machine_is_a_host_report(ip, run):
    r = run(
        "%%memtrace -q\n"
        "g = torch.ones(2**20, device='cuda')\n"
        "keep = torch.ones(2**21)\n"
        "huge = torch.empty(2**45, dtype=torch.uint8)\n"
    )
    assert isinstance(r.result.error_in_exec, RuntimeError)
    t = ip.user_ns["_memtrace"]
    assert t.device.kind == "cuda" and t.oom is not None
    assert t.oom.device == "host" and t.oom.requested == 2**45
    names = {h.name for h in t.oom.holders}
    assert "keep" in names and "g" not in names  # the host's tensors, not the GPU's


# -- the tensor census on CUDA (issue 16): the same categories as on the CPU, within the caching
# -- allocator's rounding (each block a multiple of 512 bytes)

_MLP = (
    "%%memtrace -q {opts}\n"
    "x = torch.randn(64, 128, device=dev)\n"
    "model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),"
    " nn.Linear(256, 1)).to(dev)\n"
    "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
    "loss = model(x).sum()\n"
    "loss.backward()\n"
    "optimizer.step()\n"
    "optimizer.zero_grad(set_to_none=True)\n"
)


def _rounded(n: int) -> int:
    return -(-n // 512) * 512


def test_cuda_categories_match_the_cpu_within_the_allocators_rounding(ip, run):
    from gpumagic.memory.census.categories import COLUMNS

    ip.user_ns["nn"] = __import__("torch").nn
    traces = {}
    for dev in ("cpu", "cuda"):
        ip.user_ns["dev"] = dev
        r = run(_MLP.format(opts="--device cuda" if dev == "cuda" else "--device host"))
        assert r.result.success, r.result.error_in_exec
        traces[dev] = ip.user_ns["_memtrace"]
    cpu, cuda = (traces[d].lines.set_index("line") for d in ("cpu", "cuda"))
    assert traces["cuda"].device.kind == "cuda" and traces["cuda"].has_categories
    params = list(ip.user_ns["model"].parameters())
    rounded = sum(_rounded(p.nbytes) for p in params)
    assert cuda.loc[3, "params_bytes"] == rounded
    assert cuda.loc[5, "activations_bytes"] == cpu.loc[5, "activations_bytes"] == 2 * 64 * 256 * 4
    assert cuda.loc[6, "activations_bytes"] == 0 and cuda.loc[6, "grads_bytes"] == rounded
    # Adam's step counters stay on the CPU unless capturable: on CUDA, the moments alone
    assert cuda.loc[7, "optimizer_bytes"] == 2 * rounded
    # every row adds up to the allocator's own total; "other" is what no tensor accounts for
    assert (cuda[list(COLUMNS)].sum(axis=1) == cuda["allocated_bytes"]).all()
    assert (cuda["other_bytes"] >= 0).all()
    # each row's tensors within the rounding of the CPU's figure (at most 512 B per tensor)
    tensors = 2 * len(params) + 4  # parameters, gradients or moments, x, loss, activations
    for line in cpu.index:
        for col in ("params_bytes", "grads_bytes", "activations_bytes"):
            assert 0 <= cuda.loc[line, col] - cpu.loc[line, col] <= 512 * tensors, (line, col)
    peak = traces["cuda"].at_peak
    assert peak is not None and sum(peak.categories.values()) == peak.total


def test_cuda_census_off_with_no_tensors(ip, run):
    r = run("%%memtrace -q --no-tensors\nx = torch.ones(2**20, device='cuda')\n")
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    assert t.device.kind == "cuda" and not t.has_categories
    assert t.lines.iloc[0].delta_bytes == 4 * MiB
