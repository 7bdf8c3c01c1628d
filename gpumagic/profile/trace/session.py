"""What the running session can tell the diagnosis that a trace cannot.

A trace shows ``_SingleProcessDataLoaderIter`` but not whether ``pin_memory`` was set;
it shows fp32 matmul kernels but not whether TF32 was allowed. When ``%%gpuprofile``
runs a cell it can look at the session (the DataLoaders and optimizers in the user's
namespace, ``torch.backends`` flags) and hand that to the rules as a :class:`LiveState`
to confirm or rule out what the trace hints. Every field is optional: ``None`` means
"not known", and a rule then decides from the trace alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

_T = TypeVar("_T")


@dataclass(frozen=True)
class LoaderState:
    """A ``torch.utils.data.DataLoader`` found in the namespace."""

    name: str
    num_workers: int
    pin_memory: bool
    batch_size: int | None = None


@dataclass(frozen=True)
class OptimizerState:
    """A ``torch.optim.Optimizer`` found in the namespace (``foreach``/``fused`` as configured)."""

    name: str
    kind: str  # class name: "SGD", "AdamW"
    foreach: bool | None = None
    fused: bool | None = None


@dataclass(frozen=True)
class DdpState:
    """A ``DistributedDataParallel`` model found in the namespace, as configured."""

    name: str
    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool | None = None
    find_unused_parameters: bool | None = None
    static_graph: bool | None = None


@dataclass(frozen=True)
class LiveState:
    """Session facts the rules may use; ``None`` everywhere means trace-only diagnosis."""

    loaders: tuple[LoaderState, ...] = ()
    optimizers: tuple[OptimizerState, ...] = ()
    cudnn_benchmark: bool | None = None  # torch.backends.cudnn.benchmark
    cudnn_allow_tf32: bool | None = None  # torch.backends.cudnn.allow_tf32
    matmul_allow_tf32: bool | None = None  # torch.backends.cuda.matmul.allow_tf32
    float32_matmul_precision: str | None = None  # torch.get_float32_matmul_precision()
    # torch >= 2.9's API: "ieee", "tf32" ("bf16" on CPU backends) or "none" (inherit, which
    # leaves it to the legacy flags above). Once a cell set it, the legacy getters raise.
    matmul_fp32_precision: str | None = None  # torch.backends.cuda.matmul.fp32_precision
    conv_fp32_precision: str | None = None  # torch.backends.cudnn.conv.fp32_precision
    autocast_enabled: bool | None = None  # the cell ran (some of) its work under autocast
    notes: tuple[str, ...] = field(default=())
    # multi-GPU (issue 11): nn.DataParallel wrappers and DDP models in the namespace, and
    # the default process group's backend when torch.distributed is initialised
    data_parallel: tuple[str, ...] = ()
    ddp: tuple[DdpState, ...] = ()
    distributed_backend: str | None = None

    @property
    def num_workers(self) -> int | None:
        """The smallest ``num_workers`` among the loaders found (the likely bottleneck)."""
        return min((d.num_workers for d in self.loaders), default=None)

    @property
    def pin_memory(self) -> bool | None:
        if not self.loaders:
            return None
        return all(d.pin_memory for d in self.loaders)

    @property
    def new_precision_api(self) -> bool:
        """The session set TF32 with ``fp32_precision`` (so advice must not use the legacy flags,
        which PyTorch refuses to mix with it)."""
        return any(
            v not in (None, "none") for v in (self.matmul_fp32_precision, self.conv_fp32_precision)
        )

    @property
    def tf32_matmul(self) -> bool | None:
        """Whether fp32 matmuls may use TF32 tensor cores (the new API's value when it is set)."""
        if self.matmul_fp32_precision not in (None, "none"):
            return self.matmul_fp32_precision == "tf32"
        if self.matmul_allow_tf32 is not None:
            return self.matmul_allow_tf32
        if self.float32_matmul_precision is not None:
            return self.float32_matmul_precision != "highest"
        return None
