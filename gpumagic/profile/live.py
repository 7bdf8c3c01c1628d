"""What the running session can tell the diagnosis that a trace cannot.

A trace shows ``_SingleProcessDataLoaderIter`` but not whether ``pin_memory`` was set;
it shows fp32 matmul kernels but not whether TF32 was allowed. When ``%%gpuprofile``
runs a cell it can look at the session (the DataLoaders and optimizers in the user's
namespace, ``torch.backends`` flags) and hand that to the rules as a :class:`LiveState`
to confirm or rule out what the trace hints. Every field is optional: ``None`` means
"not known", and a rule then decides from the trace alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

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


def capture_live_state(
    namespace: Mapping[str, Any], autocast_enabled: bool | None = None
) -> LiveState:
    """Read the facts the rules use from a user namespace and torch's global flags.

    Imports nothing: when the session has not imported torch, there is nothing to find.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return LiveState(autocast_enabled=autocast_enabled)
    loaders: list[LoaderState] = []
    optimizers: list[OptimizerState] = []
    loader_cls = getattr(getattr(getattr(torch, "utils", None), "data", None), "DataLoader", None)
    optim_cls = getattr(getattr(torch, "optim", None), "Optimizer", None)
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        if loader_cls is not None and isinstance(value, loader_cls):
            loaders.append(
                LoaderState(
                    name=name,
                    num_workers=int(getattr(value, "num_workers", 0)),
                    pin_memory=bool(getattr(value, "pin_memory", False)),
                    batch_size=getattr(value, "batch_size", None),
                )
            )
        elif optim_cls is not None and isinstance(value, optim_cls):
            defaults = getattr(value, "defaults", {}) or {}
            optimizers.append(
                OptimizerState(
                    name=name,
                    kind=type(value).__name__,
                    foreach=defaults.get("foreach"),
                    fused=defaults.get("fused"),
                )
            )
    data_parallel, ddp = _parallel_wrappers(torch, namespace)
    backends: Any = getattr(torch, "backends", None)
    return LiveState(
        loaders=tuple(loaders),
        optimizers=tuple(optimizers),
        cudnn_benchmark=_flag(lambda: backends.cudnn.benchmark, bool),
        cudnn_allow_tf32=_flag(lambda: backends.cudnn.allow_tf32, bool),
        matmul_allow_tf32=_flag(lambda: backends.cuda.matmul.allow_tf32, bool),
        float32_matmul_precision=_flag(lambda: torch.get_float32_matmul_precision(), str),
        matmul_fp32_precision=_flag(lambda: backends.cuda.matmul.fp32_precision, str),
        conv_fp32_precision=_flag(lambda: backends.cudnn.conv.fp32_precision, str),
        autocast_enabled=autocast_enabled,
        data_parallel=data_parallel,
        ddp=ddp,
        distributed_backend=_distributed_backend(torch),
    )


def _flag(read: Callable[[], Any], kind: type[_T]) -> _T | None:
    """One torch flag, or None when it cannot be read.

    Each flag is read on its own: once ``torch.backends.cuda.matmul.fp32_precision = "tf32"``
    is set (the API PyTorch recommends since 2.9), the legacy getters ``matmul.allow_tf32``
    and ``torch.get_float32_matmul_precision()`` raise RuntimeError ("mix of the legacy and
    new APIs"), and an older torch has no ``fp32_precision`` at all (AttributeError).
    """
    try:
        value = read()
    except Exception:
        return None
    return value if isinstance(value, kind) else None


def _parallel_wrappers(
    torch: Any, namespace: Mapping[str, Any]
) -> tuple[tuple[str, ...], tuple[DdpState, ...]]:
    parallel = getattr(getattr(torch, "nn", None), "parallel", None)
    dp_cls = getattr(parallel, "DataParallel", None)
    ddp_cls = getattr(parallel, "DistributedDataParallel", None)
    dp: list[str] = []
    ddp: list[DdpState] = []
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        if dp_cls is not None and isinstance(value, dp_cls):
            dp.append(name)
        elif ddp_cls is not None and isinstance(value, ddp_cls):
            cap = getattr(value, "bucket_bytes_cap", None)
            ddp.append(
                DdpState(
                    name=name,
                    bucket_cap_mb=cap / 2**20 if isinstance(cap, (int, float)) else None,
                    gradient_as_bucket_view=getattr(value, "gradient_as_bucket_view", None),
                    find_unused_parameters=getattr(value, "find_unused_parameters", None),
                    static_graph=getattr(value, "static_graph", None),
                )
            )
    return tuple(dp), tuple(ddp)


def _distributed_backend(torch: Any) -> str | None:
    dist = getattr(torch, "distributed", None)
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return str(dist.get_backend())
    except (RuntimeError, ValueError, AttributeError):
        return None
