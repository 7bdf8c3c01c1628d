"""%%gpuprofile on CUDA: run on a machine with a GPU (marked ``gpu``; skipped without one)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

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


@pytest.fixture
def cuda_setup(run):
    r = run(SETUP)
    assert r.result.success, r.stdout


def test_training_steps_profiled_with_kernels_and_sane_findings(ip, run, cuda_setup):
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
    assert s["steps"] == 8 and s["cpu_only"] is False
    assert 0 < s["gpu_utilization_percent"] <= 100
    assert len(p.kernels) > 0
    assert p.breakdown.loc["Kernel", "percent"] > 0
    assert abs(p.breakdown["percent"].sum() - 100) < 0.01
    rules = {f.rule: f for f in p.findings}
    assert "pageable_memcpy" in rules
    assert "sync" in rules
    for f in p.findings:
        assert 0 <= f.saving_us <= s["step_time_us"] * 1.01, f
    assert "H200" in r.html() or s.get("devices")


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


def test_fp32_matmul_on_tensor_core_gpu_fires_tensor_cores_and_autocast_fixes_it(ip, run):
    run("import torch, gpumagic\na = torch.randn(4096, 4096, device='cuda')\ntorch.backends.cuda.matmul.allow_tf32 = False")
    r = run("%%gpuprofile -q -n fp32\nfor i in range(5):\n    b = a @ a\n    gpumagic.step()\ntorch.cuda.synchronize()\n")
    assert r.result.success, r.stdout
    assert "tensor_cores" in {f.rule for f in ip.user_ns["_gpuprofile"].findings}
    r = run(
        "%%gpuprofile -q -n bf16\nfor i in range(5):\n    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "        b = a @ a\n    gpumagic.step()\ntorch.cuda.synchronize()\n"
    )
    assert r.result.success, r.stdout
    assert "tensor_cores" not in {f.rule for f in ip.user_ns["_gpuprofile"].findings}
    r = run("%gpuprofile --compare fp32 bf16")
    assert r.result.success
