"""What a GPU needs beyond the tensors a dry run counts, line by line, each figure with its
source and its range, and the verdict against a card.

Lines (torch 2.13 defaults; the range is what the figure may be on a given machine):

* **CUDA context**: the memory the driver takes for this process's context and the kernels
  it loads, outside PyTorch's allocator. 287,047,680 bytes with lazy module loading, PyTorch's
  default since 1.13, against 666,632,192 bytes with eager loading (pytorch#86509, measured
  by its author); 128-256 MiB for a bare context (InvokeAI#9447). Range 128 MiB to 636 MiB.
* **cuBLAS workspace**: allocated through the caching allocator on the first matmul of each
  stream, invisible to the dispatcher. 8,519,680 bytes by default before Hopper (the
  ``:4096:2:16:8`` configuration, seen in a memory snapshot:
  https://discuss.pytorch.org/t/178671), plus cuBLASLt's workspace of 1 MiB, 4 MiB on
  Ampere cards of 24 GB and more, 32 MiB on Hopper (pytorch#120925). The range's top
  allows a second stream.
* **cuDNN workspace**: a convolution's algorithm may ask for scratch memory, taken from the
  allocator for the call and given back after it. PyTorch tries algorithms in cuDNN's order
  and skips those whose workspace does not fit what is free (pytorch#49207), so near the
  limit a convolution runs a slower algorithm rather than failing, mostly: 0 to 1 GiB, only
  when the cell convolves (the forum thread behind pytorch#49207 saw 8.7 GB for one call).
* **Allocator fragmentation**: reserved memory no request could use, from replaying the
  dry run's allocations through the caching allocator's block rules
  (:mod:`.allocator`); 0 (``expandable_segments``, or the allocator giving cached segments
  back before it raises) to that figure.
* **Tensors' rounding** to 512-byte blocks is already in the predicted peak.

The verdict: fits (``True``) when the peak plus every line at the top of its range fits in
the card's memory (less its own uncertainty); does not fit (``False``) when the peak plus
every line at the bottom of its range exceeds it; otherwise ``None``: within the headroom's
uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
GiB = 2**30

CONTEXT = (287_047_680, 128 * MiB, 636 * MiB)
CONTEXT_SOURCE = "https://github.com/pytorch/pytorch/pull/86509"
CUBLAS = 8_519_680
CUBLAS_SOURCE = "https://discuss.pytorch.org/t/178671"
CUBLASLT_SOURCE = "https://github.com/pytorch/pytorch/pull/120925"
CUDNN_HIGH = 1 * GiB
CUDNN_SOURCE = "https://github.com/pytorch/pytorch/issues/49207"
FRAGMENTATION = "allocator fragmentation"
ALLOCATOR_SOURCE = "https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp"


@dataclass(frozen=True)
class HeadroomLine:
    what: str
    bytes: int  # the figure
    low: int
    high: int
    source: str
    why: str


def cublaslt_bytes(capability_major: int | None, total_bytes: int | None) -> int:
    """cuBLASLt's workspace as pytorch#120925 sizes it (1 MiB default)."""
    if capability_major is not None and capability_major >= 9:
        return 32 * MiB
    if capability_major == 8 and total_bytes is not None and total_bytes >= 24 * GiB:
        return 4 * MiB
    return 1 * MiB


def headroom(
    *,
    matmuls: bool,
    convolutions: bool,
    fragmentation: int | None,
    capability_major: int | None = None,
    total_bytes: int | None = None,
) -> list[HeadroomLine]:
    """The lines for a cell that runs ``matmuls`` / ``convolutions``, given the modelled
    ``fragmentation`` (None: not modelled) and, when known, the card's compute capability
    and memory (which size cuBLASLt's workspace)."""
    lines = [
        HeadroomLine(
            "CUDA context", CONTEXT[0], CONTEXT[1], CONTEXT[2], CONTEXT_SOURCE,
            "the driver's context and the kernels it loads, outside PyTorch's allocator "
            "(lazy module loading; 636 MiB with CUDA_MODULE_LOADING=EAGER)",
        )
    ]
    if matmuls:
        lines.append(_cublas(capability_major, total_bytes))
    if convolutions:
        lines.append(
            HeadroomLine(
                "cuDNN workspace", 0, 0, CUDNN_HIGH, CUDNN_SOURCE,
                "a convolution's scratch memory for its algorithm; torch skips algorithms "
                "that do not fit in what is free",
            )
        )
    if fragmentation is not None:
        lines.append(
            HeadroomLine(
                FRAGMENTATION, fragmentation, 0, fragmentation, ALLOCATOR_SOURCE,
                "reserved memory no request could use, from replaying the dry run's "
                "allocations through the caching allocator's block rules",
            )
        )
    return lines


def _cublas(capability_major: int | None, total_bytes: int | None) -> HeadroomLine:
    """cuBLAS's and cuBLASLt's workspaces for the card; for an unknown card (``--memory``),
    from the smallest (pre-Hopper, 1 MiB cuBLASLt) to two streams of Hopper's."""
    if capability_major is None:
        low = CUBLAS + 1 * MiB
        return HeadroomLine(
            "cuBLAS workspaces", low, low, 2 * (32 * MiB + 32 * MiB), CUBLASLT_SOURCE,
            "cuBLAS and cuBLASLt workspaces, per stream, through the caching allocator; the "
            f"card is unknown: pre-Hopper's to two streams of Hopper's ({CUBLAS_SOURCE})",
        )
    cublas = 32 * MiB if capability_major >= 9 else CUBLAS
    figure = cublas + cublaslt_bytes(capability_major, total_bytes)
    return HeadroomLine(
        "cuBLAS workspaces", figure, figure, 2 * figure, CUBLASLT_SOURCE,
        "cuBLAS and cuBLASLt workspaces, per stream, through the caching allocator "
        f"(cuBLAS {cublas / MiB:.1f} MiB: {CUBLAS_SOURCE}); a second stream doubles them",
    )


def verdict(peak: int, lines: list[HeadroomLine], capacity: int, capacity_uncertainty: int = 0) -> bool | None:
    """True: fits even with every line at its top; False: does not fit even at the bottom;
    None: within the headroom's uncertainty."""
    high = peak + sum(line.high for line in lines)
    low = peak + sum(line.low for line in lines)
    if high <= capacity - capacity_uncertainty:
        return True
    if low > capacity + capacity_uncertainty:
        return False
    return None


def needed(peak: int, lines: list[HeadroomLine]) -> tuple[int, int, int]:
    """(figure, low, high): the memory the cell needs on the card, headroom included."""
    return (
        peak + sum(line.bytes for line in lines),
        peak + sum(line.low for line in lines),
        peak + sum(line.high for line in lines),
    )
