"""Who holds memory: tensors named the way the user's namespace names them.

A parameter is ``model.fc.weight``, its gradient ``model.fc.weight.grad``, Adam's moment
``optimizer.state[model.fc.weight]['exp_avg']``; a list element ``batch[0]``. Tensors
are counted by storage (views share one), first under their most meaningful name:
modules, then optimizers, then everything else. Which tensors count is the caller's
``keep`` predicate: the traced device's (:func:`gpumagic.memory.trace.device.tensor_filter`).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# Containers are looked into one level deep and only when small: a list of a million
# floats is not worth walking on every probe, and an OOM report needs the big holders.
_CONTAINER_MAX = 64


@dataclass(frozen=True)
class Holder:
    name: str
    role: str  # "parameter", "gradient", "optimizer state", "buffer", "tensor"
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    device: str
    storage: int = 0  # the storage's data pointer: one holder per storage


def _storage_key(t: Any) -> tuple[int, int]:
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except Exception:  # sparse / meta / tensor subclasses without storage
        return id(t), 0


def is_a(value: Any, kinds: type | tuple[type, ...]) -> bool:
    """``isinstance(value, kinds)`` for any object a namespace may hold: an object whose
    ``__class__`` lookup raises (a lazy settings proxy, which isinstance consults after the
    real type) is what its real type says; no user object may break the measurement."""
    try:
        return isinstance(value, kinds)
    except Exception:
        return issubclass(type(value), kinds)


def _skip(name: str, value: Any) -> bool:
    return (
        name.startswith("_")
        or name in ("In", "Out", "exit", "quit", "get_ipython")
        or is_a(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType))
    )


def named_tensors(namespace: Mapping[str, Any], keep: Callable[[Any], bool]) -> Iterator[Holder]:
    """Every tensor reachable by name from ``namespace`` on the kept device, once per storage."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    Tensor, Module = torch.Tensor, torch.nn.Module
    Optimizer = torch.optim.Optimizer
    seen: set[int] = set()
    items = [(k, v) for k, v in list(namespace.items()) if not _skip(k, v)]

    def emit(name: str, role: str, t: Any) -> Holder | None:
        if not is_a(t, Tensor) or not keep(t):
            return None
        ptr, nbytes = _storage_key(t)
        if ptr in seen or nbytes == 0:
            return None
        seen.add(ptr)
        dtype = str(t.dtype).replace("torch.", "")
        return Holder(name, role, nbytes, tuple(t.shape), dtype, str(t.device), ptr)

    param_names: dict[int, str] = {}
    for name, value in items:
        if is_a(value, Module):
            for pname, p in value.named_parameters():
                param_names.setdefault(id(p), f"{name}.{pname}")
                if (h := emit(f"{name}.{pname}", "parameter", p)) is not None:
                    yield h
                if (
                    p.grad is not None
                    and (h := emit(f"{name}.{pname}.grad", "gradient", p.grad)) is not None
                ):
                    yield h
            for bname, b in value.named_buffers():
                if (h := emit(f"{name}.{bname}", "buffer", b)) is not None:
                    yield h
    for name, value in items:
        if is_a(value, Optimizer):
            k = 0
            for group in value.param_groups:
                for p in group["params"]:
                    pname = param_names.get(id(p), f"param{k}")
                    k += 1
                    if (
                        p.grad is not None
                        and (h := emit(f"{pname}.grad", "gradient", p.grad)) is not None
                    ):
                        yield h
                    for key, v in value.state.get(p, {}).items():
                        if (
                            h := emit(f"{name}.state[{pname}][{key!r}]", "optimizer state", v)
                        ) is not None:
                            yield h
    for name, value in items:
        if is_a(value, Tensor):
            role = "parameter" if isinstance(value, torch.nn.Parameter) else "tensor"
            if (h := emit(name, role, value)) is not None:
                yield h
            # a non-leaf tensor's .grad is only read when it retains one: reading it
            # otherwise makes torch warn, and a warning turned error would lose the report
            if (
                (value.is_leaf or value.retains_grad)
                and value.grad is not None
                and (h := emit(f"{name}.grad", "gradient", value.grad)) is not None
            ):
                yield h
        elif is_a(value, (list, tuple)) and len(value) <= _CONTAINER_MAX:
            for i, v in enumerate(value):
                if (h := emit(f"{name}[{i}]", "tensor", v)) is not None:
                    yield h
        elif is_a(value, dict) and len(value) <= _CONTAINER_MAX:
            for key, v in list(value.items()):
                if (h := emit(f"{name}[{key!r}]", "tensor", v)) is not None:
                    yield h


def frame_tensors(
    error: BaseException, cell_filename: str, keep: Callable[[Any], bool], seen: set[int]
) -> list[Holder]:
    """Tensors held by the locals of the functions the failing cell called, named
    ``Linear.forward(): input``: the activations in flight when memory ran out."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    out: list[Holder] = []
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != cell_filename:
        tb = tb.tb_next
    if tb is not None:
        tb = tb.tb_next  # the cell's own frame: its locals are the namespace, named already
    while tb is not None:
        code = tb.tb_frame.f_code
        where = getattr(code, "co_qualname", code.co_name)
        for name, value in list(tb.tb_frame.f_locals.items()):
            values = (
                value
                if is_a(value, (list, tuple)) and len(value) <= _CONTAINER_MAX
                else (value,)
            )
            for k, v in enumerate(values):
                if not is_a(v, torch.Tensor) or not keep(v):
                    continue
                ptr, nbytes = _storage_key(v)
                if ptr in seen or nbytes == 0:
                    continue
                seen.add(ptr)
                label = f"{where}(): {name}" + (f"[{k}]" if values is value else "")
                dtype = str(v.dtype).replace("torch.", "")
                out.append(
                    Holder(
                        label,
                        "in the failing call",
                        nbytes,
                        tuple(v.shape),
                        dtype,
                        str(v.device),
                        ptr,
                    )
                )
        tb = tb.tb_next
    return out


def unnamed_tensor_bytes(named: set[int], keep: Callable[[Any], bool]) -> tuple[int, int]:
    """(bytes, count) of live tensors on the kept device that no name reaches (via ``gc``).

    Slow on large heaps (it visits every tracked object), so only the OOM report calls it.
    """
    import gc
    import warnings

    torch = sys.modules.get("torch")
    if torch is None:
        return 0, 0
    total = count = 0
    seen = set(named)
    with warnings.catch_warnings():
        # isinstance() on some lazy module attributes emits deprecation warnings
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if _is_tensor(obj, torch.Tensor) and keep(obj)]
    for obj in tensors:
        ptr, nbytes = _storage_key(obj)
        if ptr in seen:
            continue
        seen.add(ptr)
        total += nbytes
        count += 1
    return total, count


def _is_tensor(obj: Any, tensor_type: type) -> bool:
    try:
        return isinstance(obj, tensor_type)
    except Exception:  # objects whose __class__ lookup raises (lazy proxies)
        return False


class ModelMemory:
    """Bytes of parameters, gradients and optimizer state reachable from a namespace."""

    def __init__(self, namespace: Mapping[str, Any], keep: Callable[[Any], bool]) -> None:
        self._ns = namespace
        self._keep = keep
        torch = sys.modules["torch"]
        self._module_t = torch.nn.Module
        self._optim_t = torch.optim.Optimizer

    @staticmethod
    def present(namespace: Mapping[str, Any]) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        kinds = (torch.nn.Module, torch.optim.Optimizer)
        return any(is_a(v, kinds) for k, v in list(namespace.items()) if not k.startswith("_"))

    def measure(self) -> tuple[int, int, int] | None:
        """(parameters, gradients, optimizer state) bytes; None when no model is in sight.

        Runs on the probe path, so it sizes tensors by ``data_ptr``/``nbytes`` (a fraction
        of a microsecond) rather than by storage objects; parameters, gradients and
        optimizer state are whole tensors, so the two agree."""
        kinds = (self._module_t, self._optim_t)
        values = [v for k, v in list(self._ns.items()) if not k.startswith("_") and is_a(v, kinds)]
        if not values:
            return None
        keep = self._keep
        seen: set[int] = set()
        params = grads = state = 0

        def size(t: Any) -> int:
            if t is None or not keep(t):
                return 0
            ptr = t.data_ptr()
            if ptr in seen:
                return 0
            seen.add(ptr)
            return int(t.nbytes)

        for v in values:
            if is_a(v, self._module_t):
                for p in v.parameters():
                    params += size(p)
                    grads += size(p.grad)
        for v in values:
            if is_a(v, self._optim_t):
                for group in v.param_groups:
                    for p in group["params"]:
                        params += size(p)
                        grads += size(p.grad)
                for st in v.state.values():
                    for t in st.values():
                        if hasattr(t, "data_ptr"):
                            state += size(t)
        return params, grads, state
