"""CUDA on a machine without a GPU: the tensors a GPU run would hold on CUDA become fake
CPU tensors labelled "cuda", so a dry run counts them and nothing aborts.

Why not fake CUDA tensors: ``FakeTensorMode`` makes them on a CPU-only build, but autograd
on them aborts the whole process (SIGABRT in ``c10::impl::getDeviceGuardImpl``: the build
has no CUDA device guard), which would take a notebook kernel down. Fake CPU tensors run
every operation autograd needs; the allocation rounding of CUDA's caching allocator (512
bytes) is applied by the accounting.

Two layers:

* :class:`CudaRequests` (a ``TorchFunctionMode``, so it sees a call before torch's C++
  checks whether CUDA exists: ``Tensor.cuda()`` raises "not linked with support for cuda
  devices" before any dispatch): ``.cuda()``, ``.to("cuda")``, ``device="cuda"`` (or an int)
  become CPU requests whose results are labelled "cuda"; ``.cpu()`` of a "cuda" tensor is a
  copy labelled "host", as a real device-to-host copy would be.
* :class:`DeviceLabels` (a ``TorchDispatchMode``): what an operation makes from "cuda"
  inputs is "cuda"; and a CPU tensor that meets "cuda" tensors in an operation other than a
  copy or an index is relabelled "cuda" for its whole life, because on a GPU that operation
  would raise a device mismatch unless the tensor was there already
  (``torch.arange(n, device=x.device)`` in a model's forward reads the fake's CPU device).

``Module.to()`` and ``.cuda()`` on fake parameters go through ``torch.utils.swap_tensors``,
which refuses tensors with weak references, and ``FakeTensorMode``'s memo holds one on each
(pytorch#178584, #184976, #196558: "_apply(): Couldn't swap Linear.weight"). While a dry
run lasts, :func:`swap_tensors_for_fakes` drops the two tensors' memo entries first, as
those pull requests do.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpumagic.memory.census.reach import storage_of, tensors_in

CUDA, HOST = "cuda", "host"
aten = torch.ops.aten
# Operations that take CPU tensors beside CUDA ones on a GPU: copies, and indices.
_MIXING_OK = {
    aten.copy_.default,
    aten._to_copy.default,
    aten.index.Tensor,
    aten.index_put_.default,
    aten.index_put.default,
    aten._index_put_impl_.default,
    aten.lift_fresh.default,
    aten.lift_fresh_copy.default,
    aten.detach.default,
}


class DeviceLabel:
    """A storage's device as the run counts it; mutable, so a later relabel reaches the
    accounting that kept it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


class _Forget:
    """A weak reference's callback: drop the entry of a storage that died."""

    def __init__(self, table: dict[int, Any], ident: int) -> None:
        self.table, self.ident = table, ident

    def __call__(self, _ref: object) -> None:
        self.table.pop(self.ident, None)


class DeviceMap:
    """The labels of one dry run without a GPU, and the modes that keep them."""

    def __init__(self) -> None:
        self._labels: dict[int, tuple[weakref.ref[Any], DeviceLabel]] = {}
        self._forced: list[str | None] = [None]
        self.mismatches = 0  # CPU tensors relabelled "cuda" because they met CUDA ones
        self.cuda_made = False  # a tensor was labelled "cuda": the cell puts tensors there
        self._any_cuda = False  # some label says "cuda" (until then after() has nothing to do)
        # told of each tensor relabelled "cuda" (the census counts it from then on)
        self.relabelled: Callable[[torch.Tensor], None] | None = None

    # -- labels ------------------------------------------------------------------------------
    def label(self, t: torch.Tensor) -> DeviceLabel:
        st = storage_of(t)
        if st is None:
            return DeviceLabel(str(t.device.type))
        found = self._labels.get(id(st))
        if found is not None and found[0]() is st:
            return found[1]
        kind = str(t.device.type)
        label = DeviceLabel(HOST if kind == "cpu" else kind)
        self._any_cuda = self._any_cuda or kind == CUDA
        ident = id(st)
        self._labels[ident] = (weakref.ref(st, _Forget(self._labels, ident)), label)
        return label

    def is_cuda(self, t: torch.Tensor) -> bool:
        return self.label(t).name == CUDA

    @contextlib.contextmanager
    def forcing(self, name: str) -> Iterator[None]:
        self._forced.append(name)
        try:
            yield
        finally:
            self._forced.pop()

    def after(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """Label what ``func`` made; relabel CPU tensors it mixed with CUDA ones."""
        forced = self._forced[-1]
        if forced is None and not self._any_cuda:
            # No tensor is "cuda" yet, so none of the inputs is and nothing is labelled: every
            # op of a cell that picks its device at run time, and every op before a cell's
            # first .cuda(), ends here.
            return
        inputs = list(tensors_in((args, kwargs)))
        cuda_in = any(self.is_cuda(t) for t in inputs)
        if cuda_in and forced is None and func not in _MIXING_OK:
            for t in inputs:
                lab = self.label(t)
                if lab.name == HOST and t.dim() > 0:
                    lab.name = CUDA
                    self.mismatches += 1
                    if self.relabelled is not None:
                        self.relabelled(t)
        name = forced or (CUDA if cuda_in else None)
        if name is None:
            return
        if name == CUDA:
            self.cuda_made = self._any_cuda = True
        input_ids = {id(s) for s in map(storage_of, inputs) if s is not None}
        for t in tensors_in(out):
            st = storage_of(t)
            if st is not None and (id(st) not in input_ids or forced is not None):
                self.label(t).name = name


class UnmappedCuda(RuntimeError):
    """An operation made a fake CUDA tensor on a machine without a GPU: refused before
    autograd could touch it (that would abort the process)."""


_DEVICE = torch.ops.prim.device.default


def fake_device(func: Any, args: Any) -> torch.device | None:
    """The answer to ``prim.device`` of a fake tensor, without the modes below, or None.

    A fake tensor asks the dispatcher for its device (``dispatch_device``), so every
    ``.device`` read of it, autograd's own included (about two in three of the operations a
    dry run dispatches), goes down every mode to the fake mode, which returns
    ``fake_device`` outside a kernel; the dry run's modes answer the same at once."""
    if func is _DEVICE and len(args) == 1:
        t = args[0]
        if isinstance(t, FakeTensor) and not t.fake_mode.in_kernel_invocation:
            return t.fake_device
    return None


class NoDynamoWrapper(TorchDispatchMode):
    """A dry run's dispatch mode whose handler torch does not wrap in ``torch._dynamo.disable``
    (two Python frames a mode and an operation); :func:`dynamo_runs_as_is` marks the handler
    for Dynamo to skip instead, as the census does (:mod:`gpumagic.memory.census.dispatch`)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


def dynamo_runs_as_is(*modes: type[TorchDispatchMode]) -> None:
    try:
        from torch._C._dynamo import eval_frame

        strategy = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT)
        for mode in modes:
            eval_frame.set_code_exec_strategy(mode.__torch_dispatch__.__code__, strategy)
    except Exception:  # an older torch without this API: Dynamo skips modes there anyway
        pass


class DeviceLabels(NoDynamoWrapper):
    """Labels what each operation makes (see :class:`DeviceMap`), and refuses a fake CUDA
    tensor some path made without going through :class:`CudaRequests`."""

    def __init__(self, devices: DeviceMap) -> None:
        super().__init__()
        self.devices = devices

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        device = fake_device(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for t in tensors_in(out):
            if (t.fake_device if isinstance(t, FakeTensor) else t.device).type == "cuda":
                raise UnmappedCuda(
                    f"{func.overloadpacket.__name__} made a CUDA tensor the dry run could not "
                    "map to the CPU; with no GPU here, autograd on it would abort the process, "
                    "so the dry run stops (give the device with device='cuda' or .to('cuda'))"
                )
        self.devices.after(func, args, kwargs, out)
        return out


dynamo_runs_as_is(DeviceLabels)


def _is_cuda_device(d: Any) -> bool:
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        return True  # torch reads a bare int as a CUDA device index
    if isinstance(d, str):
        return d.split(":")[0] == "cuda"
    return isinstance(d, torch.device) and d.type == "cuda"


def _is_device(d: Any) -> bool:
    return isinstance(d, (str, torch.device)) or (isinstance(d, int) and not isinstance(d, bool))


class CudaRequests(TorchFunctionMode):
    """CUDA requests become CPU ones labelled "cuda" (see the module docstring)."""

    def __init__(self, devices: DeviceMap) -> None:
        super().__init__()
        self.devices = devices

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return self._move(args[0], CUDA, None, kwargs)
        if func is torch.Tensor.cpu:
            return self._move(args[0], HOST, None, kwargs)
        if func is torch.Tensor.to:
            return self._to(args, kwargs, func)
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            with self.devices.forcing(CUDA):
                return func(*args, **{**kwargs, "device": "cpu"})
        if any(_is_device(a) and _is_cuda_device(a) for a in args if not isinstance(a, int)):
            new = tuple("cpu" if _is_device(a) and _is_cuda_device(a) else a for a in args)
            with self.devices.forcing(CUDA):
                return func(*new, **kwargs)
        return func(*args, **kwargs)

    def _move(self, t: torch.Tensor, where: str, dtype: Any, kwargs: dict[str, Any]) -> Any:
        """``t`` on ``where`` ("cuda" or "host"): ``t`` itself when it is there already and
        nothing else changes, as torch does; else a copy, labelled ``where``."""
        opts = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format", "copy")}
        there = (self.devices.label(t).name == CUDA) == (where == CUDA)
        if there and dtype is None and not opts.get("copy"):
            return t
        if there:  # a new dtype or an asked-for copy on the same device: labelled as its input
            return t.to("cpu", dtype, **opts)
        opts["copy"] = True
        with self.devices.forcing(where):
            return t.to("cpu", dtype, **opts)

    def _to(self, args: tuple[Any, ...], kwargs: dict[str, Any], func: Callable[..., Any]) -> Any:
        t, rest = args[0], list(args[1:])
        device = kwargs.get("device")
        dtype = kwargs.get("dtype")
        for a in list(rest):
            if isinstance(a, torch.dtype):
                dtype = a
                rest.remove(a)
            elif isinstance(a, torch.Tensor):
                device = CUDA if self.devices.is_cuda(a) else "cpu"
                dtype = a.dtype
                rest.remove(a)
            elif _is_device(a) and device is None:
                device = a
                rest.remove(a)
            elif a is None:  # Module._apply's to(device, dtype, non_blocking): a slot left empty
                rest.remove(a)
        opts = {k: v for k, v in kwargs.items() if k not in ("device", "dtype")}
        if len(rest) >= 1:
            opts.setdefault("non_blocking", rest[0])
        if len(rest) >= 2:
            opts.setdefault("copy", rest[1])
        if device is None:
            return func(t, dtype, **opts) if dtype is not None else func(t, **opts)
        return self._move(t, CUDA if _is_cuda_device(device) else HOST, dtype, opts)


@contextlib.contextmanager
def swap_tensors_for_fakes(fake_mode: Any) -> Iterator[None]:
    """``torch.utils.swap_tensors`` that first drops the fake mode's weak memo entries for
    the two tensors (see the module docstring), for the duration of the block."""
    import torch.utils as tutils

    original = tutils.swap_tensors
    memo = fake_mode.fake_tensor_converter.tensor_memo

    def swap(t1: Any, t2: Any) -> None:
        for key, value in list(memo.items()):
            if value is t1 or value is t2:
                del memo[key]
        original(t1, t2)

    tutils.swap_tensors = swap
    try:
        yield
    finally:
        tutils.swap_tensors = original


def given_to_cuda(namespace: dict[str, Any], devices: DeviceMap) -> tuple[int, int]:
    """Label "cuda", from the start, the tensors of the modules and optimizers a cell that
    uses CUDA takes from its namespace: parameters, buffers, gradients, optimizer state.

    Without a GPU an earlier ``model.cuda()`` could not run, so they sit on the CPU; a GPU run
    of the cell needs them on CUDA (a CPU weight meeting a CUDA batch raises), so they are
    the GPU's for the whole cell, not only from the first operation that mixes them with a
    CUDA tensor: counted that late, AdamW's state missed the peak in backward (issue 26,
    item 4). Zero-dimensional tensors stay where they are: an optimizer's step counts stay on
    the host in a GPU run. Returns how many tensors were relabelled and their bytes."""
    from torch import nn

    from gpumagic.namespace import instance_dict, is_a, user_items

    roots: list[Any] = []
    for _, value in user_items(namespace):
        if is_a(value, (nn.Module, torch.optim.Optimizer)):
            roots.append(value)
            continue
        attrs = instance_dict(value)  # a trainer holding its model and optimizer
        if attrs is not None:
            roots += [v for v in dict.values(attrs) if is_a(v, (nn.Module, torch.optim.Optimizer))]
    tensors: list[torch.Tensor] = []
    for root in roots:
        if is_a(root, nn.Module):
            for p in root.parameters():
                tensors += [p] if p.grad is None else [p, p.grad]
            tensors += list(root.buffers())
        else:
            tensors += list(tensors_in(list(root.state.values())))
    count = size = 0
    seen: set[int] = set()
    for t in tensors:
        st = storage_of(t)
        if st is None or id(st) in seen or t.dim() == 0:
            continue
        seen.add(id(st))
        label = devices.label(t)
        if label.name == HOST:
            label.name = CUDA
            count += 1
            size += st.nbytes()
    return count, size
