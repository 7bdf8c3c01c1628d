"""A real DDP job: torchrun starts two CPU processes over gloo, each profiles a few steps
into its own trace, and the per-rank directory loads back with its communication."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch.distributed")

SCRIPT = textwrap.dedent(
    """
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_* from torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name=f"rank{rank}"),
        record_shapes=True,  # the gloo spans then carry their tensors' sizes
    ) as prof:
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_a_gloo_ddp_job_shows_communication_on_every_rank(tmp_path):
    from gpumagic.profile.load import load_trace

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    traces = tmp_path / "traces"
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--standalone",
            str(script),
            str(traces),
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1", KINETO_LOG_LEVEL="6"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"torchrun: {time.perf_counter() - started:.1f} s")

    r = load_trace(traces)
    assert r.ranks == [0, 1]
    pr = r.per_rank.set_index("rank")
    assert (pr["steps"] == 3).all()
    assert (pr["Communication_percent"] > 0).all()
    assert pr["collective_wait_us_per_step"].notna().all()
    c = r.collectives
    for rank in (0, 1):
        mine = c[c["rank"] == rank].set_index("name")
        assert "all_reduce" in mine.index
        ar = mine.loc["all_reduce"]
        assert ar["backend"] == "gloo" and ar["group_size"] == 2
        assert ar["calls"] >= 3  # one bucket per step: the model is far below 25 MB
        # the bucket holds every gradient: 256*512 + 512 + 512*10 + 10 floats
        assert ar["bytes_per_call"] == 4 * (256 * 512 + 512 + 512 * 10 + 10)
        assert ar["host_us"] > 0 and ar["device_us"] == 0
    s = r.summary
    assert s.communication_overlap_percent is not None
    assert 0 <= s.communication_overlap_percent <= 100
    assert "communication" in r.to_text()
