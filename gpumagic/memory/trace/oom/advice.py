"""What to try after running out of memory, most specific first, from what the report found
(who holds the memory, what the failing call held, fragmentation, a CUDA library's
workspace)."""

from __future__ import annotations

import re

from gpumagic.memory.trace.oom.model import OomReport

__all__ = ["advice"]


def advice(report: OomReport, cuda: bool, retries: int = 0) -> list[str]:
    """What to try, most specific first, from what the report found."""
    roles = {h.role for h in report.holders}
    out: list[str] = []
    if (
        report.requested is not None
        and report.total is not None
        and report.requested > report.total
    ):
        out.append(
            "The single allocation is larger than the whole device: check the tensor's shape "
            "(a wrong dimension or a missing batch split), not just the batch size."
        )
    out.append("Reduce the batch size (or accumulate gradients over smaller micro-batches).")
    if "parameter" in roles:
        out.append(
            "Trade compute for activation memory with gradient checkpointing: "
            "torch.utils.checkpoint.checkpoint / checkpoint_sequential."
        )
        out.append(
            "Run the forward pass under torch.autocast (bf16/fp16) to halve activation memory."
        )
    if "gradient" in roles:
        out.append(
            "Free gradients between steps with optimizer.zero_grad(set_to_none=True) "
            "(the default since torch 2.0) instead of zeroing them."
        )
    if cuda:
        if re.search(r"CU(?:BLAS|SOLVER|SPARSE|DNN)_STATUS|CUFFT_ALLOC", report.exception):
            out.append(
                "A CUDA library could not get memory for its handle or workspace, outside "
                "torch's allocator: torch.cuda.empty_cache() before the call hands the "
                "allocator's cached blocks back to the driver for it."
            )
        out.append(
            "Drop references you no longer need (del x), then torch.cuda.empty_cache() "
            "to hand the cached blocks back."
        )
        if report.fragmented or retries > 0:
            out.append(
                "Much memory is reserved but not allocated (fragmentation): set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch starts."
            )
    else:
        out.append("Drop references you no longer need (del x; gc.collect()).")
    named = sum(h.nbytes for h in report.holders if h.role != "in the failing call")
    if report.released and report.released > named:
        out.insert(
            1,
            "The failing call itself held more than every named tensor together (activations "
            "kept for the backward pass): a smaller batch, checkpointing or autocast shrink "
            "exactly that.",
        )
    if report.unnamed_bytes and report.allocated and report.unnamed_bytes > 0.25 * report.allocated:
        out.append(
            "Much of the memory is held by tensors no variable names: outputs kept in Out[] "
            "or _, lists of losses without .item(), or a previous exception's traceback "
            "(%reset -f out, or del the container)."
        )
    return out
