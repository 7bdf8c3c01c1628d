"""%%gpuprofile on CUDA: run on a machine with a GPU (marked ``gpu``; skipped without one)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# GEMM kernels by family name (cuBLAS, CUTLASS, cuBLASLt's nvjet on Hopper)
_GEMM = re.compile(r"gemm|nvjet|xmma|cutlass", re.IGNORECASE)

SETUP = """\
import torch, gpumagic
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1),
    torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10),
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
host_x = torch.randn(64, 3, 64, 64)              # pageable host memory
host_y = torch.randint(0, 10, (64,))
pinned_x, pinned_y = host_x.pin_memory(), host_y.pin_memory()
"""


def _own_notes(p):
    """The report's notes but the one an earlier test's torch.compile leaves for the rest of
    the process (no module hooks while compiled code exists)."""
    return [n for n in p.notes if not n.startswith("No per-module times")]


@pytest.fixture
def cuda_setup(run):
    r = run(SETUP)
    assert r.result.success, r.stdout


def test_training_steps_profiled_on_the_gpu_torch_names(ip, run, cuda_setup):
    r = run(
        "%%gpuprofile -q\n"
        "for step in range(8):\n"
        "    x, y = host_x.cuda(), host_y.cuda()\n"  # pageable copies
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    print_value = loss.item()\n"  # a device sync every step
        "    gpumagic.step()\n"
    )
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    s = p.summary
    # 8 marked, the first left out: it pays cuBLAS/cuDNN handle creation and lazy module loading
    assert s.steps == 7 and s.first_step_left_out is True and s.cpu_only is False
    assert _own_notes(p) == []  # CUPTI recorded GPU events: no "no GPU events" note
    assert 0 < s.gpu_utilization_percent <= 100
    assert len(p.kernels) > 0
    assert p.breakdown.loc["Kernel", "percent"] > 0
    assert abs(p.breakdown["percent"].sum() - 100) < 0.01
    rules = {f.rule: f for f in p.findings}
    assert "pageable_memcpy" in rules
    assert "sync" in rules
    for f in p.findings:
        assert 0 <= f.saving_us <= s.step_time_us * 1.01, f
    # the device the report names is the one torch ran on (whatever GPU this is)
    import torch

    from gpumagic.render.html import escape

    name = torch.cuda.get_device_name(torch.cuda.current_device())
    assert s.devices == [name]
    assert escape(name) in p._repr_mimebundle_()["text/html"]


def test_pinned_non_blocking_copies_do_not_fire_pageable_memcpy(ip, run, cuda_setup):
    r = run(
        "%%gpuprofile -q\n"
        "for step in range(6):\n"
        "    x, y = pinned_x.cuda(non_blocking=True), pinned_y.cuda(non_blocking=True)\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()\n"
        "    gpumagic.step()\n"
    )
    assert r.result.success, r.stdout
    rules = {f.rule for f in ip.user_ns["_gpuprofile"].findings}
    assert "pageable_memcpy" not in rules
    assert "sync" not in rules


def test_a_cpu_cell_in_a_gpu_session_gets_no_missing_gpu_events_note(ip, run, cuda_setup):
    # CUDA is initialised (SETUP moved the model), but this cell allocates nothing on the GPU
    r = run("%%gpuprofile -q\nimport torch\nx = torch.randn(64, 64) @ torch.randn(64, 64)\n")
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    assert _own_notes(p) == [], p.notes


@pytest.fixture
def ieee_matmul():
    """fp32 matmuls without TF32, set with the API PyTorch recommends since 2.9 (after which
    reading the legacy allow_tf32 getter raises RuntimeError)."""
    import torch

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "ieee"
    yield
    matmul.fp32_precision = before


def _gemm_kernels(p) -> list[str]:
    return [k for k in p.kernels["name"] if _GEMM.search(k)]


def test_fp32_matmul_on_tensor_core_gpu_fires_tensor_cores_and_autocast_fixes_it(
    ip, run, ieee_matmul
):
    import torch

    from gpumagic.profile.analysis.precision import autocast_matmuls, is_tensor_core_kernel

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the fp32 -> TF32/bf16 advice is for Ampere and later")
    run("import torch, gpumagic\na = torch.randn(4096, 4096, device='cuda')")
    r = run("%%gpuprofile -q -n fp32\nfor i in range(5):\n    b = a @ a\n    gpumagic.step()\ntorch.cuda.synchronize()\n")
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    # whatever cuBLAS picks for an IEEE fp32 GEMM (sm80/sm90 xmma ..._ffma_..., a SIMT sgemm),
    # it runs on the CUDA cores (ffma is plain FMA, xmma only a template library), and the
    # rule says so
    gemm = _gemm_kernels(p)
    assert gemm, list(p.kernels["name"])
    assert not any(is_tensor_core_kernel(k) for k in gemm), gemm
    rules = {f.rule: f for f in p.findings}
    assert "tensor_cores" in rules, (gemm, sorted(rules))
    f = rules["tensor_cores"]
    assert f.evidence["matmul_fp32_precision"] == "ieee"  # read with the new API, no raise
    assert "fp32_precision = 'tf32'" in f.snippet  # advice in the API the session uses

    r = run(
        "%%gpuprofile -q -n bf16\nfor i in range(5):\n    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "        b = a @ a\n    gpumagic.step()\ntorch.cuda.synchronize()\n"
    )
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    # silent for the right reason: the GEMMs ran on tensor-core kernels, and the trace (not
    # the word "autocast" in the cell's text) shows autocast around them
    gemm = _gemm_kernels(p)
    assert gemm and all(is_tensor_core_kernel(k) for k in gemm), gemm
    assert p.live.autocast_enabled is None
    host = p.primary.trace.host
    under = {host.name.at(i) for i, m in enumerate(autocast_matmuls(p.primary)) if m}
    assert "aten::matmul" in under, sorted(under)
    assert "tensor_cores" not in {f.rule for f in p.findings}
    r = run("%gpuprofile --compare fp32 bf16")
    assert r.result.success


_STICKY = """\
import json, torch
from IPython.testing import globalipapp
globalipapp.start_ipython()
ip = globalipapp.get_ipython()
ip.run_cell("%load_ext gpumagic")
r = ip.run_cell(
    "%%gpuprofile -q\\nimport torch\\nx = torch.zeros(4, device='cuda')\\n"
    "y = x[torch.tensor([10], device='cuda')]\\ntorch.cuda.synchronize()\\n"
)
from gpumagic.profile.record.recorder import current
print(json.dumps({
    "error": type(r.error_in_exec).__name__,
    "message": str(r.error_in_exec)[:300],
    "profiler_enabled": bool(torch.autograd._profiler_enabled()),
    "python_flag": bool(torch.autograd.profiler._is_profiler_enabled),
    "recorder_cleared": current() is None,
}))
"""


def test_sticky_cuda_error_leaves_no_profiler_and_raises_the_cells_error(tmp_path):
    """A device-side assert poisons the process's CUDA context, so it runs in a child."""
    import os

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.run(
        [sys.executable, "-c", _STICKY], capture_output=True, text=True, timeout=300, env=env
    )
    lines = [ln for ln in child.stdout.splitlines() if ln.startswith("{")]
    assert lines, child.stdout[-2000:] + child.stderr[-2000:]
    out = json.loads(lines[-1])
    assert "device-side assert" in out["message"], out  # the cell's own error
    assert out["profiler_enabled"] is False and out["python_flag"] is False, out
    assert out["recorder_cleared"] is True, out
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("gpumagic-profile-")]
