"""%%gpuprofile on a one-GPU process group (issue 11): run where a GPU is lent (``gpu``).

One rank of NCCL moves nothing, and NCCL may launch no kernel for it; the calls are still
in the trace (their ``nccl:all_reduce`` spans and ``record_param_comms``), so the report
still has its Communication category and a collective table, with group size 1."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def group(tmp_path):
    def start(backend: str) -> None:
        import torch

        torch.cuda.set_device(0)
        dist.init_process_group(
            backend, init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
        )

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


CELL = (
    "%%gpuprofile -q --record-shapes\n"
    "for step in range(5):\n"
    "    y = (x @ x).relu()\n"
    "    dist.all_reduce(y)\n"
    "    gpumagic.step()\n"
    "torch.cuda.synchronize()\n"
)


def test_one_gpu_nccl_group_has_communication_and_a_collective_table(ip, run, group):
    group("nccl")
    r = run(
        "import torch, gpumagic, torch.distributed as dist\nx = torch.randn(2048, 2048, device='cuda')"
    )
    assert r.result.success, r.stdout
    r = run(CELL)
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    assert p.summary.steps == 5
    assert "Communication" in p.breakdown.index
    assert p.breakdown.loc["Kernel", "us"] > 0
    c = p.collectives
    assert not c.empty, "no collective found in the trace"
    ar = c.set_index("name").loc["all_reduce"]
    assert ar["backend"] == "nccl"
    assert ar["calls"] >= 5
    assert ar["group_size"] == 1
    assert ar["bytes_per_call"] == 2048 * 2048 * 4
    if p.primary.comms.kernels.any():  # a kernel NCCL ran for the one rank is communication
        assert p.breakdown.loc["Communication", "us"] > 0
        assert ar["device_us"] > 0
    assert p.live.distributed_backend == "nccl"
    assert "gloo_on_gpu" not in {f.rule for f in p.findings}
    assert "Communication" in r.html() or "Communication" in p.to_html()


def test_gloo_on_cuda_tensors_fires_gloo_on_gpu(ip, run, group):
    group("gloo")
    r = run(
        "import torch, gpumagic, torch.distributed as dist\nx = torch.randn(1024, 1024, device='cuda')"
    )
    assert r.result.success, r.stdout
    r = run(CELL)
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    assert p.collectives.set_index("name").loc["all_reduce", "backend"] == "gloo"
    assert p.breakdown.loc["Communication", "us"] > 0  # gloo's spans, on the host
    f = {f.rule: f for f in p.findings}["gloo_on_gpu"]
    assert f.confirmed  # the session's group is gloo
    assert "nccl" in f.snippet
