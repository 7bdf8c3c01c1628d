"""The out-of-memory report as data: everything its section shows, in bytes, and what
follows from the numbers alone (fragmentation, an address-space cap). Pure: tested without
a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpumagic.memory.trace.oom.holders import Holder
from gpumagic.units import fmt_bytes

__all__ = ["FRAGMENTATION_MIN_BYTES", "FRAGMENTATION_SHARE", "OomReport"]

# Fragmentation worth a word: reserved-but-unallocated above this share of the reserved pool.
FRAGMENTATION_SHARE = 0.2
FRAGMENTATION_MIN_BYTES = 256 * 2**20



@dataclass
class OomReport:
    """Everything the OOM section shows; all sizes in bytes, None where unknown."""

    device: str  # "cuda:0 (NVIDIA H200)" or "host"
    exception: str  # "OutOfMemoryError: CUDA out of memory. Tried to allocate ..."
    requested: int | None
    free: int | None
    total: int | None
    allocated: int | None
    reserved: int | None
    holders: list[Holder] = field(default_factory=list)
    unnamed_bytes: int = 0  # tensors no name reaches, counted after the release below
    unnamed_count: int = 0
    released: int | None = None  # freed when the failed call's frames were released
    address_limit: int | None = None  # an RLIMIT_AS cap that made the host run out
    address_used: int | None = None
    advice: list[str] = field(default_factory=list)
    requested_note: str = ""  # how to read ``requested`` (the allocator's rounded size)
    # The tensor census at the failure (None without it): bytes by category, in
    # gpumagic.memory.census.categories' order, and the activations alive by module, largest first.
    categories: tuple[int, ...] | None = None
    activations: list[tuple[str, int]] = field(default_factory=list)
    # The %%memfit line that answers "what fits" (a dry run: nothing allocated, no GPU
    # needed), the report's last word; "" when none was made.
    memfit: str = ""

    @property
    def limit_note(self) -> str:
        if self.address_limit is None:
            return ""
        used = (
            f", {fmt_bytes(self.address_used)} of it in use"
            if self.address_used is not None
            else ""
        )
        return f"the process's address space is capped at {fmt_bytes(self.address_limit)} (RLIMIT_AS){used}"

    @property
    def reserved_unallocated(self) -> int | None:
        if self.reserved is None or self.allocated is None:
            return None
        return max(self.reserved - self.allocated, 0)

    @property
    def fragmented(self) -> bool:
        ru = self.reserved_unallocated
        if ru is None or not self.reserved:
            return False
        return ru >= FRAGMENTATION_MIN_BYTES and ru >= FRAGMENTATION_SHARE * self.reserved
