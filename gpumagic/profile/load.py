"""Load traces written by ``torch.profiler`` (or any Kineto writer) into a ProfileResult."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.result import ProfileResult
from gpumagic.profile.trace.decode import read_trace, trace_files
from gpumagic.profile.trace.errors import TraceError
from gpumagic.profile.trace.model import Trace
from gpumagic.profile.trace.session import LiveState
from gpumagic.profile.trace.spans import CodeLabels

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def load_trace(
    path: str | Path,
    live: LiveState | None = None,
    *,
    step_marks: bool = True,
    mark_limit: int | None = None,
    skip_first: bool = False,
    labels: CodeLabels | None = None,
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
    for (sources, module names), where the file does not carry them itself.

    Raises :class:`TraceError` (a ``ValueError``) naming the file and the reason when
    the input is missing, empty, truncated, not JSON, or not a trace.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        files = trace_files(p)
        if not files:
            raise TraceError(p, "the directory holds no trace files (*.json, *.json.gz)")
        traces = [_labelled(read_trace(f), labels) for f in files]
        _number_ranks(traces, files)
        return ProfileResult(
            [Analysis(t, step_marks, mark_limit, skip_first, keep_startup) for t in traces],
            str(p),
            live,
        )
    if not p.exists():
        raise TraceError(p, "no such file or directory")
    return ProfileResult(
        [
            Analysis(
                _labelled(read_trace(p), labels), step_marks, mark_limit, skip_first, keep_startup
            )
        ],
        str(p),
        live,
    )


def _labelled(trace: Trace, labels: CodeLabels | None) -> Trace:
    if labels is not None:
        trace.code.labels = labels
    return trace


def _number_ranks(traces: list[Trace], files: list[Path]) -> None:
    # distributedInfo.rank when the writer recorded it, else a number in the file name,
    # else the position in the directory
    seen: set[int] = set()
    for i, (t, f) in enumerate(zip(traces, files)):
        if t.rank is None or t.rank in seen:
            m = _RANK_IN_NAME.search(f.name)
            t.rank = int(m.group(1)) if m and int(m.group(1)) not in seen else i
        seen.add(t.rank)


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
