"""One dry run: a prepared cell executed in its shadow namespace on fake tensors, under the
accounting, with nothing of the user's touched.

Layers, from the outside in: the user's objects snapshot and put back, files kept out of
reach (:mod:`.isolation`, :mod:`.files`); torch's global switches and the random generators
kept (:func:`.switches.kept_switches`) and namespace bindings compared
(:func:`.shadow.bindings_kept`); the cell's output captured
(it still runs its Python, and the report says how much it printed); the shadow built;
then the modes, bottom to top: ``FakeTensorMode`` (``allow_non_fake_inputs``: a real tensor
the cell reaches some other way is converted, never written), the value answers
(:mod:`.answers`), without a GPU the device labels (:mod:`.devices`), above them every real
tensor made fake before a call sees it (:class:`.isolation.RealTensorsFake`: without it
``FakeTensorMode`` runs an operation whose inputs are all real for real), and on top the
accounting engine's own mode. The cell runs through :func:`gpumagic.cell.execute`, with
the shadow as its namespace, its statements marked by the same probe hooks as
``%%memtrace``'s, under the time limit's alarm (:mod:`.deadline`) and with data loaders'
workers kept in the process (:mod:`.loaders`).

Paths that would abort the process on this build are never taken: without a GPU no fake
CUDA tensor is made (``.cuda()`` and ``device="cuda"`` become labelled CPU tensors), and
torch's ``RuntimeEstimator`` (which asserts CUDA and dies through C++) is not used.

Which tensors count (the census's ``keep``): a GPU run's CUDA memory. A cell that puts
tensors on CUDA has only those counted; a cell that puts none there (it picks its device
at run time, ``"cuda" if torch.cuda.is_available() else "cpu"``, and runs on the CPU here)
has every tensor counted. Which of the two a cell is shows only when it runs, so a first dry
run counts every tensor and stops at the first statement boundary after the cell made a
CUDA tensor, and the run is made again counting CUDA's (nothing was on CUDA before that
moment). The answer holds for the cell's later dry runs (``--batch``, ``--what-if``).
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
from gpumagic.memory.census.tracker import CUDA_ROUNDING, on_cpu
from gpumagic.memory.fit.accounting import Accounting, AccountingScope, CensusProbe, account
from gpumagic.memory.fit.answers import Answers, NeedsValues, ValueAnswers, ValueFunctions
from gpumagic.memory.fit.attention import CudaAttention, CudaCard, card_for
from gpumagic.memory.fit.deadline import DryRunTimeout, deadline
from gpumagic.memory.fit.devices import (
    CUDA,
    CudaRequests,
    DeviceLabels,
    DeviceMap,
    given_to_cuda,
    swap_tensors_for_fakes,
)
from gpumagic.memory.fit.files import scratch_files
from gpumagic.memory.fit.generation import Generation, to_length_limit
from gpumagic.memory.fit.isolation import Kept, RealTensorsFake, kept_objects
from gpumagic.memory.fit.layouts import strided_only
from gpumagic.memory.fit.loaders import in_process_loaders
from gpumagic.memory.fit.shadow import (
    Shadow,
    bindings_kept,
    build_shadow,
    referenced_names,
)
from gpumagic.memory.fit.switches import kept_switches, leave_inference_mode
from gpumagic.memory.fit.values import KnownValues
from gpumagic.units import fmt_bytes

DEFAULT_TIMEOUT_S = 120.0


ALL = "all"  # every tensor counts: the cell puts none on CUDA


class _CudaFound(BaseException):
    """A dry run counting every tensor met a CUDA one: made again counting CUDA's. A
    ``BaseException``, so that the cell's own ``except Exception`` lets it through."""


class _Clock:
    """Which statement runs now; the time limit, checked at each statement and at each
    operation (:class:`~.answers.ValueAnswers`); ``stop_if``: checked at each statement."""

    def __init__(self, timeout_s: float, stop_if: Callable[[], bool] | None = None) -> None:
        self.current = -1
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.stop_if = stop_if

    def enter(self, index: int) -> None:
        self.current = index
        self.check()
        if self.stop_if is not None and self.stop_if():
            raise _CudaFound

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise DryRunTimeout(f"the dry run took longer than {self.timeout_s:g} s")

    def statement(self) -> int:
        return self.current


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
    counted: str = ALL  # which tensors counted: CUDA's, or ALL
    cuda_made: bool = False  # the cell made a CUDA tensor
    files: list[tuple[int, str]] = field(default_factory=list)  # (statement, what the file overlay did)
    kept: Kept = field(default_factory=Kept)  # the user's objects put back (.isolation)
    switched: list[str] = field(default_factory=list)  # torch's switches the cell changed, put back
    alarm: bool = True  # the time limit was an alarm (else checked at statements and ops only)
    loaders: list[int] = field(default_factory=list)  # workers of each DataLoader run in-process
    not_counted: set[str] = field(default_factory=set)  # layouts without a storage (sparse)
    modelled: list[str] = field(default_factory=list)  # what was modelled or assumed, for the notes


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
    count: str | None = None,
    card: CudaCard | None = None,
) -> DryRun:
    """Run ``prepared`` on fake tensors in a shadow of ``user_ns`` (see the module docstring).

    ``overrides``: names set in the shadow after it is built (``--batch``); ``transform``: a
    what-if's change to the shadow; ``autocast``: run the cell under ``torch.autocast`` with
    this dtype; ``count``: which tensors count, CUDA's or :data:`ALL` (None: found out, see
    the module docstring; :attr:`DryRun.counted` says which); ``card``: whose CUDA kernels
    a run without a GPU models (:mod:`.attention`; None: an sm80 card's).
    """
    args = (prepared, user_ns, hidden, overrides, transform, autocast, round_to, timeout_s, card or card_for(None, None, None))
    if count is None:
        try:
            run = _dry_run(*args, ALL, stop_on_cuda=True)
            if not run.cuda_made:
                return run
        except _CudaFound:
            pass
        count = CUDA
    return _dry_run(*args, count)


def _dry_run(
    prepared: PreparedCell,
    user_ns: dict[str, Any],
    hidden: set[str] | frozenset[str],
    overrides: Mapping[str, Any] | None,
    transform: Transform | None,
    autocast: torch.dtype | None,
    round_to: int,
    timeout_s: float,
    card: CudaCard,
    count: str,
    stop_on_cuda: bool = False,
) -> DryRun:
    start = time.perf_counter()
    on_gpu = torch.cuda.is_available()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    devices = None if on_gpu else DeviceMap()
    keep, cuda_made = _counting(count, devices)
    not_counted: set[str] = set()
    keep = strided_only(keep, not_counted)
    clock = _Clock(timeout_s, cuda_made if stop_on_cuda else None)
    answers = Answers(clock.statement)
    generation = Generation()
    attention = CudaAttention(card.sm) if devices is not None else None
    out = io.StringIO()
    rebound: list[str] = []
    changes: list[str] = []
    switched: list[str] = []
    limits: dict[str, Any] = {"alarm": True, "loaders": []}
    names = referenced_names([*prepared.body, prepared.last_expr], user_ns)
    # kept_objects outermost: it puts the user's objects back once the shadow is gone
    with kept_objects(user_ns, hidden) as kept, kept_switches(switched), bindings_kept(user_ns, rebound), \
            _captured(out), swap_tensors_for_fakes(fake_mode), scratch_files(clock.statement) as files:
        shadow = build_shadow(names, user_ns, fake_mode, hidden)
        shadow.namespace.update(overrides or {})
        if transform is not None:
            changes = transform(shadow)
        placed = given_to_cuda(shadow.namespace, devices) if devices is not None and count == CUDA else (0, 0)
        scope = AccountingScope(
            namespace=shadow.namespace,
            keep=keep,
            rounding=round_to,
            tensor_type=FakeTensor,
            probe=clock,
            device=CUDA if count == CUDA else "cpu",
        )
        run = _runner(prepared, shadow, autocast, on_gpu, devices, clock, limits)
        with _modes(fake_mode, answers, devices, clock, generation, attention):
            accounting, error = account(run, scope)
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
        counted=count,
        cuda_made=cuda_made(),
        files=files.done,
        kept=kept,
        switched=switched,
        alarm=limits["alarm"],
        loaders=limits["loaders"],
        not_counted=not_counted,
        modelled=_placed_note(placed) + generation.notes() + (attention.notes(card.name) if attention is not None else []),
    )


def _placed_note(placed: tuple[int, int]) -> list[str]:
    if not placed[0]:
        return []
    return [
        f"The cell uses CUDA: the modules and optimizers it takes from the namespace sit on the CPU here "
        f"({placed[0]} tensors, {fmt_bytes(placed[1])}: parameters, buffers, gradients, optimizer state) "
        "and are counted as the GPU's from the start, where a GPU run needs them."
    ]


def _counting(count: str, devices: DeviceMap | None) -> tuple[Callable[[Any], bool], Callable[[], bool]]:
    """The census's ``keep`` for ``count``, and whether the cell has made a CUDA tensor so
    far. Without a GPU, the device labels say (:mod:`.devices`); fake tensors are all CPU
    tensors then, and :func:`~gpumagic.memory.census.tracker.on_cpu` is the census's fast path."""
    if devices is not None:
        if count == CUDA:
            return devices.is_cuda, lambda: devices.cuda_made
        return on_cpu, lambda: devices.cuda_made
    if count == CUDA:
        return (lambda t: bool(t.is_cuda)), lambda: True
    made = [False]

    def keep(t: Any) -> bool:
        kind = t.device.type
        if kind == "cuda":
            made[0] = True
        return bool(kind != "meta")

    return keep, lambda: made[0]


def _runner(
    prepared: PreparedCell,
    shadow: Shadow,
    autocast: torch.dtype | None,
    on_gpu: bool,
    devices: DeviceMap | None,
    clock: _Clock,
    limits: dict[str, Any],
) -> Callable[[CensusProbe], object]:
    def run(probe: CensusProbe) -> object:
        ctx: Any = contextlib.nullcontext()
        if autocast is not None:
            ctx = torch.autocast("cuda" if on_gpu else "cpu", dtype=autocast)
        if devices is not None:
            devices.relabelled = probe.census.adopt
        try:
            clock.check()  # building the shadow counts against the limit too
            # the alarm covers the cell alone: the census's start and stop are never cut
            limit = deadline(clock.deadline - time.monotonic(), clock.timeout_s)
            inference = torch.is_inference_mode_enabled()
            with ctx, in_process_loaders(limits["loaders"]), limit as alarm:
                limits["alarm"] = alarm.alarm
                try:
                    value = execute(shadow.namespace, prepared, probe)
                finally:
                    leave_inference_mode(shadow.namespace, inference)
                if alarm.expired:  # the cell swallowed the limit: it ran as it would not have
                    raise DryRunTimeout(f"the dry run took longer than {clock.timeout_s:g} s")
                return value
        finally:
            if devices is not None:
                devices.relabelled = None

    return run


@contextlib.contextmanager
def _modes(
    fake_mode: FakeTensorMode,
    answers: Answers,
    devices: DeviceMap | None,
    clock: _Clock,
    generation: Generation,
    attention: CudaAttention | None,
) -> Iterator[None]:
    known = KnownValues(FakeTensor)
    with contextlib.ExitStack() as stack:
        if devices is not None:
            # oneDNN's LSTM keeps a workspace its fake kernel leaves out (torch's meta for
            # mkldnn_rnn_layer returns 0 bytes) and a GPU never runs it: without a GPU the
            # dry run takes torch's native per-step kernels, whose saved gates stand in for
            # cuDNN's reserve. Put back when the run ends.
            stack.enter_context(_onednn_off())
        stack.enter_context(fake_mode)
        stack.enter_context(ValueAnswers(answers, clock.check, known))
        if devices is not None:
            stack.enter_context(DeviceLabels(devices))
            stack.enter_context(CudaRequests(devices))
        if attention is not None:  # without a GPU: CUDA's attention kernel, not the CPU's
            stack.enter_context(attention)
        stack.enter_context(ValueFunctions(answers, lambda t: isinstance(t, FakeTensor), known))
        stack.enter_context(to_length_limit(generation))
        # on top: every mode below, autograd and the kernels see fakes only (.isolation)
        stack.enter_context(RealTensorsFake(fake_mode))
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


__all__ = ["ALL", "DryRun", "DryRunTimeout", "NeedsValues", "dry_run"]
