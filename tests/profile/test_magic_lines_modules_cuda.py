"""%%gpuprofile per line and per module on CUDA (marked ``gpu``; skipped without one).

What only a GPU run shows: GPU time charged to the line that launched it, including the
kernels autograd's device thread launches during ``loss.backward()``, at the magnitude a
CUDA-event timing of the same work gives.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

_GEMM = re.compile(r"gemm|nvjet|xmma|cutlass", re.IGNORECASE)

SETUP = """\
import torch, gpumagic
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
    torch.nn.Linear(32 * 32 * 32, 10),
).cuda()
host_x = torch.randn(64, 3, 32, 32)              # pageable host memory
a = torch.randn(4096, 4096, device="cuda")
for _ in range(3):                               # cuBLAS handle, kernels loaded: warm
    a @ a
torch.cuda.synchronize()
"""

CELL = """\
%%gpuprofile -q
for step in range(6):
    x = host_x.cuda()
    y = a @ a
    z = (x * 2).sum()
    loss = model(x).square().mean()
    loss.backward()
    torch.cuda.synchronize()
    gpumagic.step()
"""


@pytest.fixture
def profiled(ip, run):
    r = run(SETUP)
    assert r.result.success, r.stdout
    r = run(CELL)
    assert r.result.success, r.stdout
    return ip.user_ns["_gpuprofile"]


def _gemm_us(ip, run) -> float:
    """One 4096x4096 fp32 GEMM timed with CUDA events, outside any profiler."""
    r = run(
        "start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
        "start.record()\n"
        "for _ in range(10):\n"
        "    a @ a\n"
        "end.record(); torch.cuda.synchronize()\n"
        "gemm_us = start.elapsed_time(end) * 1000 / 10\n"
    )
    assert r.result.success, r.stdout
    return float(ip.user_ns["gemm_us"])


def test_gpu_time_per_line(ip, run, profiled):
    p = profiled
    assert not p.summary.cpu_only
    lines = p.lines.set_index("line")
    assert list(lines.index) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert list(lines["hits"]) == [7, 6, 6, 6, 6, 6, 6, 6]
    gpu = p.primary.trace.gpu
    all_gpu_us = float((gpu.end - gpu.ts).sum())
    # every GPU event was launched from inside a statement of the cell
    assert lines["device_us"].sum() >= 0.95 * all_gpu_us
    # the GEMM line: most of the GPU time, on a GEMM kernel, at the CUDA-event magnitude
    assert lines["device_us"].idxmax() == 4
    assert _GEMM.search(lines.loc[4, "top_kernel"]), lines.loc[4, "top_kernel"]
    per_call = lines.loc[4, "device_us"] / 6
    gemm = _gemm_us(ip, run)
    assert 0.5 * gemm < per_call < 2.0 * gemm, (per_call, gemm)
    # the copy's line holds the pageable host-to-device copies
    assert lines.loc[3, "device_us"] > 0
    copies = gpu.name.mask(lambda n: n.startswith("Memcpy HtoD"))
    assert lines.loc[3, "device_us"] >= 0.99 * float((gpu.end - gpu.ts)[copies].sum())
    # the synchronize line launches nothing, whatever it waits for
    assert lines.loc[8, "device_us"] == 0
    # device_percent is each line's share of all GPU time
    assert lines["device_percent"].sum() == pytest.approx(
        100 * lines["device_us"].sum() / all_gpu_us
    )


def test_backward_kernels_from_autograds_thread_belong_to_the_backward_line(profiled):
    from gpumagic.profile.analysis.lines import line_attribution

    p = profiled
    a = p.primary
    att = line_attribution(a)
    backward_row = int(np.flatnonzero(p.lines["line"].to_numpy() == 7)[0])
    rt = a.trace.runtime
    launched = a.launch_runtime[att.gpu_rows == backward_row]
    launched = launched[launched >= 0]
    statement_thread = set(a.trace.code.statements.thread.tolist())
    threads = set(rt.thread[launched].tolist())
    # CUDA autograd runs backward on its device thread: those launches are on another thread
    assert threads - statement_thread, "no backward kernel came from another thread"
    assert p.lines.set_index("line").loc[7, "device_us"] > 0


def test_modules_forward_and_backward_on_the_gpu(profiled):
    m = profiled.modules.set_index("module")
    assert list(m.index) == ["model", "model.0", "model.1", "model.2", "model.3"]
    assert (m["calls"] == 6).all()
    for name in ("model", "model.0", "model.3"):
        assert m.loc[name, "forward_device_us"] > 0, name
        assert m.loc[name, "backward_device_us"] > 0, name  # via Sequence number links
    assert m.loc["model", "backward_device_us"] >= m.loc["model.0", "backward_device_us"]


def test_pageable_copy_finding_names_its_line(profiled):
    found = {f.rule: f for f in profiled.findings}
    assert "pageable_memcpy" in found
    f = found["pageable_memcpy"]
    assert (f.line, f.source) == (3, "x = host_x.cuda()")
    assert "line 3 · `x = host_x.cuda()`" in profiled.to_text()
