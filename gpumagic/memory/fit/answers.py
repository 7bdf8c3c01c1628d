"""What a fake tensor cannot say, answered with a stated approximation, or refused with a
message that names the statement.

A fake tensor has shapes, dtypes and storages but no values (torch 2.13:
``FakeTensorMode`` raises ``DataDependentOutputException`` for ``.item()`` and for the truth
of a tensor, ``DynamicOutputShapeException`` for ``nonzero`` and boolean masks). A dry run
answers:

* a value (``.item()``, ``float(t)``, ``int(t)``): 1 in the tensor's kind (1.0, 1, True), so
  divisions by a step count or a loss stay defined; values the namespace held in
  one-element CPU tensors (an optimizer's step count) are kept exact;
* a truth (``if x.sum() > 0:``, ``while (x > 0).any():``): True the first
  :data:`TRUE_ANSWERS` times a statement asks, then False, so a ``while`` on a tensor ends;
* ``nonzero`` / ``argwhere`` and boolean masks (``x[mask]``, ``masked_select``): their
  upper bound, every element selected, the most memory the statement can take;
* ``.numpy()``: a read-only array of zeros that takes no memory (``numpy.broadcast_to``).

Values that follow from the cell's code alone (``torch.ones(b)``, ``torch.full((b,), done)``,
what is computed from them) are known (:mod:`.values`) and answered exactly, with no note:
a ``generate`` loop's stopping test is one.

Anything else that needs values (``torch.unique``, ``repeat_interleave`` by a tensor,
``.tolist()`` of a large tensor) stops the dry run with :class:`NeedsValues`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.overrides import TorchFunctionMode
from torch.utils._mode_utils import no_dispatch

from gpumagic.memory.fit.devices import NoDynamoWrapper, dynamo_runs_as_is, fake_device
from gpumagic.memory.fit.values import KnownValues

aten = torch.ops.aten
TRUE_ANSWERS = 3
_TOLIST_LIMIT = 100_000  # elements: a bigger placeholder list would cost real memory


class NeedsValues(RuntimeError):
    """An operation needs a tensor's values, which a dry run does not have."""

    def __init__(self, what: str, statement: int, hint: str = "") -> None:
        self.what = what
        self.statement = statement
        self.hint = hint
        super().__init__(f"{what} needs the tensor's values, which a dry run does not have" + (f"; {hint}" if hint else ""))


class Answers:
    """The answers given in one dry run, by statement, for the report."""

    def __init__(self, statement: Callable[[], int]) -> None:
        self.statement = statement
        self.given: Counter[tuple[int, str]] = Counter()  # (statement, what) -> times
        self._truths: Counter[int] = Counter()

    def note(self, what: str) -> None:
        self.given[(self.statement(), what)] += 1

    def scalar(self, t: torch.Tensor) -> Any:
        if t.dtype == torch.bool:
            at = self.statement()
            self._truths[at] += 1
            answer = self._truths[at] <= TRUE_ANSWERS
            self.note(f"truth of a tensor answered {answer}" if answer else "truth of a tensor answered False after 3 Trues")
            return answer
        if t.dtype.is_floating_point or t.dtype.is_complex:
            self.note(".item() answered 1.0")
            return 1.0
        self.note(".item() answered 1")
        return 1


def _upper_bound_indices(mask: torch.Tensor) -> list[torch.Tensor]:
    """The long indices a boolean mask selects when every element is selected."""
    n = mask.numel()
    return [torch.zeros(n, dtype=torch.long, device=mask.device) for _ in range(max(mask.dim(), 1))]


class ValueAnswers(NoDynamoWrapper):
    """Answers what the fake mode below cannot (see the module docstring)."""

    def __init__(
        self, answers: Answers, check: Callable[[], None] = lambda: None, known: KnownValues | None = None
    ) -> None:
        super().__init__()
        self.answers = answers
        self.check = check  # the time limit, checked at every operation
        self.known = known  # the values the run knows (:mod:`.values`); None: none

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        device = fake_device(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        self.check()
        try:
            out = func(*args, **kwargs)
        except DataDependentOutputException:
            if func is aten._local_scalar_dense.default:
                value = self.known.value(args[0]) if self.known is not None else None
                if value is not None:
                    with no_dispatch():  # a real tensor: read outside the modes
                        return value.item()
                return self.answers.scalar(args[0])
            raise NeedsValues(str(func.overloadpacket.__name__), self.answers.statement()) from None
        except DynamicOutputShapeException:
            return self._upper_bound(func, args, kwargs)
        if self.known is not None:
            self.known.after(func, args, kwargs, out)
        return out

    def _upper_bound(self, func: Any, args: Any, kwargs: Any) -> Any:
        name = str(func.overloadpacket.__name__)
        if func in (aten.nonzero.default, aten.argwhere.default):
            x = args[0]
            self.answers.note(f"{name} answered its upper bound ({x.numel()} elements)")
            return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
        if func is aten.masked_select.default:
            x, mask = args[0], args[1]
            n = torch.broadcast_shapes(x.shape, mask.shape).numel()
            self.answers.note(f"a boolean mask answered its upper bound ({n} elements)")
            return torch.empty(n, dtype=x.dtype, device=x.device)
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default):
            indices = list(args[1])
            new: list[Any] = []
            for ix in indices:
                if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
                    new.extend(_upper_bound_indices(ix))
                else:
                    new.append(ix)
            if len(new) != len(indices) or any(a is not b for a, b in zip(new, indices)):
                self.answers.note("a boolean mask answered its upper bound (every element selected)")
                return func(args[0], new, *args[2:], **kwargs)
        raise NeedsValues(name, self.answers.statement(), "its output's size depends on them")


dynamo_runs_as_is(ValueAnswers)


class ValueFunctions(TorchFunctionMode):
    """``.numpy()`` and ``.tolist()`` of fake tensors (see the module docstring)."""

    def __init__(self, answers: Answers, is_fake: Callable[[Any], bool], known: KnownValues | None = None) -> None:
        super().__init__()
        self.answers = answers
        self.is_fake = is_fake
        self.known = known

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in (torch.Tensor.numpy, torch.Tensor.tolist) and args and self.is_fake(args[0]):
            import numpy as np

            t = args[0]
            value = self.known.value(t) if self.known is not None else None
            if value is not None and value.dtype in _NUMPY_KINDS:  # known: the real values, a copy
                with no_dispatch():
                    return value.numpy().copy() if func is torch.Tensor.numpy else value.tolist()
            zeros = np.broadcast_to(np.zeros((), dtype=_numpy_dtype(t.dtype)), tuple(t.shape))
            if func is torch.Tensor.numpy:
                self.answers.note(".numpy() answered zeros")
                return zeros
            if t.numel() > _TOLIST_LIMIT:
                raise NeedsValues(".tolist()", self.answers.statement(), f"{t.numel()} elements")
            self.answers.note(".tolist() answered zeros")
            return zeros.tolist()
        return func(*args, **kwargs)


_NUMPY_KINDS = frozenset(
    (torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
     torch.bool, torch.complex64, torch.complex128)
)


def _numpy_dtype(dtype: torch.dtype) -> Any:
    import numpy as np

    return {
        torch.float64: np.float64,
        torch.float16: np.float16,
        torch.int64: np.int64,
        torch.int32: np.int32,
        torch.int16: np.int16,
        torch.int8: np.int8,
        torch.uint8: np.uint8,
        torch.bool: np.bool_,
        torch.complex64: np.complex64,
        torch.complex128: np.complex128,
    }.get(dtype, np.float32)  # bfloat16 and the float8 kinds have no numpy dtype
