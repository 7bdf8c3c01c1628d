"""``%%memfit``'s core in one call: the dry run, the headroom and verdict, the batch fit and
the what-ifs, gathered into a :class:`~.result.MemFit`. ``memfit(source, namespace, ...)``
is the same from a script."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumagic.cell import PreparedCell, PythonCompiler, error_text, prepare
from gpumagic.memory.fit.allocator import AllocatorModel
from gpumagic.memory.fit.attention import card_for
from gpumagic.memory.fit.batch import BatchPoint, largest_batch
from gpumagic.memory.fit.dry_run import DEFAULT_TIMEOUT_S, DryRun, dry_run
from gpumagic.memory.fit.gpus import GPUS, find_gpu, gpu_names
from gpumagic.memory.fit.headroom import FRAGMENTATION, HeadroomLine, headroom, needed, verdict
from gpumagic.memory.fit.notes import dry_run_notes, why_stopped
from gpumagic.memory.fit.result import MemFit, Target, WhatIf
from gpumagic.memory.fit.shadow import code_names
from gpumagic.memory.fit.what_if import make_fix
from gpumagic.namespace import is_a
from gpumagic.units import parse_size

_MATMULS = ("mm.", "addmm.", "bmm.", "baddbmm.", "addbmm.", "_scaled_dot_product", "_scaled_mm", "linear.")
_CONVOLUTIONS = ("convolution", "cudnn_convolution", "_convolution", "conv2d.", "conv1d.", "conv3d.")


@dataclass
class FitOptions:
    """``gpu``: a card of the table; ``memory``: a size instead ("24GiB"); neither: this
    machine's GPU, if any. ``batch``: (variable, sizes to try). ``what_if``: fix names.
    ``hidden``: names used as they are (IPython's own). ``timeout_s``: per dry run."""

    gpu: str | None = None
    memory: int | str | None = None
    batch: tuple[str, list[int]] | None = None
    what_if: Sequence[str] = ()
    hidden: frozenset[str] = frozenset()
    timeout_s: float = DEFAULT_TIMEOUT_S
    extra: dict[str, Any] = field(default_factory=dict)


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


def _headroom(run: DryRun, target: Target | None) -> list[HeadroomLine]:
    ops = run.accounting.ops
    trace = run.accounting.trace
    return headroom(
        matmuls=any(name.startswith(_MATMULS) for name in ops),
        convolutions=any(name.startswith(_CONVOLUTIONS) for name in ops),
        fragmentation=AllocatorModel().replay(trace).fragmentation if trace is not None else None,
        capability_major=target.capability if target else None,
        total_bytes=target.capacity if target else None,
    )


def predict(prepared: PreparedCell, user_ns: dict[str, Any], opts: FitOptions) -> MemFit:
    """The whole prediction for a prepared cell (see the module docstring)."""
    started = time.perf_counter()
    target = resolve_target(opts.gpu, opts.memory)
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

    main = run()
    counted["count"] = main.counted
    lines = _headroom(main, target)
    acc = main.accounting
    fit = MemFit(
        peak_bytes=acc.peak_bytes,
        categories=dict(acc.categories),
        module_rows=list(acc.modules),
        peak_line=_line(prepared, acc.peak_statement),
        peak_source=_source(prepared, acc.peak_statement),
        target=target,
        headroom=lines,
        fits=verdict(acc.peak_bytes, lines, target.capacity, target.uncertainty) if target else None,
        need=needed(acc.peak_bytes, lines),
        notes=dry_run_notes(main, prepared),
        on_gpu=main.on_gpu,
        start_bytes=acc.start_bytes,
        end_bytes=acc.end_bytes,
    )
    if main.error is not None:
        fit.error_line = _line(prepared, main.error_statement)
        fit.error = why_stopped(main, prepared)
    if target is None:
        fit.verdicts = [
            (g.name, g.cuda_bytes, verdict(acc.peak_bytes, _headroom(main, Target(g.name, g.cuda_bytes, capability=g.capability)), g.cuda_bytes, g.uncertainty_bytes))
            for g in GPUS
        ]
    if opts.batch is not None and main.error is None:
        fit.batch = _fit_batch(opts.batch, target, lines, acc.peak_bytes, run)
    names_read = code_names([*prepared.body, prepared.last_expr])
    for name in opts.what_if:
        fit.what_ifs.append(_what_if(name, batch_base, names_read, user_ns, main, run))
    fit.seconds = time.perf_counter() - started
    return fit


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
) -> MemFit:
    """Predict the CUDA peak of ``source`` (a cell's code) run in ``namespace`` (a script's
    ``globals()``), by a dry run on fake tensors: nothing is allocated, no GPU is needed, and
    ``namespace`` is left as it was.

    >>> fit = gpumagic.memfit("loss = model(x).sum()\\nloss.backward()", globals(), gpu="A100 80GB")
    >>> fit.peak_bytes, fit.fits
    """
    from gpumagic.memory.fit.what_if import parse_fixes

    fixes = parse_fixes(what_if) if isinstance(what_if, str) else list(what_if)
    opts = FitOptions(
        gpu=gpu,
        memory=memory,
        batch=(batch[0], [int(v) for v in batch[1]]) if batch is not None else None,
        what_if=fixes,
        timeout_s=timeout_s,
    )
    # plain Python: no IPython syntax; tracebacks read the source from linecache as <memfit-N>
    prepared = prepare(PythonCompiler("memfit"), source, None, instrument=True, raise_compile_errors=True)
    return predict(prepared, namespace if namespace is not None else {}, opts)


__all__ = ["FitOptions", "memfit", "predict", "resolve_target"]
