"""torch's process-wide switches, and the random generators, as a dry run found them: read
before it, put back after it, whatever ends it (the cell's error, the time limit, Ctrl-C).

A dry run runs the cell's Python, so ``torch.set_default_device('meta')`` in the cell would
otherwise make every later real cell build meta tensors (issue 25, item 3). Each switch is
a row of :data:`SWITCHES`: a name, how to read it, how to set it. Only a switch whose value
changed is set back, so a session's own unusual state (a switch torch refuses to read, see
below) is left exactly as it was.

torch 2.13 keeps TF32 in two layers: the legacy switches (``set_float32_matmul_precision``,
``torch.backends.cudnn.allow_tf32``) and the per-backend ``fp32_precision`` settings they
write. Reading a legacy switch after the new ones were set raises ("mix of the legacy and new
APIs"), and setting the legacy ones back leaves the new ones at values they did not have
(``'ieee'`` for ``'none'``). So the row ``tf32 and matmul precision`` sets the legacy
switches first, then every ``fp32_precision`` as it was: the state read afterwards is the
state read before, which setting either layer alone does not give.

``set_num_interop_threads`` is not a row: torch refuses it once any parallel work ran, so a
cell cannot have changed it. Inference mode is a guard object, not a switch: the one a cell
entered is let go with the cell's namespace, and the row checks it is off again.
"""

from __future__ import annotations

import contextlib
import gc
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SWITCHES", "Switch", "kept_switches", "leave_inference_mode", "restore", "snapshot"]

_UNREADABLE = object()  # torch refused to read the switch: it is left as it is


@dataclass(frozen=True)
class Switch:
    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]


def _backends() -> Any:
    return torch.backends


# -- the default device: the DeviceContext torch keeps per thread, compared by identity -----------
def _device_context() -> Any:
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)


class _Same:
    """A value compared by identity (a context object: equal is not enough)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _read_device() -> _Same:
    return _Same(_device_context())


def _write_device(saved: _Same) -> None:
    ctx = saved.value
    # torch.set_default_device leaves the current context and enters a new one: entering the
    # saved object again puts the same device at the bottom of the function-mode stack.
    current = _device_context()
    if current is not None:
        current.__exit__(None, None, None)
    if ctx is not None:
        ctx.__enter__()
    torch._GLOBAL_DEVICE_CONTEXT.device_context = ctx


# -- TF32 / matmul precision: the legacy layer, then the per-backend settings ------------------
def _precision_holders() -> list[Any]:
    b = _backends()
    holders = [b, b.cuda.matmul, b.cudnn, b.cudnn.conv, b.cudnn.rnn, b.mkldnn, b.mkldnn.matmul, b.mkldnn.conv, b.mkldnn.rnn]
    return [h for h in holders if hasattr(h, "fp32_precision")]


def _try(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except RuntimeError:  # "mix of the legacy and new APIs": the legacy view cannot be read
        return _UNREADABLE


def _read_precision() -> tuple[Any, ...]:
    b = _backends()
    return (
        _try(torch.get_float32_matmul_precision),
        _try(lambda: bool(b.cudnn.allow_tf32)),
        tuple(h.fp32_precision for h in _precision_holders()),
    )


def _write_precision(saved: tuple[Any, ...]) -> None:
    legacy_matmul, legacy_cudnn, precisions = saved
    if legacy_matmul is not _UNREADABLE:
        torch.set_float32_matmul_precision(legacy_matmul)
    if legacy_cudnn is not _UNREADABLE:
        _backends().cudnn.allow_tf32 = legacy_cudnn
    for holder, value in zip(_precision_holders(), precisions, strict=True):
        holder.fp32_precision = value


# -- the rest: plain getters and setters -------------------------------------------------------
def _read_cudnn() -> tuple[bool, bool, bool]:
    c = _backends().cudnn
    return bool(c.enabled), bool(c.benchmark), bool(c.deterministic)


def _write_cudnn(saved: tuple[bool, bool, bool]) -> None:
    c = _backends().cudnn
    c.enabled, c.benchmark, c.deterministic = saved


def _read_reductions() -> tuple[bool, bool]:
    m = _backends().cuda.matmul
    return bool(m.allow_fp16_reduced_precision_reduction), bool(m.allow_bf16_reduced_precision_reduction)


def _write_reductions(saved: tuple[bool, bool]) -> None:
    m = _backends().cuda.matmul
    m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved


_SDP = ("flash", "mem_efficient", "math", "cudnn")


def _read_sdp() -> tuple[bool, ...]:
    cuda = _backends().cuda
    return tuple(bool(getattr(cuda, f"{k}_sdp_enabled")()) for k in _SDP)


def _write_sdp(saved: tuple[bool, ...]) -> None:
    cuda = _backends().cuda
    for kind, on in zip(_SDP, saved, strict=True):
        getattr(cuda, f"enable_{kind}_sdp")(on)


def _read_deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _write_deterministic(saved: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


def _read_anomaly() -> tuple[bool, bool]:
    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


def _write_anomaly(saved: tuple[bool, bool]) -> None:
    torch.set_anomaly_enabled(saved[0], saved[1])


def _write_inference(saved: bool) -> None:
    # The guard a cell entered lives as long as its context object: the cell's namespace is
    # gone by now, so a collection lets go of one held in a cycle.
    gc.collect()
    if torch.is_inference_mode_enabled() != saved:
        raise RuntimeError("inference mode stayed on after the dry run (a guard the cell entered is still held)")


def leave_inference_mode(namespace: dict[str, Any], was_on: bool) -> None:
    """Leave the ``torch.inference_mode()`` a cell entered and never left, while the dry
    run's modes are still on. Its guard puts back, when it goes, the dispatch state it was
    entered in: let go after the fake-tensor mode ended, it turned the Python dispatch key
    back on with no mode to answer it, and every later ``torch.ones`` of the session failed
    (``INTERNAL ASSERT FAILED ... Hit Python dispatch key``). A guard kept somewhere the
    namespace does not show is a RuntimeError naming the cause."""
    if was_on or not torch.is_inference_mode_enabled():
        return
    contexts = (torch.autograd.grad_mode.inference_mode, torch._C._InferenceMode)
    for value in reversed(list(namespace.values())):  # the last entered first
        if isinstance(value, contexts):
            with contextlib.suppress(Exception):  # one never entered has nothing to leave
                value.__exit__(None, None, None)
        if not torch.is_inference_mode_enabled():
            return
    gc.collect()
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "the cell entered torch.inference_mode() without leaving it, and holds it where the "
            "dry run cannot reach: use `with torch.inference_mode():`"
        )


def _read_cuda_rng() -> Any:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return _Tensors(torch.cuda.get_rng_state_all())
    return None


def _write_cuda_rng(saved: Any) -> None:
    if saved is not None:
        torch.cuda.set_rng_state_all(saved.value)


class _Tensors:
    """RNG states (byte tensors) compared by their bytes."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Tensors):
            return False
        a = self.value if isinstance(self.value, list) else [self.value]
        b = other.value if isinstance(other.value, list) else [other.value]
        return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    __hash__ = None  # type: ignore[assignment]


def _read_numpy_rng() -> Any:
    np_random = sys.modules.get("numpy.random")
    return np_random.get_state(legacy=False) if np_random is not None else None


def _write_numpy_rng(saved: Any) -> None:
    np_random = sys.modules.get("numpy.random")
    if saved is not None and np_random is not None:
        np_random.set_state(saved)


def _numpy_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    import numpy as np

    return bool(a["state"]["pos"] == b["state"]["pos"] and np.array_equal(a["state"]["key"], b["state"]["key"])
                and a["has_gauss"] == b["has_gauss"] and a["gauss"] == b["gauss"])


SWITCHES: tuple[Switch, ...] = (
    Switch("default device", _read_device, _write_device),
    Switch("default dtype", torch.get_default_dtype, torch.set_default_dtype),
    Switch("grad mode", torch.is_grad_enabled, torch._C._set_grad_enabled),
    Switch("inference mode", torch.is_inference_mode_enabled, _write_inference),
    Switch("anomaly detection", _read_anomaly, _write_anomaly),
    Switch("deterministic algorithms", _read_deterministic, _write_deterministic),
    Switch("tf32 and matmul precision", _read_precision, _write_precision),
    Switch("fp16/bf16 reduced-precision reductions", _read_reductions, _write_reductions),
    Switch("cuDNN enabled, benchmark, deterministic", _read_cudnn, _write_cudnn),
    Switch("scaled-dot-product attention kernels", _read_sdp, _write_sdp),
    Switch("intra-op threads", torch.get_num_threads, torch.set_num_threads),
    Switch("torch's CPU random generator", lambda: _Tensors(torch.get_rng_state()), lambda s: torch.set_rng_state(s.value)),
    Switch("CUDA's random generators", _read_cuda_rng, _write_cuda_rng),
    Switch("random's generator", random.getstate, random.setstate),
    Switch("numpy's global generator", _read_numpy_rng, _write_numpy_rng),
)


def snapshot() -> dict[str, Any]:
    """Every switch's value now, by name."""
    return {s.name: s.read() for s in SWITCHES}


def _changed(name: str, before: Any, now: Any) -> bool:
    if name == "numpy's global generator":
        return not _numpy_equal(before, now)
    return bool(before != now)


def restore(saved: dict[str, Any]) -> list[str]:
    """Set back every switch that changed since ``saved``; the names of those set back. Each
    is set back even if another fails; the first failure is raised after."""
    changed: list[str] = []
    failure: BaseException | None = None
    for switch in SWITCHES:
        try:
            if _changed(switch.name, saved[switch.name], switch.read()):
                switch.write(saved[switch.name])
                changed.append(switch.name)
        except Exception as exc:  # one switch that fails leaves the others to be set back
            failure = failure or exc
    if failure is not None:
        raise failure
    return changed


@contextlib.contextmanager
def kept_switches(changed: list[str] | None = None) -> Iterator[None]:
    """Puts every switch of :data:`SWITCHES` back as it was when the block ends, however it
    ends; ``changed`` gets the names of those the block had changed."""
    saved = snapshot()
    try:
        yield
    finally:
        names = restore(saved)
        if changed is not None:
            changed.extend(names)
