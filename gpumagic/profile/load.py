"""Load traces written by ``torch.profiler`` (or any Kineto writer) into a ProfileResult."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumagic.profile.ranks import (
    LoadOptions,
    Rank,
    analyse_file,
    number_ranks,
    numbering_notes,
    reduce_ranks,
)
from gpumagic.profile.result import ProfileResult
from gpumagic.profile.trace.errors import TraceError
from gpumagic.profile.trace.folders import trace_files, unreadable_entries
from gpumagic.profile.trace.session import LiveState
from gpumagic.profile.trace.spans import CodeLabels

if TYPE_CHECKING:
    from concurrent.futures import Executor


def load_trace(
    path: str | Path,
    live: LiveState | None = None,
    *,
    step_marks: bool = True,
    mark_limit: int | None = None,
    skip_first: bool = False,
    labels: CodeLabels | None = None,
    executor: Executor | None = None,
    keep_startup: bool = False,
) -> ProfileResult:
    """Analyse a Chrome trace from ``torch.profiler``, or a directory of per-rank traces.

    ``path`` is a ``.json`` / ``.json.gz`` file (old and new Kineto schemas, CUDA and
    ROCm) or a directory as ``torch.profiler.tensorboard_trace_handler`` fills it (one
    file per rank). ``live`` optionally passes session facts to the diagnosis.
    ``step_marks=False`` ignores ``ProfilerStep#N`` spans (a recorded cell that never
    called ``gpumagic.step()``): steps then follow DataLoader batches, or the whole trace.
    ``mark_limit=n`` keeps only ``ProfilerStep#N`` with ``N < n`` (the n steps a cell
    closed with ``gpumagic.step()``; the span after the last call is the cell's tail).
    ``skip_first=True`` leaves the first ``ProfilerStep`` (first-call setup) out of the
    steps when there are others; ``%%gpuprofile`` does so unless told ``--keep-first``.
    ``labels`` says what the statement and module ranges of a ``%%gpuprofile`` trace stand
    for (sources, module names), where the file does not carry them itself. A trace without
    step marks is one step from the end of its start-up phase (the first CUDA context, lazy
    module loading, slow first calls: :mod:`gpumagic.profile.analysis.startup`), which the
    report names; ``keep_startup=True`` keeps the phase in the step (the TensorBoard
    plugin's step).

    A directory's ranks are each read, analysed and reduced to a summary in a task of
    ``executor``: any ``concurrent.futures.Executor`` (a Dask cluster's
    ``Client.get_executor()`` spreads them over its machines, which must see the same
    path); by default a process pool with one worker per usable CPU (in this process, one
    rank at a time, where only one CPU is usable). This process keeps the summaries; the
    slowest rank's tables read its file again when first asked for, and ``result.rank(n)``
    reads rank ``n``. With a process pool, a script that calls this at its top level needs
    the usual ``if __name__ == "__main__":`` guard.

    A directory's entries named like traces that are no files (a broken link) are left out
    with a note; ranks are numbered by what each file says (``distributedInfo.rank``), then
    by its name, and a note says which file got another number than it claims (a copy).

    Raises :class:`TraceError` (a ``ValueError``) naming the file and the reason when
    the input is missing, empty, truncated, not JSON, or not a trace, and
    :class:`~gpumagic.profile.ranks.RankTaskError` (a ``RuntimeError``) naming the file when
    an executor's task for a rank fails otherwise (a worker lost; the error is its cause).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        files = trace_files(p)
        left_out = unreadable_entries(p)
        if not files:
            why = "the directory holds no trace files (*.json, *.json.gz)"
            raise TraceError(p, "; ".join([why, *left_out]))
        options = LoadOptions(step_marks, mark_limit, skip_first, labels, keep_startup)
        reduced = reduce_ranks(files, options, executor)
        declared = [s.declared_rank for s in reduced.summaries]
        numbers = number_ranks(declared, files)
        # by number: a copy numbered past the others, or rank-10 before rank-2 by name
        order = sorted(range(len(numbers)), key=numbers.__getitem__)
        ranks = [Rank(numbers[i], summary=reduced.summaries[i], options=options) for i in order]
        result = ProfileResult(ranks, str(p), live)
        result.reduced_by = reduced.how
        result.notes[:0] = left_out + numbering_notes(declared, files, numbers)
        if reduced.note:
            result.notes.append(reduced.note)
        return result
    if not p.exists():
        raise TraceError(p, "no such file or directory")
    return ProfileResult(
        [analyse_file(p, LoadOptions(step_marks, mark_limit, skip_first, labels, keep_startup))],
        str(p),
        live,
    )


def from_profiler(
    prof: Any,
    live: LiveState | None = None,
    keep: str | Path | None = None,
    *,
    step_marks: bool = True,
) -> ProfileResult:
    """Analyse a finished ``torch.profiler.profile`` run by the caller.

    The profiler's own Chrome export is the input, so a live run and a trace loaded
    later give the same numbers. ``keep`` is where to save the trace (``.json`` or
    ``.json.gz``); by default it goes to a temporary file that is removed.
    """
    if keep is not None:
        out = Path(keep)
        if out.name.endswith(".gz"):
            import gzip

            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(raw))
                out.write_bytes(gzip.compress(raw.read_bytes(), compresslevel=6))
        else:
            prof.export_chrome_trace(str(out))
        return load_trace(out, live, step_marks=step_marks)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        result = load_trace(raw, live, step_marks=step_marks)
        result.source = "torch.profiler"
        result.name = "torch.profiler"
        return result
