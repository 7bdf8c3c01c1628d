"""One dry run: a prepared cell executed in its shadow namespace on fake tensors, under the
accounting, with nothing of the user's touched.

Layers, from the outside in: the user's global state kept (:func:`.shadow.kept_global_state`)
and namespace bindings compared (:func:`.shadow.bindings_kept`); the cell's output captured
(it still runs its Python, and the report says how much it printed); the shadow built;
then the modes, bottom to top: ``FakeTensorMode`` (``allow_non_fake_inputs``: a real tensor
the cell reaches some other way is converted, never written), the value answers
(:mod:`.answers`), without a GPU the device labels (:mod:`.devices`), and on top the
accounting engine's own mode. The cell runs through :func:`gpumagic.cell.execute`, with
the shadow as its namespace, its statements marked by the same probe hooks as
``%%memtrace``'s.

Paths that would abort the process on this build are never taken: without a GPU no fake
CUDA tensor is made (``.cuda()`` and ``device="cuda"`` become labelled CPU tensors), and
torch's ``RuntimeEstimator`` (which asserts CUDA and dies through C++) is not used.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from gpumagic.cell import PreparedCell, execute
from gpumagic.memory.fit.accounting import Accounting, AccountingScope, TensorAccounting
from gpumagic.memory.fit.answers import Answers, NeedsValues, ValueAnswers, ValueFunctions
from gpumagic.memory.fit.devices import (
    CUDA,
    CudaRequests,
    DeviceLabels,
    DeviceMap,
    swap_tensors_for_fakes,
)
from gpumagic.memory.fit.shadow import (
    Shadow,
    bindings_kept,
    build_shadow,
    kept_global_state,
    referenced_names,
)
from gpumagic.memory.fit.storage_tracker import StorageTracker

CUDA_ROUNDING = 512  # bytes: c10/cuda/CUDACachingAllocator.cpp kMinBlockSize, every block a multiple
DEFAULT_TIMEOUT_S = 120.0


class DryRunTimeout(RuntimeError):
    """The dry run ran past its time limit."""


class _Clock:
    """The probe: which statement runs now; the time limit, checked at each statement and,
    through :class:`_Deadline`, at each operation."""

    def __init__(self, timeout_s: float) -> None:
        self.current = -1
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s

    def enter(self, index: int) -> None:
        self.current = index
        self.check()

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise DryRunTimeout(f"the dry run took longer than {self.timeout_s:g} s")

    def statement(self) -> int:
        return self.current


class _Namespace:
    """What :func:`gpumagic.cell.execute` reads off a shell: the namespace to run in."""

    def __init__(self, ns: dict[str, Any]) -> None:
        self.user_global_ns = ns
        self.user_ns = ns


@dataclass
class DryRun:
    """What one dry run found. ``accounting`` is the engine's answer; ``error`` the exception
    that stopped the cell (None when it ran to the end), ``error_statement`` where;
    ``answers``: (statement, what, times) for each value the run made up; ``printed``:
    characters the cell wrote to stdout/stderr (not shown); ``notes``: the rest to say."""

    accounting: Accounting
    error: Exception | None
    error_statement: int
    answers: list[tuple[int, str, int]]
    printed: int
    seconds: float
    on_gpu: bool
    copied: list[str] = field(default_factory=list)
    as_is: list[tuple[str, str]] = field(default_factory=list)
    rebound: list[str] = field(default_factory=list)
    relabelled: int = 0
    changes: list[str] = field(default_factory=list)  # what a what-if changed


Transform = Callable[[Shadow], list[str]]  # changes the shadow, says what it changed


def dry_run(
    prepared: PreparedCell,
    user_ns: dict[str, Any],
    *,
    hidden: set[str] | frozenset[str] = frozenset(),
    overrides: Mapping[str, Any] | None = None,
    transform: Transform | None = None,
    autocast: torch.dtype | None = None,
    round_to: int = CUDA_ROUNDING,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    engine: TensorAccounting | None = None,
) -> DryRun:
    """Run ``prepared`` on fake tensors in a shadow of ``user_ns`` (see the module docstring).

    ``overrides``: names set in the shadow after it is built (``--batch``); ``transform``: a
    what-if's change to the shadow; ``autocast``: run the cell under ``torch.autocast`` with
    this dtype; ``engine``: the accounting (default :class:`StorageTracker`).
    """
    start = time.perf_counter()
    on_gpu = torch.cuda.is_available()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    clock = _Clock(timeout_s)
    answers = Answers(clock.statement)
    devices = None if on_gpu else DeviceMap()
    out = io.StringIO()
    rebound: list[str] = []
    changes: list[str] = []
    names = referenced_names([*prepared.body, prepared.last_expr], user_ns)
    with kept_global_state(), bindings_kept(user_ns, rebound), _captured(out), swap_tensors_for_fakes(fake_mode):
        shadow = build_shadow(names, user_ns, fake_mode, hidden)
        shadow.namespace.update(overrides or {})
        if transform is not None:
            changes = transform(shadow)
        scope = AccountingScope(
            namespace=shadow.namespace,
            statement=clock.statement,
            round_to=round_to,
            device_of=(lambda t: devices.label(t)) if devices is not None else None,
            counted=_counted,
        )
        run = _runner(prepared, shadow, clock, autocast, on_gpu)
        with _modes(fake_mode, answers, devices, clock):
            accounting, error = (engine or StorageTracker())(run, scope)
        copied, as_is = list(shadow.copied), list(shadow.as_is)
        del shadow, run, scope
    error_statement = getattr(error, "statement", clock.current) if error is not None else -1
    return DryRun(
        accounting=accounting,
        error=error,
        error_statement=error_statement,
        answers=[(s, what, n) for (s, what), n in answers.given.items()],
        printed=len(out.getvalue()),
        seconds=time.perf_counter() - start,
        on_gpu=on_gpu,
        copied=copied,
        as_is=as_is,
        rebound=rebound,
        relabelled=devices.mismatches if devices is not None else 0,
        changes=changes,
    )


def _counted(seen: set[str]) -> set[str]:
    """The tensors a GPU would hold: those labelled CUDA when the cell put any there, else
    every tensor (a cell that picks its device at run time, ``"cuda" if
    torch.cuda.is_available() else "cpu"``, runs on the CPU here)."""
    return {CUDA} if CUDA in seen else seen


def _runner(
    prepared: PreparedCell, shadow: Shadow, clock: _Clock, autocast: torch.dtype | None, on_gpu: bool
) -> Callable[[], object]:
    def run() -> object:
        ctx: Any = contextlib.nullcontext()
        if autocast is not None:
            ctx = torch.autocast("cuda" if on_gpu else "cpu", dtype=autocast)
        with ctx:
            return execute(_Namespace(shadow.namespace), prepared, clock)

    return run


@contextlib.contextmanager
def _modes(fake_mode: FakeTensorMode, answers: Answers, devices: DeviceMap | None, clock: _Clock) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if devices is not None:
            # oneDNN's LSTM keeps a workspace its fake kernel leaves out (torch's meta for
            # mkldnn_rnn_layer returns 0 bytes) and a GPU never runs it: without a GPU the
            # dry run takes torch's native per-step kernels, whose saved gates stand in for
            # cuDNN's reserve. Put back when the run ends.
            stack.enter_context(_onednn_off())
        stack.enter_context(fake_mode)
        stack.enter_context(ValueAnswers(answers, clock.check))
        if devices is not None:
            stack.enter_context(DeviceLabels(devices))
            stack.enter_context(CudaRequests(devices))
        stack.enter_context(ValueFunctions(answers, lambda t: isinstance(t, FakeTensor)))
        yield


@contextlib.contextmanager
def _onednn_off() -> Iterator[None]:
    # torch.backends.mkldnn.flags() would also set oneDNN's TF32 switch, which warns on
    # builds without Intel GPU support: only the one switch is turned here.
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


@contextlib.contextmanager
def _captured(out: io.StringIO) -> Iterator[None]:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        yield


__all__ = ["DryRun", "DryRunTimeout", "NeedsValues", "dry_run"]
