"""The census's dispatch mode, and what keeps the cell as it would be without it.

So that the cell behaves exactly as without the magic:

* the op runs as called (``func._op``: torch's own call, without ``OpOverload.__call__``'s
  Python frame), and its exception propagates unchanged; this handler's frame is taken out
  of the traceback once the cell failed (:func:`drop_own_frames`);
* ``ignore_compile_internals``: ``torch.compile`` compiles and runs as without the mode
  (by default Dynamo skips compiling while a mode is active, which would silently run the
  cell eagerly); what a compiled region allocates inside is not seen;
* the handler is not wrapped in ``torch._dynamo.disable`` (``_should_skip_dynamo``):
  that wrapper imports ``torch._dynamo`` (1.8 s here) into every kernel at the first op and
  adds two Python frames to every op; the tracker's code objects are marked for Dynamo to
  skip instead (:func:`skip_in_dynamo`), which is what the wrapper achieves;
* a failure of the tracker's own code is recorded, stops tracking, and never reaches the
  cell;
* a mode the cell entered and left on the stack stays there (:func:`leave_mode`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from gpumagic.memory.census.wrapped import inner_tensors, is_wrapper
from gpumagic.tracebacks import exception_chain

__all__ = ["FRESH", "MUTATED", "VIEW", "StorageMode", "drop_own_frames", "leave_mode", "output_kind", "skip_in_dynamo"]

# How an op's outputs relate to its inputs, from its schema: fresh storage, a view (the same
# storage: nothing to do), or an argument whose storage may have changed size: an ``out=``
# argument, or ``resize_`` and its kin. An in-place op writes its argument's storage but
# cannot resize it, so it is a view here; most of an optimizer's ops are in place, and each
# op the tracker looks at costs microseconds. ``_unsafe_view`` returns a view without saying
# so in its schema.
FRESH, VIEW, MUTATED = 0, 1, 2
_UNANNOTATED_VIEWS = frozenset(("_unsafe_view", "_reshape_alias", "alias"))
_RESIZING = frozenset(("resize_", "resize_as_", "set_", "_resize_output_", "sparse_resize_"))
# torch.tensor() builds its data out of the modes' sight, then hands it to them through
# lift_fresh, whose schema says it returns its argument: that is the tensor's allocation.
_LIFTED = frozenset(("lift_fresh", "lift"))


def output_kind(func: Any) -> int:
    schema = func._schema
    name = schema.name.split("::")[-1]
    if name in _LIFTED:
        return FRESH
    if name in _UNANNOTATED_VIEWS:
        return VIEW
    if name in _RESIZING or any(
        a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        for a in schema.arguments
    ):
        return MUTATED
    if any(r.alias_info is not None for r in schema.returns):
        return VIEW
    return FRESH



class StorageMode(TorchDispatchMode):
    """The dispatch mode: runs each op, then tells the tracker (a
    :class:`gpumagic.memory.census.tracker.TensorTracker`) about its outputs."""

    def __init__(self, tracker: Any) -> None:
        super().__init__()
        self.tracker = tracker

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        __tracebackhide__ = True
        out = func._op(*args, **kwargs) if kwargs else func._op(*args)
        tracker = self.tracker
        if tracker.active:
            try:
                # by id: OpOverload's __hash__ is Python code, and each op is one object
                kind = tracker.kinds.get(id(func))
                if kind is None:
                    kind = tracker.kinds[id(func)] = output_kind(func)
                    tracker.ops.append(func.__name__)
                if kind != VIEW:
                    fresh = kind == FRESH
                    if type(out) is tracker.tensor_type:
                        tracker.see(out, fresh)
                    elif type(out) is tuple or type(out) is list:
                        for item in out:
                            if type(item) is tracker.tensor_type:
                                tracker.see(item, fresh)
                            elif is_wrapper(item):
                                _see_inside(tracker, item, fresh)
                    elif is_wrapper(out):
                        _see_inside(tracker, out, fresh)
            except Exception as exc:  # the tracker's own failure never reaches the cell
                tracker.fail(exc)
        return out


def _see_inside(tracker: Any, out: Any, fresh: bool) -> None:
    """A wrapper subclass's result (a DTensor): its inner operations ran with this mode off,
    so its local tensors are seen here (:mod:`gpumagic.memory.census.wrapped`)."""
    for inner in inner_tensors(out):
        if type(inner) is tracker.tensor_type:
            tracker.see(inner, fresh)


def drop_own_frames(error: BaseException) -> None:
    """Take the census's dispatch frame out of ``error``'s traceback (and its context's).

    An op that raises under the census raises out of ``__torch_dispatch__``, so that frame is
    the innermost of the traceback, and IPython shows the innermost frame even when it asks
    to be hidden (``__tracebackhide__``). Without the census the innermost frame is the
    cell's own line (the op is C++), and so it is again once the frame is unlinked."""
    code = StorageMode.__torch_dispatch__.__code__
    for exc in exception_chain(error):
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code is code:
            tb = tb.tb_next
        if tb is not exc.__traceback__:
            exc.__traceback__ = tb
        while tb is not None:
            nxt = tb.tb_next
            while nxt is not None and nxt.tb_frame.f_code is code:
                nxt = nxt.tb_next
            tb.tb_next = nxt
            tb = nxt


def leave_mode(mode: TorchDispatchMode) -> None:
    """Take ``mode`` off the dispatch mode stack, wherever the cell left it: a cell that
    entered a mode of its own without leaving it keeps that mode."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    stack = _get_current_dispatch_mode_stack()
    if stack and stack[-1] is mode:
        mode.__exit__(None, None, None)
        return
    if not any(m is mode for m in stack):
        return
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_mode(m)


_skipped = False


def skip_in_dynamo(functions: Iterable[Any]) -> None:
    """Mark ``functions`` (and the mode's handler) for Dynamo to run as they are, never trace
    them: its frame callback may meet them while a compiled region runs. Once per process."""
    global _skipped
    if _skipped:
        return
    try:
        from torch._C._dynamo import eval_frame

        strategy = eval_frame._FrameExecStrategy(
            eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT
        )
        codes = [
            fn.__code__
            for fn in (StorageMode.__torch_dispatch__, *functions)
            if hasattr(fn, "__code__")
        ]
        for code in codes:
            eval_frame.set_code_exec_strategy(code, strategy)
    except Exception:  # an older torch without this API: Dynamo skips modes there anyway
        pass
    _skipped = True
