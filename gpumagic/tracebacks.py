"""The traceback of a measured cell's error, as a plain cell's would read.

A measured cell runs with probe calls between its statements and around its loops
(:mod:`gpumagic.cell`), so an exception that surfaces inside one of them carries the probe's
frames: Ctrl-C during ``while True: pass`` lands in the memory tracer's reading of
``/proc/self/status``; ``for k in d: d[k + 1] = 1`` fails inside the runner's loop hook, its
``next()``. IPython hides frames whose locals hold ``__tracebackhide__``, but only in its
Context and Verbose modes, and never the innermost frame (``ultratb.VerboseTB``,
``i != lastrecord``), which is exactly where these land; setting the local on the probe's
path would also cost every statement boundary a store. So the traceback itself is edited
before the error is raised again: the runner's frames above the cell go, and so does every
frame from a probe hook down to where the hook calls back into other code (a user's
generator under the loop hook stays). What is left is what a plain cell shows, in every
``%xmode``.

No IPython here: the cell runner and cores use it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from types import CodeType, TracebackType
from typing import Any, TypeVar

__all__ = ["as_the_cells", "exception_chain", "hidden_hook"]

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_HOOKS: set[CodeType] = set()


def hidden_hook(function: F) -> F:
    """Mark ``function`` as a hook gpumagic puts into the user's code (a probe's ``enter``,
    the loop hook, a module hook): its frame, and the gpumagic frames it calls, are left out
    of the tracebacks of the cells it runs in. Costs nothing at call time."""
    code = getattr(function, "__code__", None)
    if isinstance(code, CodeType):
        _HOOKS.add(code)
    return function


def _ours(code: CodeType) -> bool:
    return code.co_filename.startswith(_PACKAGE)


def as_the_cells(error: BaseException, cell_filename: str) -> BaseException:
    """``error`` with its traceback cut to the cell's own frames and what they called (see
    the module docstring); returns ``error``.

    An error that never reached the cell's code (a Ctrl-C held while the run started and
    delivered as the cell was about to begin) keeps no frame of the runner's: a plain cell
    interrupted before its first line shows none either. Any other error raised outside the
    cell (a failure of gpumagic's own) keeps its traceback, for the bug report.
    """
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != cell_filename:
        tb = tb.tb_next
    if tb is None:
        if isinstance(error, KeyboardInterrupt) and _all_ours(error.__traceback__):
            error.__traceback__ = None
        return error
    kept: list[TracebackType] = []
    hiding = False
    while tb is not None:
        code = tb.tb_frame.f_code
        if code in _HOOKS:
            hiding = True
        elif hiding and not _ours(code):
            hiding = False  # the hook called back into other code: the user's, shown
        if not hiding:
            kept.append(tb)
        tb = tb.tb_next
    for a, b in itertools.pairwise(kept):
        a.tb_next = b
    kept[-1].tb_next = None
    error.__traceback__ = kept[0]
    return error


def _all_ours(tb: TracebackType | None) -> bool:
    """Whether every frame of ``tb`` is gpumagic's or the standard library's contextlib
    (the held interrupt is raised inside a ``@contextmanager``)."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (_ours(tb.tb_frame.f_code) or name.endswith(os.sep + "contextlib.py")):
            return False
        tb = tb.tb_next
    return True


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then the exception it was raised while handling (``__context__``), and so
    on, each once: a chain that loops back on itself ends there."""
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__context__
