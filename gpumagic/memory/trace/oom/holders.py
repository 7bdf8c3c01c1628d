"""Who holds memory: tensors named the way the user's namespace names them.

A parameter is ``model.fc.weight``, its gradient ``model.fc.weight.grad``, Adam's moment
``optimizer.state[model.fc.weight]['exp_avg']``; a list element ``batch[0]``. Tensors
are counted by storage (views share one), first under their most meaningful name:
modules, then optimizers, then everything else. Which tensors count is the caller's
``keep`` predicate: the traced device's (:func:`gpumagic.memory.trace.device.tensor_filter`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpumagic.namespace import is_a, module_tensors, small_items, user_items


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
    # imported here: the census imports torch, and the report's modules must not (importing
    # the front end loads them, in a kernel that may never import torch)
    from gpumagic.memory.census.reach import storage_of

    storage = storage_of(t)
    try:
        return storage.data_ptr(), storage.nbytes()
    except Exception:  # sparse, meta, fake: no storage, or none with an address
        return id(t), 0


def _holder(name: str, role: str, t: Any, ptr: int, nbytes: int) -> Holder:
    dtype = str(t.dtype).replace("torch.", "")
    return Holder(name, role, nbytes, tuple(t.shape), dtype, str(t.device), ptr)


def named_tensors(namespace: Mapping[str, Any], keep: Callable[[Any], bool]) -> Iterator[Holder]:
    """Every tensor reachable by name from ``namespace`` on the kept device, once per storage:
    the user's names (:func:`gpumagic.namespace.user_items`), the items of a small container,
    a model's parameters and buffers, an optimizer's state, read by the namespace's rules."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    Tensor, Module = torch.Tensor, torch.nn.Module
    Optimizer = torch.optim.Optimizer
    seen: set[int] = set()
    items = user_items(namespace)

    def emit(name: str, role: str, t: Any) -> Holder | None:
        if not is_a(t, Tensor) or not keep(t):
            return None
        ptr, nbytes = _storage_key(t)
        if ptr in seen or nbytes == 0:
            return None
        seen.add(ptr)
        return _holder(name, role, t, ptr, nbytes)

    param_names: dict[int, str] = {}
    for name, value in items:
        if is_a(value, Module):
            for pname, role, p in module_tensors(value):
                if role == "parameter":
                    param_names.setdefault(id(p), f"{name}.{pname}")
                if (h := emit(f"{name}.{pname}", role, p)) is not None:
                    yield h
                if (
                    role == "parameter"
                    and p.grad is not None
                    and (h := emit(f"{name}.{pname}.grad", "gradient", p.grad)) is not None
                ):
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
            role = "parameter" if is_a(value, torch.nn.Parameter) else "tensor"
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
        else:
            for step, v in small_items(value):
                if (h := emit(f"{name}{step}", "tensor", v)) is not None:
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
            held = [("", value)] if is_a(value, torch.Tensor) else small_items(value)
            for step, v in held:
                if not is_a(v, torch.Tensor) or not keep(v):
                    continue
                ptr, nbytes = _storage_key(v)
                if ptr in seen or nbytes == 0:
                    continue
                seen.add(ptr)
                out.append(_holder(f"{where}(): {name}{step}", "in the failing call", v, ptr, nbytes))
        tb = tb.tb_next
    return out


def unnamed_tensor_bytes(named: set[int], keep: Callable[[Any], bool]) -> tuple[int, int]:
    """(bytes, count) of live tensors on the kept device that no name reaches (via ``gc``).

    Slow on large heaps (it visits every tracked object), so only the OOM report calls it.
    Every object of the heap is told by its ``type()``: asking for its ``__class__`` (as
    ``isinstance`` does) could run a lazy module's or a proxy's code."""
    import gc

    torch = sys.modules.get("torch")
    if torch is None:
        return 0, 0
    tensor_t = torch.Tensor
    total = count = 0
    seen = set(named)
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), tensor_t) and keep(obj)]
    for obj in tensors:
        ptr, nbytes = _storage_key(obj)
        if ptr in seen:
            continue
        seen.add(ptr)
        total += nbytes
        count += 1
    return total, count
