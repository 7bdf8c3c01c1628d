"""Reading the session facts (:class:`~gpumagic.profile.trace.session.LiveState`) off a
user namespace and torch's global flags, when ``%%gpuprofile`` runs a cell."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpumagic.namespace import is_a, user_items
from gpumagic.profile.trace.session import DdpState, LiveState, LoaderState, OptimizerState

_T = TypeVar("_T")


def capture_live_state(
    namespace: Mapping[str, Any], autocast_enabled: bool | None = None
) -> LiveState:
    """Read the facts the rules use from a user namespace and torch's global flags.

    Imports nothing: when the session has not imported torch, there is nothing to find. The
    namespace is read by :mod:`gpumagic.namespace`'s rules: the user's names only, each
    value told by its ``type()`` (a lazy proxy's ``__class__`` is never asked).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return LiveState(autocast_enabled=autocast_enabled)
    loaders: list[LoaderState] = []
    optimizers: list[OptimizerState] = []
    loader_cls = getattr(getattr(getattr(torch, "utils", None), "data", None), "DataLoader", None)
    optim_cls = getattr(getattr(torch, "optim", None), "Optimizer", None)
    for name, value in user_items(namespace):
        if loader_cls is not None and is_a(value, loader_cls):
            loaders.append(
                LoaderState(
                    name=name,
                    num_workers=int(getattr(value, "num_workers", 0)),
                    pin_memory=bool(getattr(value, "pin_memory", False)),
                    batch_size=getattr(value, "batch_size", None),
                )
            )
        elif optim_cls is not None and is_a(value, optim_cls):
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
    for name, value in user_items(namespace):
        if dp_cls is not None and is_a(value, dp_cls):
            dp.append(name)
        elif ddp_cls is not None and is_a(value, ddp_cls):
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
