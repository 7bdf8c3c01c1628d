"""What every rule shares: :class:`Finding`, :class:`Context`, severities.

Each rule looks for one known cause of slow steps, quotes the numbers that show it,
estimates what fixing it would save per step (from measured time, never a guess about
hardware), and gives the fix as code. Rules take an optional :class:`LiveState` from the
running session to confirm a hint (the trace says ``_SingleProcessDataLoaderIter``; the
namespace says ``loader.num_workers == 0``) or to rule it out; without one they decide
from the trace alone. Rules about GPU behaviour stay silent on a trace without GPU
events.

Savings overlap (a DataLoader stall is also GPU idle time), so they are estimates for
ranking, not a sum to expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gpumagic.profile.analysis.breakdown import CATEGORIES
from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.trace.model import KERNEL
from gpumagic.profile.trace.session import LiveState

SEVERITIES = ("high", "medium", "low")


@dataclass
class Finding:
    """One diagnosed problem."""

    rule: str
    title: str
    severity: str  # "high", "medium" or "low"
    saving_us: float  # estimated time saved per step by the fix
    message: str
    evidence: dict[str, float | int | str] = field(default_factory=dict)
    fix: str = ""
    snippet: str = ""
    confirmed: bool = False  # the live session confirmed what the trace suggested
    # where in the user's code the evidence comes from (a %%gpuprofile cell's trace): the
    # statement holding most of it, and for GPU evidence that sits in a model, the module
    line: int | None = None
    source: str = ""
    module: str = ""
    # the trace events behind the evidence, which locate the line and module
    rows: EvidenceRows | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "title": self.title,
            "severity": self.severity,
            "saving_us": self.saving_us,
            "message": self.message,
            "evidence": dict(self.evidence),
            "fix": self.fix,
            "snippet": self.snippet,
            "confirmed": self.confirmed,
            "line": self.line,
            "source": self.source,
            "module": self.module,
        }


def severity(saving_us: float, step_us: float) -> str:
    share = saving_us / step_us if step_us > 0 else 0.0
    if share >= 0.10:
        return "high"
    if share >= 0.02:
        return "medium"
    return "low"


class Context:
    """What the rules share: the analysis, the live state, per-step helpers."""

    def __init__(self, analysis: Analysis, live: LiveState | None) -> None:
        self.a = analysis
        self.trace = analysis.trace
        self.live = live
        self.steps = analysis.steps
        self.n_steps = max(len(self.steps), 1)
        self.step_us = analysis.breakdown.mean_step_us
        self.percent = dict(zip(CATEGORIES, analysis.breakdown.percent.tolist()))
        self.us = dict(zip(CATEGORIES, analysis.breakdown.mean_us.tolist()))
        self.has_gpu = analysis.trace.has_gpu
        self.rocm = any(v.startswith("hip") for v in analysis.trace.runtime.name.values)

    def host_in_steps(self, ts: np.ndarray) -> np.ndarray:
        st = self.steps
        if st.source == "trace":
            return np.ones(len(ts), bool)
        return (ts >= st.host_start[0]) & (ts <= st.host_end[-1])

    @cached_property
    def gpu_in_steps(self) -> np.ndarray:
        mask = np.zeros(len(self.trace.gpu.ts), bool)
        mask[self.a.idle_rows("steps")[0]] = True
        return mask

    def per_step(self, total: float) -> float:
        return total / self.n_steps

    def finding(self, rule: str, title: str, saving: float, message: str, **kw: object) -> Finding:
        return Finding(
            rule=rule,
            title=title,
            severity=severity(saving, self.step_us),
            saving_us=float(max(saving, 0.0)),
            message=message,
            **kw,  # type: ignore[arg-type]
        )


def kernels_named(c: Context, names: set[str], module: bool = False) -> EvidenceRows:
    gpu = c.trace.gpu
    m = (gpu.kind == KERNEL) & c.gpu_in_steps & gpu.name.mask(lambda n: n in names)
    return EvidenceRows(gpu=np.flatnonzero(m), gpu_weight=(gpu.end - gpu.ts)[m], module=module)
