"""%%gpuprofile on a process group in the notebook's own process (issue 11), on the CPU:
a one-rank gloo group, DDP and nn.DataParallel as a session holds them."""

from __future__ import annotations

import pytest

dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def gloo_group(tmp_path):
    """A one-rank gloo process group for the test, torn down after it."""
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_gloo_group_gives_communication_collectives_and_session_facts(ip, run, gloo_group):
    r = run(
        "import torch, gpumagic, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(torch.nn.Linear(256, 256), find_unused_parameters=True)\n"
        "x = torch.randn(32, 256)\n"
    )
    assert r.result.success, r.stdout
    r = run(
        "%%gpuprofile -q --record-shapes\n"
        "for step in range(4):\n"
        "    model(x).sum().backward()\n"
        "    t = torch.ones(1000)\n"
        "    dist.all_reduce(t)\n"
        "    gpumagic.step()\n"
        "total = float(t[0])\n"
    )
    assert r.result.success, r.stdout
    assert ip.user_ns["total"] == 1.0  # the cell's own result, untouched
    p = ip.user_ns["_gpuprofile"]
    assert "Communication" in p.breakdown.index
    assert p.breakdown.loc["Communication", "us"] > 0
    c = p.collectives.set_index("name")
    ar = c.loc["all_reduce"]
    assert ar["backend"] == "gloo" and ar["group_size"] == 1
    assert ar["calls"] >= 8  # 4 of the cell's own, 4 of DDP's gradient bucket
    live = p.live
    assert live.distributed_backend == "gloo"
    assert [d.name for d in live.ddp] == ["model"]
    assert live.ddp[0].find_unused_parameters is True
    assert live.ddp[0].bucket_cap_mb == pytest.approx(25.0)


def test_nn_dataparallel_in_the_cell_fires_dataparallel_confirmed(ip, run):
    run(
        "import torch, gpumagic\n"
        "dp = torch.nn.DataParallel(torch.nn.Linear(64, 64))\n"  # on the CPU it just calls the module
        "x = torch.randn(8, 64)\n"
    )
    r = run("%%gpuprofile -q\nfor i in range(3):\n    y = dp(x)\n    gpumagic.step()\n")
    assert r.result.success, r.stdout
    f = {f.rule: f for f in ip.user_ns["_gpuprofile"].findings}["dataparallel"]
    assert f.confirmed
    assert f.evidence["wrapped_in_namespace"] == "dp"
    assert f.evidence["data_parallel_forward_calls_per_step"] == 1
    assert (f.line, f.source) == (3, "y = dp(x)")  # the line that calls the wrapped model
