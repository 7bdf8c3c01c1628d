"""``%%memfit``'s core in one call: the dry run, the headroom and verdict, the batch fit and
the what-ifs, gathered into a :class:`~.result.MemFit`. ``memfit(source, namespace, ...)``
is the same from a script."""

from __future__ import annotations

import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumagic.cards import GPUS, find_gpu, gpu_names
from gpumagic.cell import PreparedCell, PythonCompiler, error_text, prepare
from gpumagic.memory.fit.allocator import AllocatorModel
from gpumagic.memory.fit.attention import card_for
from gpumagic.memory.fit.batch import BatchPoint, largest_batch
from gpumagic.memory.fit.deadline import check_timeout
from gpumagic.memory.fit.dry_run import DEFAULT_TIMEOUT_S, DryRun, dry_run
from gpumagic.memory.fit.headroom import FRAGMENTATION, HeadroomLine, headroom, needed, verdict
from gpumagic.memory.fit.notes import dry_run_notes, why_stopped
from gpumagic.memory.fit.result import MemFit, Target, WhatIf
from gpumagic.memory.fit.shadow import code_names, referenced_names
from gpumagic.memory.fit.sharding.fit import ShardFit, sharded
from gpumagic.memory.fit.sharding.record import StepRecorder
from gpumagic.memory.fit.what_if import make_fix
from gpumagic.namespace import is_a
from gpumagic.units import parse_size

_MATMULS = ("mm.", "addmm.", "bmm.", "baddbmm.", "addbmm.", "_scaled_dot_product", "_scaled_mm", "linear.")
_CONVOLUTIONS = ("convolution", "cudnn_convolution", "_convolution", "conv2d.", "conv1d.", "conv3d.")


@dataclass
class FitOptions:
    """``gpu``: a card of the table; ``memory``: a size instead ("24GiB"); neither: this
    machine's GPU, if any. ``batch``: (variable, sizes to try). ``what_if``: fix names.
    ``hidden``: names used as they are (IPython's own). ``timeout_s``: per dry run.
    ``shard``: (GPUs, modes): each mode's per-rank peak (:mod:`.sharding`)."""

    gpu: str | None = None
    memory: int | str | None = None
    batch: tuple[str, list[int]] | None = None
    what_if: Sequence[str] = ()
    hidden: frozenset[str] = frozenset()
    timeout_s: float = DEFAULT_TIMEOUT_S
    extra: dict[str, Any] = field(default_factory=dict)
    shard: tuple[int, list[str]] | None = None  # --gpus N --shard MODES (memory/fit/sharding)


def resolve_target(gpu: str | None, memory: int | str | None) -> Target | None:
    """The memory to hold the prediction against; ValueError naming the table's cards for a
    name it lacks."""
    if gpu is not None and memory is not None:
        raise ValueError("give --gpu or --memory, not both")
    if gpu is not None:
        spec = find_gpu(gpu)
        if spec is None:
            raise ValueError(f"no GPU named {gpu!r} in the table; known: {', '.join(gpu_names())} (or give --memory SIZE)")
        return Target(
            spec.name, spec.cuda_bytes, spec.uncertainty_bytes, spec.source, spec.how, spec.capability,
            spec.capability_minor,
        )
    if memory is not None:
        size = parse_size(memory)
        return Target(f"{size / 2**30:.4g} GiB", size, 0, "given", "--memory")
    import torch

    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return Target(f"this GPU (cuda:{index}, {props.name})", int(props.total_memory), 0,
                      "torch.cuda.get_device_properties", "this machine", int(props.major), int(props.minor))
    return None


@dataclass(frozen=True)
class _CellNeeds:
    """What the headroom reads of a dry run, the same for every card: which libraries'
    workspaces the cell needs, and the caching allocator's fragmentation from the one replay
    of its allocations (no card changes the replay: :mod:`.allocator` says why)."""

    matmuls: bool
    convolutions: bool
    fragmentation: int | None


def _cell_needs(run: DryRun) -> _CellNeeds:
    ops = run.accounting.ops
    trace = run.accounting.trace
    return _CellNeeds(
        matmuls=any(name.startswith(_MATMULS) for name in ops),
        convolutions=any(name.startswith(_CONVOLUTIONS) for name in ops),
        fragmentation=AllocatorModel().replay(trace).fragmentation if trace is not None else None,
    )


def _headroom(needs: _CellNeeds, target: Target | None) -> list[HeadroomLine]:
    return headroom(
        matmuls=needs.matmuls,
        convolutions=needs.convolutions,
        fragmentation=needs.fragmentation,
        capability_major=target.capability if target else None,
        total_bytes=target.capacity if target else None,
    )


def predict(prepared: PreparedCell, user_ns: dict[str, Any], opts: FitOptions) -> MemFit:
    """The whole prediction for a prepared cell (see the module docstring)."""
    started = time.perf_counter()
    target = resolve_target(opts.gpu, opts.memory)
    check_timeout(opts.timeout_s)
    if opts.batch is not None:
        unread = batch_unread(prepared, opts.batch[0], user_ns)
        if unread:
            raise ValueError(unread)
    base_overrides: dict[str, Any] = {}
    batch_base: tuple[str, int] | None = None
    if opts.batch is not None:
        var, values = opts.batch
        current = user_ns.get(var)
        value = current if is_a(current, int) and not is_a(current, bool) else max(values)
        if current is not value:
            base_overrides[var] = value
        batch_base = (var, value)

    counted: dict[str, str] = {}  # the main run's answer to which tensors count, for the rest
    card = card_for(target.name, target.capability, target.capability_minor) if target else card_for(None, None, None)

    def run(**kw: Any) -> DryRun:
        overrides = {**base_overrides, **kw.pop("overrides", {})}
        return dry_run(
            prepared, user_ns, hidden=opts.hidden, overrides=overrides, timeout_s=opts.timeout_s,
            count=counted.get("count"), card=card, **kw,
        )

    recorder = StepRecorder() if opts.shard is not None else None
    main = run(transform=recorder.install) if recorder is not None else run()
    counted["count"] = main.counted
    needs = _cell_needs(main)
    lines = _headroom(needs, target)
    acc = main.accounting
    # a run that did not reach the end of the cell saw only part of its peak: no verdict
    finished = main.error is None
    fit = MemFit(
        peak_bytes=acc.peak_bytes,
        categories=dict(acc.categories),
        module_rows=list(acc.modules),
        peak_line=_line(prepared, acc.peak_statement),
        peak_source=_source(prepared, acc.peak_statement),
        target=target,
        headroom=lines,
        fits=verdict(acc.peak_bytes, lines, target.capacity, target.uncertainty) if target and finished else None,
        need=needed(acc.peak_bytes, lines),
        notes=dry_run_notes(main, prepared),
        on_gpu=main.on_gpu,
        start_bytes=acc.start_bytes,
        end_bytes=acc.end_bytes,
    )
    if main.error is not None:
        fit.error_line = _line(prepared, main.error_statement)
        fit.error = why_stopped(main, prepared)
    if target is None and finished:
        fit.verdicts = [
            (g.name, g.cuda_bytes, verdict(acc.peak_bytes, _headroom(needs, Target(g.name, g.cuda_bytes, capability=g.capability)), g.cuda_bytes, g.uncertainty_bytes))
            for g in GPUS
        ]
    if opts.batch is not None and main.error is None:
        fit.batch = _fit_batch(opts.batch, target, lines, acc.peak_bytes, run)
    if recorder is not None and opts.shard is not None:
        if finished:
            fit.shard = _sharded(recorder, opts.shard, target, needs, acc.peak_bytes)
        else:  # a step recorded only in part judges nothing
            fit.notes.append("--gpus/--shard: no per-rank figures: the dry run stopped before the end of the cell.")
    names_read = code_names([*prepared.body, prepared.last_expr])
    for name in opts.what_if:
        fit.what_ifs.append(_what_if(name, batch_base, names_read, user_ns, main, run))
    fit.seconds = time.perf_counter() - started
    return fit


def _sharded(
    recorder: StepRecorder, shard: tuple[int, list[str]], target: Target | None, needs: _CellNeeds, peak: int
) -> ShardFit:
    """``--gpus N --shard MODES`` (:mod:`.sharding`), each card's headroom as for one GPU."""
    capability = {g.name: g.capability for g in GPUS}
    if target is not None:
        capability[target.name] = target.capability

    def card_lines(card: tuple[str, int, int]) -> list[HeadroomLine]:
        return _headroom(needs, Target(card[0], card[1], card[2], capability=capability.get(card[0])))

    wanted = (target.name, target.capacity, target.uncertainty) if target is not None else None
    return sharded(recorder, shard, wanted, card_lines, peak)


def batch_unread(prepared: PreparedCell, variable: str, user_ns: Mapping[str, Any]) -> str:
    """Why ``--batch VARIABLE=...`` cannot change the cell ("" when it can): neither the cell
    nor a function of the notebook it calls reads ``variable``, so every size would give the
    same dry run (issue 25, item 6: 18 identical runs, then "not confirmed")."""
    codes = [*prepared.body, prepared.last_expr]
    read = code_names(codes)
    # the notebook's functions the cell calls read the shadow's globals, where --batch sets it
    for name in referenced_names(codes, user_ns):
        value = user_ns[name]
        if is_a(value, types.FunctionType) and value.__globals__ is user_ns:
            read |= code_names([value.__code__])
    if variable in read:
        return ""
    return (
        f"--batch {variable}=...: the cell does not read `{variable}` (nor does a function of "
        "the notebook it calls), so every size would give the same dry run"
    )


def _fit_batch(batch: tuple[str, list[int]], target: Target | None, lines: list[HeadroomLine], peak: int, run: Any) -> Any:
    if target is None:
        raise ValueError("--batch needs a target: --gpu NAME or --memory SIZE (no GPU here)")
    var, values = batch
    fixed = sum(line.high for line in lines if line.what != FRAGMENTATION)
    fragmentation = sum(line.high for line in lines if line.what == FRAGMENTATION)
    ratio = fragmentation / peak if peak > 0 else 0.0
    budget = target.capacity - target.uncertainty

    def run_at(value: int) -> BatchPoint:
        dr = run(overrides={var: value})
        got = dr.accounting.peak_bytes
        if dr.error is not None:
            return BatchPoint(value, got, 0, False, error=error_text(dr.error, 200))
        need = got + int(got * ratio) + fixed
        return BatchPoint(value, got, need, need <= budget)

    return largest_batch(var, values, budget, run_at)


def _what_if(name: str, batch_base: tuple[str, int] | None, names_read: set[str], user_ns: Mapping[str, Any], base: DryRun, run: Any) -> WhatIf:
    fix = make_fix(name, batch_base, names_read, user_ns)
    if fix.unavailable:
        return WhatIf(name, "", None, None, unavailable=fix.unavailable)
    dr = run(transform=fix.transform, autocast=fix.autocast, overrides=fix.overrides)
    changed = "; ".join(dr.changes) or fix.changed
    if not changed:
        return WhatIf(name, "", None, None, unavailable="nothing in the namespace to change")
    if dr.error is not None:
        return WhatIf(name, changed, None, None, error=f"the dry run stopped: {error_text(dr.error, 180)}")
    acc = dr.accounting
    return WhatIf(name, changed, acc.peak_bytes, base.accounting.peak_bytes - acc.peak_bytes, dict(acc.categories))


def _line(prepared: PreparedCell, index: int) -> int | None:
    return prepared.statements[index].line if 0 <= index < len(prepared.statements) else None


def _source(prepared: PreparedCell, index: int) -> str:
    if 0 <= index < len(prepared.statements):
        return prepared.statements[index].source
    return "before the cell (what it was given)" if index == -1 else ""


def memfit(
    source: str,
    namespace: dict[str, Any] | None = None,
    *,
    gpu: str | None = None,
    memory: int | str | None = None,
    batch: tuple[str, Sequence[int]] | None = None,
    what_if: Sequence[str] | str = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    gpus: int | None = None,
    shard: str | None = None,
) -> MemFit:
    """Predict the CUDA peak of ``source`` (a cell's code) run in ``namespace`` (a script's
    ``globals()``), by a dry run on fake tensors: nothing is allocated, no GPU is needed, and
    ``namespace`` is left as it was. ``gpus`` and ``shard`` (``"fsdp"``, ``"ddp,zero3"``,
    ``"all"``): one rank's peak sharded over that many GPUs (``.shards``).

    >>> fit = gpumagic.memfit("loss = model(x).sum()\\nloss.backward()", globals(), gpu="A100 80GB")
    >>> fit.peak_bytes, fit.fits
    """
    opts = fit_options(gpu, memory, batch, what_if, timeout_s, gpus, shard)
    # plain Python: no IPython syntax; tracebacks read the source from linecache as <memfit-N>
    prepared = prepare(PythonCompiler("memfit"), source, None, instrument=True, raise_compile_errors=True)
    return predict(prepared, namespace if namespace is not None else {}, opts)


def fit_options(
    gpu: str | None = None,
    memory: int | str | None = None,
    batch: str | tuple[str, Sequence[int]] | None = None,
    what_if: Sequence[str] | str = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    gpus: int | None = None,
    shard: str | None = None,
) -> FitOptions:
    """The options of a prediction, checked: each bad one a ValueError naming the option as
    ``%%memfit`` spells it (``batch``: ``"VAR=v1,v2"`` as typed, or (variable, sizes))."""
    from gpumagic.memory.fit.deadline import check_timeout
    from gpumagic.memory.fit.sharding.fit import parse_modes
    from gpumagic.memory.fit.what_if import parse_fixes

    if isinstance(batch, str):
        var, _, values = batch.partition("=")
        try:
            sizes = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            sizes = []
        if not var.isidentifier() or not sizes or min(sizes) < 1:
            raise ValueError(f"--batch {batch!r}: give VAR=v1,v2,... with whole sizes >= 1")
        batch = (var, sizes)
    try:
        fixes = parse_fixes(what_if) if isinstance(what_if, str) else list(what_if)
    except ValueError as exc:
        raise ValueError(f"--what-if: {exc}") from None
    try:
        timeout = check_timeout(timeout_s)
    except ValueError as exc:
        raise ValueError(f"--timeout: {exc}") from None
    sharding = None
    if gpus is not None or shard is not None:
        if shard is None:
            raise ValueError("--gpus N needs --shard MODE (ddp, fsdp, zero1, zero2, zero3 or all)")
        if gpus is None:
            raise ValueError("--shard needs --gpus N (the number of GPUs)")
        if gpus < 1:
            raise ValueError(f"--gpus {gpus}: give a whole number >= 1")
        try:
            sharding = (gpus, parse_modes(shard))
        except ValueError as exc:
            raise ValueError(f"--shard: {exc}") from None
    resolve_target(gpu, memory)  # an unknown card, a bad size, or both given
    if batch is not None and gpu is None and memory is None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--batch needs --gpu NAME or --memory SIZE (no GPU here)")
    sizes_of = (batch[0], [int(v) for v in batch[1]]) if batch is not None else None
    return FitOptions(gpu=gpu, memory=memory, batch=sizes_of, what_if=fixes, timeout_s=timeout, shard=sharding)


__all__ = ["FitOptions", "fit_options", "memfit", "predict", "resolve_target"]
