"""A dry run counted by issue 16's tensor census (:mod:`gpumagic.memory.census.tracker`), the engine
``%%memtrace`` counts with, and its answer in ``%%memfit``'s terms.

``%%memfit`` asks one question of the accounting: *run this cell; tell me the peak, what
was alive at the peak by category and by module, and which statement was running then.*
:func:`account` runs a callable under a :class:`~gpumagic.memory.census.tracker.TensorTracker`,
settling the census at each statement boundary (it is the probe the instrumented cell
calls), and keeps the highest moment; :class:`Accounting` is the answer. The census runs
alike on real tensors (:mod:`.measure`, the reference a prediction is checked against) and
on ``FakeTensorMode``'s (:mod:`.dry_run`).

What a dry run gives the census beyond ``%%memtrace``'s settings: its shadow namespace (so
parameters, gradients and optimizer state are told by what owns them, and modules named as
the user names them), the models and tensors that namespace holds deeper than the census
looks (:mod:`.deeper`), which tensors count (``keep``: without a GPU, those labelled CUDA
once the cell puts any there), CUDA's 512-byte rounding, and a ledger that keeps detail:
each storage alive at the peak with its category then, so parameters, gradients and
optimizer state are given by module as well as activations, and the ordered allocations
for the model of CUDA's caching allocator.

The categories are the census's (:mod:`gpumagic.memory.census.categories`) under ``%%memfit``'s
keys; the census's "other" (tensors nothing names: an object's attribute, a long list) is
split by birth: what the cell was given counts as inputs, what it made as temporaries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumagic.cell import Probe
from gpumagic.memory.census.categories import INPUTS, KEYS, OPTIMIZER, OTHER, TEMPORARIES
from gpumagic.memory.census.ledger import EARLIER, EventLog, Ledger, Record, Settled
from gpumagic.memory.census.reach import tensors_in
from gpumagic.memory.census.tracker import TensorTracker, on_cpu
from gpumagic.memory.fit.deeper import deeper
from gpumagic.namespace import own_tensors, submodules

# The census's categories as %%memfit reports them (the keys of Accounting.categories, in
# the census's order): all but "other", which a dry run splits by birth (_key).
FIT_KEYS = tuple(key for cat, key in enumerate(KEYS) if cat != OTHER)
# Allocations and frees kept for the allocator's model: far beyond a training step's
# thousands; past it the model sees a prefix and says so.
TRACE_MAX = 1 << 22


@dataclass
class AccountingScope:
    """What the census is told about the run.

    ``namespace``: the names the cell runs in. ``keep``: which tensors count (the census's
    predicate; the CPU's by default). ``rounding``: the allocation granularity every storage
    is rounded up to (512 bytes for CUDA's caching allocator, 1 for the exact bytes).
    ``tensor_type``: the tensors counted (``FakeTensor`` in a dry run). ``probe``: the
    caller's own probe, called after each boundary is settled (a dry run's clock).
    ``device``: what the counted tensors stand for ("cuda", "cpu"), for the report.
    """

    namespace: Mapping[str, Any]
    keep: Callable[[Any], bool] = on_cpu
    rounding: int = 1
    tensor_type: type | None = None
    probe: Probe | None = None
    device: str = "cpu"


@dataclass
class Accounting:
    """The answer: bytes at the peak, in total, by category and by module.

    ``modules``: (module, category, bytes) for what was alive at the peak, the module named
    as the namespace names it ("" for tensors no module made or owns). ``peak_statement``:
    the index of the statement running when the peak was reached (-1: before the cell, when
    the peak is what the cell was given). ``start_bytes`` / ``end_bytes``: counted bytes
    alive before the first statement and after the last. ``devices``: what the counted
    tensors stand for. ``trace``: the counted allocations in order, (storage, +bytes) and
    (storage, -bytes), for the caching allocator's model. ``ops``: the aten operations run.
    """

    peak_bytes: int
    categories: dict[str, int]
    modules: list[tuple[str, str, int]]
    peak_statement: int
    start_bytes: int
    end_bytes: int
    devices: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    trace: list[tuple[int, int]] | None = None
    ops: set[str] = field(default_factory=set)


def account(fn: Callable[[CensusProbe], object], scope: AccountingScope) -> tuple[Accounting, Exception | None]:
    """Run ``fn(probe)`` under the census (``fn`` runs the cell with ``probe`` as its
    statements' probe). Returns the accounting and the exception ``fn`` raised (None when it
    returned): a partial accounting is still an answer. An interrupt (a ``BaseException``
    that is no ``Exception``) propagates once the census's mode and hooks are removed."""
    found = deeper(scope.namespace)
    census = TensorTracker(
        scope.namespace,
        scope.keep,
        rounding=scope.rounding,
        tensor_type=scope.tensor_type,
        models=found.models,
        ledger=Ledger(EventLog(TRACE_MAX), detail=True),
    )
    run = CensusProbe(census, scope.probe)
    error: Exception | None = None
    try:
        census.start(also=[(t, OTHER) for t in found.tensors])
        run.start()
        try:
            fn(run)
        except Exception as exc:  # the cell's error: the accounting so far still answers
            error = exc
        run.stop()
        census.stop()
        return run.result(scope.device), error
    finally:
        census.close()  # stops it too, whatever stopped the run


class CensusProbe:
    """The probe: settles the census at each statement boundary and keeps the highest
    moment, with what was alive then and who owned it. Its lifecycle is the tracer's
    (:class:`gpumagic.memory.trace.tracer.MemoryTracer`) in the words of
    :class:`gpumagic.cell.MeasuredRun`: ``start``, ``enter`` at each statement, ``stop``;
    :meth:`result` is the answer."""

    def __init__(self, census: TensorTracker, inner: Probe | None) -> None:
        self.census = census
        self.inner = inner
        self.open = -1
        self.started = False
        self.start_bytes = 0
        self.peak = -1
        self.peak_statement = -1
        self.at_peak: tuple[int, ...] = ()
        self.alive: tuple[tuple[Record, int, int], ...] | None = None
        self.owners: dict[int, str] = {}

    def start(self) -> None:
        """What the cell was given: the first moment, before its first statement."""
        self._took(self.census.settle(-1))

    def enter(self, index: int) -> None:
        self._took(self.census.settle(index))
        self.open = index
        if self.inner is not None:
            self.inner.enter(index)

    def stop(self) -> None:
        """The cell ended: its last statement settled."""
        self._took(self.census.settle(-1))
        self.open = -1

    def _took(self, settled: Settled) -> None:
        """A statement ended (``self.open``; -1: what the cell was given, settled at the
        first boundary)."""
        if not self.started:
            self.started = True
            self.start_bytes = sum(settled.after)
            self._new_peak(settled.peak, settled.after, self.census.ledger.alive_now())
        elif settled.peak > self.peak:
            cats = settled.at_peak if settled.at_peak is not None else settled.after
            self._new_peak(settled.peak, cats, settled.alive_at_peak)

    def _new_peak(self, peak: int, cats: tuple[int, ...], alive: tuple[tuple[Record, int, int], ...] | None) -> None:
        self.peak = peak
        self.peak_statement = self.open
        self.at_peak = cats
        self.alive = alive
        # who owns the parameters, gradients and optimizer state alive now (their storages
        # are the keys while they live)
        try:
            self.owners = owners(self.census)
        except Exception:  # a user's model that cannot be walked: its rows go unnamed
            self.owners = {}

    def result(self, device: str) -> Accounting:
        census = self.census
        categories = dict.fromkeys(FIT_KEYS, 0)
        by_module: dict[tuple[str, str], int] = {}
        if self.alive is not None:
            names = census.module_names()
            for rec, cat, n in self.alive:
                if n <= 0:
                    continue
                key = _key(cat, rec)
                categories[key] += n
                module = self.owners.get(rec.key, "") if cat <= OPTIMIZER else ""
                if rec.module:
                    module = names.get(rec.module, "")
                by_module[(module, key)] = by_module.get((module, key), 0) + n
        else:  # a statement too long to replay: its categories as known at the time
            for cat, n in enumerate(self.at_peak):
                key = _key(cat, None)
                categories[key] += n
                by_module[("", key)] = by_module.get(("", key), 0) + n
        modules = sorted(((m, c, b) for (m, c), b in by_module.items() if b > 0), key=lambda r: -r[2])
        events = census.ledger.events
        trace = None
        if events is not None:
            trace = [(id(rec), sign * rec.nbytes) for rec, sign in zip(events.records, events.signs)]
        return Accounting(
            peak_bytes=max(self.peak, 0),
            categories=categories,
            modules=modules,
            peak_statement=self.peak_statement,
            start_bytes=self.start_bytes,
            end_bytes=census.ledger.current,
            devices={device},
            notes=_notes(census),
            trace=trace,
            ops=set(census.ops),
        )


def _key(cat: int, rec: Record | None) -> str:
    """A census category as %%memfit's key: "other" (tensors nothing names) is what the cell
    was given (inputs) when it was alive before the cell, else what it made (temporaries;
    also where the record is not known, a statement too long to replay)."""
    if cat == OTHER:
        return KEYS[INPUTS] if rec is not None and rec.born == EARLIER else KEYS[TEMPORARIES]
    return KEYS[cat]


def owners(census: TensorTracker) -> dict[int, str]:
    """Storage key -> the module that owns it, for the parameters, buffers, gradients and
    optimizer state of the models and optimizers the census counts (read by the namespace's
    rules: a model's tables, not its methods)."""
    out: dict[int, str] = {}
    param_owner: dict[int, str] = {}
    modules, optimizers = census.reached_models(with_names=True)
    for name, model in modules:
        for sub, m in submodules(model):
            owner = f"{name}.{sub}" if sub else name
            for _, _, t in own_tensors(m):
                param_owner.setdefault(id(t), owner)
                out.setdefault(t.untyped_storage()._cdata, owner)
                if t.is_leaf and t.grad is not None:
                    out.setdefault(t.grad.untyped_storage()._cdata, owner)
    for _, opt in optimizers:
        for p, state in list(opt.state.items()):
            owner = param_owner.get(id(p), "")
            for value in tensors_in(state):
                out.setdefault(value.untyped_storage()._cdata, owner)
    return out


def _notes(census: TensorTracker) -> list[str]:
    notes = [
        f"the tensor census stopped: its own code failed ({error}); the figures after that "
        "point are incomplete"
        for error in census.errors
    ]
    if census.unseen:
        notes.append(
            f"{census.unseen} operation(s) wrote into tensors made where the census could not "
            "see them: they are not counted"
        )
    events = census.ledger.events
    if events is not None and events.dropped:
        notes.append(
            f"the caching allocator's model saw the first {len(events.signs):,} allocations "
            f"and frees of {len(events.signs) + events.dropped:,}: its fragmentation is a lower bound"
        )
    return notes


__all__ = ["FIT_KEYS", "Accounting", "AccountingScope", "CensusProbe", "account", "owners"]
