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
    gc.collect()
    assert torch.cuda.memory_allocated() == baseline, "the failed cell's frames still hold GPU memory"
    r = run("%%memtrace -q\nok = torch.ones(8, device='cuda').sum().item()\n")
    assert r.result.success and ip.user_ns["ok"] == 8.0


def test_device_host_on_a_gpu_machine(ip, run):
    r = run("%%memtrace -q --device host\nx = torch.ones(2**24)\n")
    assert r.result.success
    assert ip.user_ns["_memtrace"].device.kind == "host"
