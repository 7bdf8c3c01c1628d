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

import functools
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from gpumagic.profile.analysis.breakdown import CATEGORIES
from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.trace.model import KERNEL, Trace
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


# The most DataLoader workers worth suggesting, as %gpuenv suggests them
# (gpumagic.environment.checks.suggest_num_workers: each worker is a whole process).
MAX_SUGGESTED_WORKERS = 8


@dataclass(frozen=True)
class Facts:
    """What advice may fit itself to besides the evidence: the live session (how TF32 was
    set, the DDP options; ``None`` for a trace loaded from disk) and the machine the advice
    is for, so that a snippet runs there as written.

    ``cpus``: the CPUs this process may use (``os.sched_getaffinity``, not the machine's
    count: a container or ``taskset`` gives fewer); ``compute_capability``: the trace's
    GPU's; ``torch_version``: the installed torch's (major, minor), whose API the snippets
    use. None where unknown.
    """

    live: LiveState | None = None
    cpus: int | None = None
    compute_capability: tuple[int, int] | None = None
    torch_version: tuple[int, int] | None = None

    @classmethod
    def here(cls, live: LiveState | None, trace: Trace | None = None) -> Facts:
        """The facts of this process and machine, and of the GPU ``trace`` ran on."""
        caps = [d.compute_capability for d in (trace.devices if trace else []) if d.compute_capability]
        return cls(live, usable_cpus(), max(caps) if caps else None, installed_torch())

    @property
    def loader_workers(self) -> int:
        """DataLoader workers to suggest: one CPU stays with the training process, at most
        :data:`MAX_SUGGESTED_WORKERS` (``%gpuenv``'s rule; 4 where the CPUs are unknown)."""
        if self.cpus is None:
            return 4
        return 0 if self.cpus <= 1 else max(1, min(self.cpus - 1, MAX_SUGGESTED_WORKERS))

    def torch_at_least(self, major: int, minor: int) -> bool:
        """Whether the installed torch has the API of ``major.minor`` (True when unknown:
        the package needs torch 2.1 or newer, and most snippets fit any of them)."""
        return self.torch_version is None or self.torch_version >= (major, minor)

    @property
    def bf16(self) -> bool:
        """The GPU computes in bf16 on tensor cores (Ampere, compute capability 8.0, on;
        True when unknown)."""
        return self.compute_capability is None or self.compute_capability >= (8, 0)

    def grad_scaler(self) -> str:
        """The fp16 gradient scaler as the installed torch spells it (``torch.amp`` from 2.3;
        ``torch.cuda.amp.GradScaler`` warns there, and is all that older versions have)."""
        if self.torch_at_least(2, 3):
            return "torch.amp.GradScaler('cuda')"
        return "torch.cuda.amp.GradScaler()"


def usable_cpus() -> int | None:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        return os.cpu_count()


_TORCH_VERSION_FILE = re.compile(r"^__version__\s*=\s*['\"](\d+)\.(\d+)", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def installed_torch() -> tuple[int, int] | None:
    """The installed torch's (major, minor), torch not imported: from the ``version.py``
    every torch build writes beside its ``__init__``, else from its metadata. Reading the
    file spares `gpumagic analyze` importing importlib.metadata (with email and zipfile,
    20-30 ms of its CPU, issue 27) for the one snippet that depends on torch's version."""
    spec = importlib.util.find_spec("torch")  # locates the package, imports nothing
    if spec is None:
        return None
    text = ""
    if spec.origin is not None:
        try:
            text = Path(spec.origin).with_name("version.py").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    m = _TORCH_VERSION_FILE.search(text)
    if m is None:
        from importlib import metadata

        try:
            m = re.match(r"(\d+)\.(\d+)", metadata.version("torch"))
        except metadata.PackageNotFoundError:
            return None
    return (int(m.group(1)), int(m.group(2))) if m else None


class Context:
    """What the detections share: the analysis, the live state, per-step helpers."""

    def __init__(self, analysis: Analysis, live: LiveState | None) -> None:
        self.a = analysis
        self.trace = analysis.trace
        self.live = live
        self.facts = Facts.here(live, analysis.trace)
        self.steps = analysis.steps
        self.n_steps = max(len(self.steps), 1)
        self.step_us = analysis.breakdown.mean_step_us
        self.percent = dict(zip(CATEGORIES, analysis.breakdown.percent.tolist()))
        self.us = dict(zip(CATEGORIES, analysis.breakdown.mean_us.tolist()))
        self.has_gpu = analysis.trace.has_gpu
        self.rocm = any(v.startswith("hip") for v in analysis.trace.runtime.name.values)

    def host_in_steps(self, ts: np.ndarray) -> np.ndarray:
        """Mask over host times: inside the analysed steps (the analysis's window)."""
        lo, hi = self.a.window
        return (ts >= lo) & (ts <= hi)

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
    # the breakdown category whose time the finding's saving is, where there is one: a
    # comparison calls the finding fixed when that category's change lies beyond the noise
    category: str | None = None

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
