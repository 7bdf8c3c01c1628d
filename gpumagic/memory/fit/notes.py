"""What a dry run approximated, said as the report's notes, by the line they concern."""

from __future__ import annotations

from collections import defaultdict

from gpumagic.cell import PreparedCell, error_text
from gpumagic.memory.fit.answers import NeedsValues
from gpumagic.memory.fit.devices import CUDA
from gpumagic.memory.fit.dry_run import DryRun, DryRunTimeout
from gpumagic.memory.fit.files import file_notes
from gpumagic.memory.fit.shadow import ShadowError
from gpumagic.units import fmt_count


def _line(prepared: PreparedCell, index: int) -> str:
    if 0 <= index < len(prepared.statements):
        return f"line {prepared.statements[index].line}"
    return "before the cell"


def dry_run_notes(run: DryRun, prepared: PreparedCell) -> list[str]:
    notes: list[str] = []
    notes.append(
        "Figures are for the tensor work: the dry run ran the cell's Python on fake tensors"
        + (
            f"; it printed {fmt_count(run.printed)} characters, not shown (values in them are placeholders)."
            if run.printed
            else "."
        )
    )
    answered: dict[int, list[str]] = defaultdict(list)
    for statement, what, times in sorted(run.answers, key=lambda a: a[0]):  # stable: in the order given
        answered[statement].append(what + (f" ({times}×)" if times > 1 else ""))
    for statement, whats in answered.items():
        notes.append(f"{_line(prepared, statement)}: {'; '.join(whats)} (a fake tensor has no values).")
    ops = run.accounting.ops
    if not run.on_gpu:
        if CUDA in run.accounting.devices:
            notes.append(
                "No GPU here: the tensors the cell puts on CUDA were made as fake CPU tensors "
                "labelled CUDA, each rounded up to CUDA's 512-byte blocks; the rest (host "
                "copies, an optimizer's step counts) are not counted."
            )
        else:
            notes.append(
                "No tensor of the cell goes to CUDA (it picks its device at run time, and there is "
                "no GPU here): every tensor it makes or uses is counted as the GPU's."
            )
        if any("lstm" in name or "rnn" in name or "gru" in name for name in ops):
            notes.append(
                "Recurrent layers ran torch's per-step kernels (oneDNN off): their saved gates "
                "stand in for cuDNN's reserve space."
            )
    if any(name.startswith("_cudnn_rnn") for name in ops):
        notes.append(
            "cuDNN's RNN reserve space is not in the prediction: torch's fake kernel for "
            "_cudnn_rnn gives it 0 bytes."
        )
    if run.relabelled:
        notes.append(
            f"{fmt_count(run.relabelled)} CPU tensors met CUDA tensors in an operation and are "
            "counted on CUDA (on a GPU that operation needs them there)."
        )
    if run.as_is:
        shown = "; ".join(f"`{n}` ({why})" for n, why in run.as_is[:4])
        notes.append(f"Used as they are, not copied (their tensors are converted when used, never written): {shown}.")
    if run.rebound:
        notes.append(
            "The dry run changed these names of your namespace through a function's globals "
            f"and they were put back: {', '.join(sorted(set(run.rebound)))}."
        )
    notes.extend(file_notes(run.files, lambda s: _line(prepared, s)))
    notes.extend(_kept_notes(run))
    notes += _limits_notes(run)
    notes.extend(run.modelled)
    if any("checkpoint" in c for c in run.changes):
        notes.append("Recomputation under activation checkpointing counts as temporaries.")
    return notes


def _kept_notes(run: DryRun) -> list[str]:
    """What the dry run changed of the user's objects beyond its shadow, put back (.isolation)."""
    kept = run.kept
    notes = []
    if kept.restored:
        shown = ", ".join(f"`{p}`" for p in kept.restored[:6]) + (f" (and {len(kept.restored) - 6} more)" if len(kept.restored) > 6 else "")
        notes.append(f"The dry run changed objects of yours beyond the names it copied, and they were put back: {shown}.")
    if kept.written:
        notes.append(f"Real tensors changed all the same (a dry run should not): {', '.join(kept.written[:6])}.")
    if kept.cut:
        notes.append(f"Objects beyond the walk's bounds were not kept for putting back: {'; '.join(kept.cut[:3])}.")
    return notes


def _limits_notes(run: DryRun) -> list[str]:
    """What the dry run kept from reaching the session (switches, workers) or could not count."""
    notes: list[str] = []
    if run.switched:
        notes.append(
            f"The cell changed what the whole session shares ({', '.join(run.switched)}); it "
            "was put back after the dry run."
        )
    if run.loaders:
        notes.append(
            f"{fmt_count(len(run.loaders))} DataLoader(s) with workers (num_workers="
            f"{', '.join(str(n) for n in sorted(set(run.loaders)))}) loaded in the kernel's process, as "
            "num_workers=0 does: no worker process was started (worker_init_fn did not run)."
        )
    if run.not_counted:
        notes.append(
            f"Tensors of layout {', '.join(sorted(run.not_counted))} (sparse gradients of "
            "nn.Embedding(sparse=True), ...) have no storage to weigh and are not counted."
        )
    if not run.alarm:
        notes.append(
            "The time limit was checked between statements and operations only (the dry run "
            "ran off the main thread, or a timer of yours was running): a wait inside one "
            "statement is not cut short."
        )
    return notes


def why_stopped(run: DryRun, prepared: PreparedCell) -> str:
    """Why the dry run stopped, naming the line (the error itself as every report writes one:
    :func:`gpumagic.cell.error_text`)."""
    err = run.error
    if err is None:
        return ""
    where = _line(prepared, run.error_statement)
    if isinstance(err, NeedsValues):
        return f"{where}: {err}"
    if isinstance(err, DryRunTimeout):
        return f"{where}: {err} (a loop on placeholder values? give the cell fewer steps)"
    if isinstance(err, ShadowError):
        return str(err)
    text = f"{where}: {error_text(err, 400)}"
    if "not compiled with CUDA" in text or "no NVIDIA driver" in text:
        # torch.cuda.synchronize(), memory_allocated(), ...: a dry run makes no CUDA context
        text += " (torch.cuda calls need a GPU: a dry run without one cannot make them)"
    return text
