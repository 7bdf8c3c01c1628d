"""What a tensor holds that a census counts: the one definition that the start-up scan, the
statement boundaries and the per-op path share (issue 25 items 7 and 8).

A census counts one kind of tensor (``counted``): real ones for ``%%memtrace``,
``FakeTensorMode``'s for a dry run. What a tensor of any kind holds, in storages:

* a tensor of the counted kind with a storage (strided, quantized, a nested tensor's buffer):
  that storage; a nested tensor also keeps its sizes, strides and offsets in three small
  tensors, a per-channel quantized tensor its scales and zero points: theirs too;
* a sparse tensor: COO's indices and values; CSR, CSC, BSR and BSC's compressed indices,
  plain indices and values (``untyped_storage()`` raises on the tensor itself);
* a tensor that functorch wraps (one leaked out of ``torch.func.grad`` or ``vmap``): the
  tensor it wraps;
* a wrapper subclass of torch's own (``DTensor``, the jagged nested tensor): the tensors its
  ``__tensor_flatten__`` names, each judged by these rules (a ``DTensor`` whose local shard
  is fake holds a fake tensor);
* a fake tensor in a real census, a real tensor in a dry run, and a subclass of the other
  kind: nothing of this census's (a ``FakeTensor`` of a billion floats holds no memory;
  before this module the start-up scan counted its 4 GB, the per-op path nothing);
* anything else cannot be counted, and says why: an mkldnn tensor (torch keeps its memory
  opaque), a subclass with a ``__torch_dispatch__`` of its own that is not torch's (its
  ``__tensor_flatten__`` would be the user's code), a storage that cannot be read.

Nothing of the user's runs: a subclass's attributes and storage are read through torch's own
C methods with ``__torch_function__`` off (a subclass may override ``untyped_storage``, or
make every property raise), and the ops that read a sparse tensor's parts run with Python
dispatch off, so no mode (the census's own included) sees them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Final

import torch

__all__ = ["NOTHING", "PLAIN", "UNCOUNTABLE", "UNWRAP", "grad_fn_of", "grad_of", "kind_of", "storages"]

PLAIN: Final = 0  # the counted kind: its storage (and its parts, by layout)
NOTHING: Final = 1  # holds none of this census's memory
UNWRAP: Final = 2  # torch's wrapper subclass: its inner tensors
UNCOUNTABLE: Final = 3  # a subclass of the user's own with its own dispatch

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_TensorBase = torch._C.TensorBase
_no_torch_function = torch._C.DisableTorchFunctionSubclass
_no_python_dispatch = torch._C._DisableTorchDispatch
_functorch = torch._C._functorch
_disabled_dispatch = torch._C._disabled_torch_dispatch_impl
_TYPE_MRO: Any = vars(type)["__mro__"]
_TYPE_DICT: Any = vars(type)["__dict__"]
_SPARSE_COMPRESSED = {
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}
_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_affine_float_qparams)
_UNWRAP_DEPTH = 8  # wrappers of wrappers (a DTensor of a functorch wrapper ...)

_kinds: dict[tuple[type, type], int] = {}


def kind_of(cls: type, counted: type) -> int:
    """How a census that counts ``counted`` reads a tensor of type ``cls`` (memoised).

    Read from the classes' own dictionaries: a metaclass's code does not run."""
    found = _kinds.get((cls, counted))
    if found is None:
        found = _kinds[(cls, counted)] = _judge(cls, counted)
    return found


def _judge(cls: type, counted: type) -> int:
    dispatch = _own(cls, "__torch_dispatch__")
    own_dispatch = dispatch is not None and dispatch is not _disabled_dispatch
    if counted is not _Tensor:  # a dry run: its fake tensors, and torch's wrappers of them
        if issubclass(cls, counted):
            return PLAIN
        return UNWRAP if own_dispatch and _is_torch_own(cls, "__tensor_flatten__") else NOTHING
    fake = _fake_tensor_type()
    if fake is not None and issubclass(cls, fake):
        return NOTHING  # a real census meets a fake tensor: it holds no memory
    if not own_dispatch:
        return PLAIN  # torch.Tensor, Parameter, a subclass that only adds methods
    if _is_torch_own(cls, "__tensor_flatten__"):
        return UNWRAP
    return UNCOUNTABLE


def _own(cls: type, name: str) -> Any:
    """``name`` as the first class of ``cls``'s MRO that defines it has it (no descriptor
    or metaclass runs); None when none does."""
    for klass in _TYPE_MRO.__get__(cls):
        own = _TYPE_DICT.__get__(klass)
        if name in own:
            return own[name]
    return None


def _is_torch_own(cls: type, name: str) -> bool:
    """Whether ``cls`` is torch's own and defines ``name`` (a wrapper subclass whose
    ``__tensor_flatten__`` is torch's code, not the user's)."""
    module = _TYPE_DICT.__get__(cls).get("__module__")
    return type(module) is str and module.split(".")[0] == "torch" and _own(cls, name) is not None


def _fake_tensor_type() -> type | None:
    module = sys.modules.get("torch._subclasses.fake_tensor")
    found = getattr(module, "FakeTensor", None) if module is not None else None
    return found if isinstance(found, type) else None


def storages(t: Any, counted: type, keep: Callable[[Any], bool]) -> tuple[list[Any], str]:
    """(the storages ``t`` holds on the kept device that a census counting ``counted``
    counts, why the rest of what it holds cannot be counted: "" when nothing is left out).

    ``keep``: the census's device predicate, asked of each tensor that holds storage (a
    wrapper's inner tensors, not the wrapper)."""
    found: list[Any] = []
    why = _read(t, counted, keep, found, 0)
    return found, why


def _read(t: Any, counted: type, keep: Callable[[Any], bool], found: list[Any], depth: int) -> str:
    cls = type(t)
    kind = kind_of(cls, counted)
    if kind == NOTHING:
        return ""
    if kind == UNCOUNTABLE:
        return f"a {cls.__name__}, a tensor subclass with its own dispatch"
    if kind == UNWRAP:
        return _inner(t, counted, keep, found, depth)
    with _no_torch_function():  # a subclass's overrides and properties are its own code
        if not keep(t):
            return ""
        if _functorch.is_functorch_wrapped_tensor(t):
            if depth >= _UNWRAP_DEPTH:
                return "a tensor functorch wraps too deeply"
            return _read(_functorch.get_unwrapped(t), counted, keep, found, depth + 1)
        layout = t.layout
        try:
            with _no_python_dispatch():  # reading parts runs ops: no mode sees them
                if layout is torch.strided:
                    found.append(_TensorBase.untyped_storage(t))
                    if t.is_nested:
                        found += _parts_storages(
                            t, ("_nested_tensor_size", "_nested_tensor_strides", "_nested_tensor_storage_offsets")
                        )
                    elif t.is_quantized and t.qscheme() in _PER_CHANNEL:
                        found += _parts_storages(t, ("q_per_channel_scales", "q_per_channel_zero_points"))
                    return ""
                if layout is torch.sparse_coo:
                    found += _parts_storages(t, ("_indices", "_values"))
                    return ""
                names = _SPARSE_COMPRESSED.get(layout)
                if names is not None:
                    found += _parts_storages(t, (*names, "values"))
                    return ""
        except Exception as exc:  # a storage torch will not hand out
            return f"a tensor whose storage cannot be read ({type(exc).__name__}: {str(exc)[:80]})"
        if layout is torch._mkldnn:  # type: ignore[attr-defined]
            return "an mkldnn tensor (torch keeps its memory opaque)"
        return f"a tensor of layout {str(layout).replace('torch.', '')}"


def _parts_storages(t: Any, methods: tuple[str, ...]) -> list[Any]:
    return [_TensorBase.untyped_storage(getattr(_TensorBase, m)(t)) for m in methods]


def _inner(t: Any, counted: type, keep: Callable[[Any], bool], found: list[Any], depth: int) -> str:
    """A wrapper subclass of torch's own: the tensors its ``__tensor_flatten__`` names."""
    if depth >= _UNWRAP_DEPTH:
        return f"a {type(t).__name__} wrapped too deeply"
    try:
        names, _ = t.__tensor_flatten__()
        inner = [getattr(t, name) for name in names]
    except Exception as exc:
        return f"a {type(t).__name__} whose parts cannot be read ({type(exc).__name__})"
    whys = [
        _read(x, counted, keep, found, depth + 1) for x in inner if issubclass(type(x), _Tensor)
    ]
    return "; ".join(w for w in whys if w)


def grad_of(t: Any) -> Any:
    """``t.grad`` for a leaf that requires grad (None otherwise), read with a subclass's
    ``__torch_function__`` off: its properties are its own code."""
    if type(t) is _Tensor or type(t) is _Parameter:
        return t.grad if t.is_leaf and t.requires_grad else None
    with _no_torch_function():
        if t.is_leaf and t.requires_grad:
            return t.grad
    return None


def grad_fn_of(t: Any) -> Any:
    """``t.grad_fn``, read as :func:`grad_of` reads ``.grad``."""
    if type(t) is _Tensor or type(t) is _Parameter:
        return t.grad_fn
    with _no_torch_function():
        return t.grad_fn
