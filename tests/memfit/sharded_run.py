"""The reference for ``%%memfit --gpus N --shard ...``: the same step run for real on N
processes (``torch.multiprocessing``, spawn), the gloo backend on 127.0.0.1, DDP or FSDP2
(``fully_shard`` on each unit the prediction assumes, then on the model), each rank's peak
counted by the tensor census (``real_run.measure``: the bytes ``%%memtrace`` reports).

Two measurements per mode and rank:

* ``first``: wrapping, the optimizer and the first step in one measured cell (DDP's buckets
  and FSDP2's shards are made in it, where the census sees them);
* ``steady``: the next two steps, each measured alone (the optimizer's state exists), the
  higher of the two.

What gloo allocates inside its own collectives (a copy of an all-gather's output in its worker
thread, of a reduce-scatter's input) is outside the census's sight, as NCCL's buffers are
outside PyTorch's allocator on a GPU.

Robust on a loaded machine: a port found free just before, tried again on a clash; one time
limit for the whole run, after which every process still alive is killed; results written to
files (no queue to hang on).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

WRAP = {
    "ddp": "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(net)\n",
    "fsdp": (
        "from torch.distributed.fsdp import fully_shard\n"
        "for _block in units:\n    fully_shard(_block)\n"
        "model = fully_shard(net)\n"
    ),
}
OPTIMIZER = "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, model: str, modes: list[str], out: str) -> None:
    sys.path[:0] = [str(HERE), str(HERE.parents[1])]
    import torch
    import torch.distributed as dist
    from real_run import measure, prepare_source
    from sharded_models import MODELS

    from gpumagic.memory.fit.sharding.units import unit_modules

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch._C._set_mkldnn_enabled(False)
    make, step = MODELS[model]
    results: dict[str, Any] = {}
    try:
        for mode in modes:
            torch.manual_seed(0)
            net = make()
            ns: dict[str, Any] = {"torch": torch, "net": net, "units": [m for _, m in unit_modules(net)]}
            first = measure(prepare_source(WRAP[mode] + OPTIMIZER + step), ns)
            steady = [measure(prepare_source(step), ns) for _ in range(2)]
            results[mode] = {
                "first": first.peak_bytes,
                "steady": max(a.peak_bytes for a in steady),
                "categories": steady[-1].categories,
            }
            dist.barrier()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


def run_ranks(model: str, modes: list[str], world: int = 2, timeout_s: float = 900.0) -> list[dict[str, Any]]:
    """Each rank's measurements (see the module docstring), rank 0 first."""
    import torch.multiprocessing as mp

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    for _attempt in range(3):
        with tempfile.TemporaryDirectory() as out:
            ctx = mp.start_processes(
                _worker, args=(world, _free_port(), model, modes, out), nprocs=world, join=False, start_method="spawn"
            )
            try:
                while not ctx.join(timeout=5):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the {world} ranks took longer than {timeout_s:g} s")
            except mp.ProcessRaisedException as exc:
                last = exc
                if "Address already in use" in str(exc) or "EADDRINUSE" in str(exc):
                    continue  # another process took the port: again, on another
                raise
            finally:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                    p.join(timeout=30)
            return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    raise RuntimeError(f"could not start {world} ranks: {last}")


def main(argv: list[str]) -> None:
    """``python tests/memfit/sharded_run.py [mlp|gpt2 ...]``: the prediction of
    ``%%memfit --gpus 2 --shard ddp,fsdp`` beside each real rank's peak (the slow test's
    figures, printed)."""
    sys.path[:0] = [str(HERE), str(HERE.parents[1])]
    import torch
    from sharded_models import stepped
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpumagic.memory.fit.api import memfit

    torch._C._set_mkldnn_enabled(False)
    for model in argv or ["mlp", "gpt2"]:
        ns, step = stepped(model)
        with sdpa_kernel(SDPBackend.MATH):  # the attention the CPU ranks run (dropout: math)
            fit = memfit(step, ns, gpus=2, shard="ddp,fsdp")
        predicted = dict(zip(fit.shards["mode"], fit.shards["peak_bytes"]))
        ranks = run_ranks(model, ["ddp", "fsdp"])
        for mode in ("ddp", "fsdp"):
            real = [r[mode]["steady"] for r in ranks]
            error = predicted[mode] / max(real) - 1
            print(f"{model:5} {mode:5} predicted {predicted[mode]:>12,} real per rank "
                  f"{', '.join(f'{b:,}' for b in real)}  ({error:+.2%})")


if __name__ == "__main__":
    main(sys.argv[1:])
