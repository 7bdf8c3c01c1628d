"""Which line of the cell, and which module, a finding's evidence comes from.

A rule names the trace events its evidence rests on (:class:`EvidenceRows`: host
operators, runtime calls, GPU events, each with a weight such as its duration), and the
finding points at the statement that holds most of that weight: the statement whose range
contains a host event's or runtime call's start, or the launch of a GPU event (see
:mod:`gpumagic.profile.analysis.lines`). Where asked, GPU evidence also names the innermost module
holding most of it (see :mod:`gpumagic.profile.analysis.modules`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpumagic.profile.analysis.lines import line_attribution
from gpumagic.profile.analysis.modules import module_attribution
from gpumagic.profile.analysis.trace_analysis import Analysis


def _none() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class EvidenceRows:
    """The events behind a finding; a weight per row (None: each row counts 1)."""

    host: np.ndarray = field(default_factory=_none)
    host_weight: np.ndarray | None = None
    runtime: np.ndarray = field(default_factory=_none)
    runtime_weight: np.ndarray | None = None
    gpu: np.ndarray = field(default_factory=_none)
    gpu_weight: np.ndarray | None = None
    module: bool = False  # also name the module holding most of the GPU evidence


@dataclass(frozen=True)
class Place:
    line: int | None
    source: str
    module: str


def _weights(rows: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    return np.ones(len(rows)) if weight is None else np.asarray(weight, float)


def _heaviest(groups: np.ndarray, weights: np.ndarray) -> int:
    ok = groups >= 0
    if not ok.any():
        return -1
    totals = np.bincount(groups[ok], weights=weights[ok])
    return int(np.argmax(totals)) if totals.max() > 0 else -1


def locate(analysis: Analysis, rows: EvidenceRows) -> Place:
    """The statement (and module) holding most of the evidence; empty where none does."""
    line: int | None = None
    source = module = ""
    lines = line_attribution(analysis)
    if lines:
        groups = np.concatenate(
            [
                lines.host_rows[rows.host],
                lines.runtime_rows[rows.runtime],
                lines.gpu_rows[rows.gpu],
            ]
        )
        weights = np.concatenate(
            [
                _weights(rows.host, rows.host_weight),
                _weights(rows.runtime, rows.runtime_weight),
                _weights(rows.gpu, rows.gpu_weight),
            ]
        )
        row = _heaviest(groups, weights)
        if row >= 0:
            label = lines.label(row)
            line, source = (label.line if label.line >= 0 else None), label.source
    if rows.module and len(rows.gpu):
        modules = module_attribution(analysis)
        if modules:
            row = _heaviest(modules.gpu_modules[rows.gpu], _weights(rows.gpu, rows.gpu_weight))
            if row >= 0:
                module = modules.name(row)
    return Place(line, source, module)
