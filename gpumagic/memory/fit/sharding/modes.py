"""The sharding modes and what each holds per rank, with the figures they use and where each
comes from. Sizes are in elements or bytes of one rank; the busiest rank (rank 0, which gets
the rounded-up share) is the one modelled.

* ``ddp`` - ``torch.nn.parallel.DistributedDataParallel`` (torch 2.13): every rank holds
  everything, plus the reducer's gradient buckets, flat tensors as large as the trainable
  parameters, allocated when DDP is built and kept (``Reducer::initialize_buckets`` in
  ``torch/csrc/distributed/c10d/reducer.cpp``; caps ``bucket_cap_mb`` = 25 MiB and
  ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB for the first, as the buckets are rebuilt after
  the first step, ``torch/nn/parallel/distributed.py``). ``gradient_as_bucket_view=False``
  (the default): the gradients are separate tensors copied into the buckets.
* ``fsdp`` - FSDP2, ``torch.distributed.fsdp.fully_shard`` (``torch/distributed/fsdp/
  _fully_shard/``): each parameter split on dim 0 into N chunks, padded to
  ``ceil(rows / N)`` rows (``_fsdp_param.py``); gradients reduce-scattered into shards and
  the optimizer's state made from them; each unit gathered before its forward and its
  backward (``foreach_all_gather`` into one flat buffer, ``foreach_all_gather_copy_out``
  into per-parameter buffers), freed after (the root not after forward), the flat buffer
  kept until the next unit's copy-out in forward, the next unit prefetched in backward, the
  reduce-scatter input kept until the next unit's (``_fsdp_param_group.py``,
  ``_fsdp_collectives.py``, ``_fsdp_state.py``).
* ``zero1``, ``zero2``, ``zero3`` - DeepSpeed ZeRO (Rajbhandari et al., "ZeRO: Memory
  Optimizations Toward Training Trillion Parameter Models", SC 2020,
  https://arxiv.org/abs/1910.02054): stage 1 divides the optimizer state by N, stage 2 the
  gradients too, stage 3 the parameters too. With 16-bit parameters DeepSpeed's optimizer
  holds an fp32 master copy and fp32 state (the paper's K = 12 bytes per parameter for
  Adam); with 32-bit ones, the state the cell's optimizer makes. Buffers as DeepSpeed's
  defaults make them (https://www.deepspeed.ai/docs/config-json/, ``reduce_bucket_size`` =
  5e8 elements, ``contiguous_gradients`` = true, ``overlap_comm`` = false,
  ``stage3_param_persistence_threshold`` = 1e5): stages 1 and 2 allocate a gradient bucket of
  ``reduce_bucket_size`` elements for each backward (``ipg_buffer`` in
  ``deepspeed/runtime/zero/stage_1_and_2.py``), stage 3 keeps one from the start
  (``__ipg_bucket_flat_buffer`` in ``stage3.py``); stage 3 leaves parameters under the
  persistence threshold whole, and is modelled gathering the same units as FSDP, each for its
  forward and its backward with the next one prefetched.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DDP_BUCKET_CAP",
    "DDP_FIRST_BUCKET",
    "MODES",
    "ZERO_PERSISTENCE",
    "ZERO_REDUCE_BUCKET",
    "Mode",
    "ddp_buckets",
    "fsdp_rows",
    "zero_model_states",
]

MiB = 2**20
DDP_BUCKET_CAP = 25 * MiB  # bucket_cap_mb's default
DDP_FIRST_BUCKET = 1 * MiB  # dist._DEFAULT_FIRST_BUCKET_BYTES
ZERO_REDUCE_BUCKET = 500_000_000  # reduce_bucket_size's default, elements
ZERO_PERSISTENCE = 100_000  # stage3_param_persistence_threshold's default, elements


@dataclass(frozen=True)
class Mode:
    name: str
    what: str  # a line for the report
    params: bool  # parameters divided
    grads: bool  # gradients divided
    state: bool  # optimizer state divided
    source: str


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("ddp", "DDP: everything on every rank, plus gradient buckets", False, False, False,
             "torch/csrc/distributed/c10d/reducer.cpp"),
        Mode("fsdp", "FSDP2 fully_shard: parameters, gradients, optimizer state divided; each unit gathered in turn",
             True, True, True, "torch/distributed/fsdp/_fully_shard/"),
        Mode("zero1", "ZeRO-1: optimizer state divided", False, False, True, "https://arxiv.org/abs/1910.02054"),
        Mode("zero2", "ZeRO-2: optimizer state and gradients divided", False, True, True,
             "https://arxiv.org/abs/1910.02054"),
        Mode("zero3", "ZeRO-3: parameters, gradients, optimizer state divided; gathered per unit", True, True, True,
             "https://arxiv.org/abs/1910.02054"),
    )
}


def fsdp_rows(rows: int, n: int) -> int:
    """Rows of a parameter's dim-0 shard on the busiest rank (FSDP2 pads to a multiple of n)."""
    return -(-rows // n)


def ddp_buckets(sizes: list[tuple[int, int]]) -> list[int]:
    """Bytes of each DDP gradient bucket for trainable parameters given as (bytes, dtype
    key), in the order DDP fills them (the parameters reversed: gradients come last layer
    first): per dtype, a bucket closes once it reaches its cap (1 MiB for the first, 25 MiB
    after), as ``compute_bucket_assignment_by_size`` does."""
    buckets: list[int] = []
    open_: dict[int, int] = {}
    first: dict[int, bool] = {}
    for nbytes, dtype in reversed(sizes):
        open_[dtype] = open_.get(dtype, 0) + nbytes
        cap = DDP_FIRST_BUCKET if first.get(dtype, True) else DDP_BUCKET_CAP
        if open_[dtype] >= cap:
            buckets.append(open_.pop(dtype))
            first[dtype] = False
    buckets.extend(v for v in open_.values() if v > 0)
    return buckets


def zero_model_states(psi: int, n: int, stage: int, param_bytes: int = 2, grad_bytes: int = 2, k: int = 12) -> int:
    """The ZeRO paper's model-state memory per rank (Rajbhandari et al. 2020, section 5 and
    figure 1): (2 + 2 + K)·Ψ for mixed-precision Adam without ZeRO; stage 1 divides K·Ψ by
    N, stage 2 also the gradients' 2Ψ, stage 3 also the parameters' 2Ψ."""
    params = param_bytes * psi / (n if stage >= 3 else 1)
    grads = grad_bytes * psi / (n if stage >= 2 else 1)
    state = k * psi / (n if stage >= 1 else 1)
    return int(params + grads + state)
