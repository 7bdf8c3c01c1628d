"""What every rule shares: :class:`Finding`, :class:`Context`, :class:`Rule`, severities.

Each rule looks for one known cause of slow steps, quotes the numbers that show it,
estimates what fixing it would save per step (from measured time, never a guess about
hardware), and gives the fix as code. Rules take an optional :class:`LiveState` from the
running session to confirm a hint (the trace says ``_SingleProcessDataLoaderIter``; the
namespace says ``loader.num_workers == 0``) or to rule it out; without one they decide
from the trace alone. Rules about GPU behaviour stay silent on a trace without GPU
events.

A rule is two functions side by side in its family's module: a *detection* that reads the
:class:`Context` and returns its :class:`Evidence` (numbers, flags, the trace rows behind
them; no prose) or None, and an *advice* that turns that evidence and the :class:`Facts`
it may fit itself to into the words and code of an :class:`Advice`. :class:`Rule` pairs
them and builds the :class:`Finding`.

Savings overlap (a DataLoader stall is also GPU idle time), so they are estimates for
ranking, not a sum to expect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Generic, TypeVar

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


@dataclass(frozen=True)
class Facts:
    """What advice may fit itself to besides the evidence.

    Today the live session (how TF32 was set, the DDP options, ``None`` for a trace loaded
    from disk). Facts about the machine the advice is for (the CPUs this process may use,
    from ``os.sched_getaffinity``; the GPU's compute capability; the torch version) belong
    here as further fields, so that snippets can fit the machine without any rule's
    signature changing.
    """

    live: LiveState | None = None


class Context:
    """What the detections share: the analysis, the live state, per-step helpers."""

    def __init__(self, analysis: Analysis, live: LiveState | None) -> None:
        self.a = analysis
        self.trace = analysis.trace
        self.live = live
        self.facts = Facts(live)
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

    def kernels_from(self, ops: np.ndarray) -> np.ndarray:
        """Mask over GPU events: the kernels inside the steps that were launched while one
        of ``ops`` (a mask over host events) ran."""
        op = self.a.launch_op
        out = (self.trace.gpu.kind == KERNEL) & self.gpu_in_steps & (op >= 0)
        out[out] = ops[op[out]]
        return out


def kernels_named(c: Context, names: set[str], module: bool = False) -> EvidenceRows:
    gpu = c.trace.gpu
    m = (gpu.kind == KERNEL) & c.gpu_in_steps & gpu.name.mask(lambda n: n in names)
    return EvidenceRows(gpu=np.flatnonzero(m), gpu_weight=(gpu.end - gpu.ts)[m], module=module)


@dataclass(frozen=True, eq=False, kw_only=True)
class Evidence:
    """What a detection found: numbers, flags and the trace rows behind them, no prose.

    Each rule extends it with its own numbers; :meth:`quoted` names those a finding quotes
    (:attr:`Finding.evidence`, what a user keeps as data).
    """

    saving_us: float  # estimated time the fix saves per step (0: none estimated)
    rows: EvidenceRows | None = None  # the trace events behind it, which locate the line
    confirmed: bool = False  # the live session confirmed what the trace suggested

    def quoted(self) -> dict[str, float | int | str]:
        return {}

    def severity(self, step_us: float) -> str:
        """By the saving's share of the step; a rule whose saving is no measure of harm
        (none is estimated) says otherwise."""
        return severity(self.saving_us, step_us)


@dataclass(frozen=True)
class Advice:
    """The words and code of a finding."""

    title: str
    message: str
    fix: str
    snippet: str


E = TypeVar("E", bound=Evidence)


@dataclass(frozen=True)
class Rule(Generic[E]):
    """One rule: ``detect`` reads the analysis and returns its evidence (or None), ``advise``
    turns the evidence into words and code."""

    name: str
    detect: Callable[[Context], E | None]
    advise: Callable[[E, Facts], Advice]

    def __call__(self, c: Context) -> Finding | None:
        found = self.detect(c)
        if found is None:
            return None
        advice = self.advise(found, c.facts)
        return Finding(
            rule=self.name,
            title=advice.title,
            severity=found.severity(c.step_us),
            saving_us=float(max(found.saving_us, 0.0)),
            message=advice.message,
            evidence=found.quoted(),
            fix=advice.fix,
            snippet=advice.snippet,
            confirmed=found.confirmed,
            rows=found.rows,
        )
