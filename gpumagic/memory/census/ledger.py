"""The running account of tensor bytes by category: pure Python, fed by
:mod:`gpumagic.memory.census.tracker` (real tensors for ``%%memtrace``, fake ones for a dry run).

Every storage the tracker sees is a :class:`Record`: its size, its category, the module that
made it and how it was made. The ledger keeps, at every instant, the bytes alive by category
and the highest total since the open statement began. A storage is classified when its
statement ends (:meth:`Ledger.settle`), with what is known by then: Adam's ``exp_avg`` is
optimizer state from the moment ``step()`` made it, a tensor the forward pass made and the
statement left unnamed is an activation, one made and freed inside the statement a
temporary. So that the moment of a statement's peak is told with those categories too, the
ledger logs the statement's allocations and frees and replays them up to the peak once the
categories are settled, as torch's ``_memory_profiler`` classifies after the fact and then
replays its timeline.

Costs: an allocation or a free is a few list operations; the replay runs once per statement
that rose above its start, over that statement's own events. A statement making more than
:data:`LOG_MAX` allocations (a whole training loop inside one call) folds its log: its
peak's categories are then those known at the time (:attr:`Settled.approximate`).

A ledger made with ``detail=True`` (``%%memfit``'s dry run, which wants its peak by module
for parameters and optimizer state too, not only activations) also keeps the storages
alive, and its replay names each storage alive at the peak with its category then
(:attr:`Settled.alive_at_peak`): one more dict operation per allocation and a copy of the
live set per statement, which ``%%memtrace`` does not pay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpumagic.memory.census.categories import ACTIVATIONS, NAMES, TEMPORARIES

__all__ = [
    "BACKWARD",
    "EARLIER",
    "FORWARD",
    "LOG_MAX",
    "OTHERWISE",
    "PENDING",
    "STEP",
    "EventLog",
    "Ledger",
    "Record",
    "Settled",
]

# How a storage came to be: its birth decides what an unnamed survivor is.
FORWARD = 0  # an op with grad mode on, outside backward() and the optimizer
BACKWARD = 1  # an op autograd's engine ran
STEP = 2  # an op inside optimizer.step()
OTHERWISE = 3  # grad mode off (no_grad, inference)
EARLIER = 4  # alive when tracking started

# Not yet classified: made in the open statement. Counted apart so that a statement's
# "after" never shows it, and reported as temporaries where a statement did not end (an
# error inside it).
PENDING = len(NAMES)
LOG_MAX = 1 << 20
# Events kept for a memory-visualiser export (each alloc and free, in order).
EVENTS_MAX = 1 << 18


class Record:
    """One storage: ``key`` its identity while it lives (the StorageImpl's address),
    ``nbytes`` what it holds (rounded as the device's allocator rounds), ``cat`` its
    category (or :data:`PENDING`), ``module`` the token of the module that made it (0: none),
    ``born`` how (:data:`FORWARD`...), ``serial`` the statement execution it was made in,
    ``statement`` that statement's index (-1: before the cell)."""

    __slots__ = ("alive", "born", "cat", "key", "module", "nbytes", "serial", "statement")

    def __init__(
        self, key: int, nbytes: int, cat: int, module: int, born: int, serial: int, statement: int
    ) -> None:
        self.key = key
        self.nbytes = nbytes
        self.cat = cat
        self.module = module
        self.born = born
        self.serial = serial
        self.statement = statement
        self.alive = True


@dataclass(frozen=True)
class Settled:
    """One statement execution, settled: bytes by category after it (``after``, one per
    category), its highest total (``peak``), the categories and the activations by module
    token at that moment (None when it never rose above its start)."""

    after: tuple[int, ...]
    peak: int
    at_peak: tuple[int, ...] | None
    modules_at_peak: dict[int, int] | None
    approximate: bool = False
    # with a detailed ledger: (record, its category then, its bytes) for every storage alive
    # at the peak, adding up to ``at_peak``; None otherwise (and after a fold)
    alive_at_peak: tuple[tuple[Record, int, int], ...] | None = None


class EventLog:
    """Allocations and frees in order, for a memory-visualiser export (and ``%%memfit``'s
    model of CUDA's caching allocator): ``records`` and ``signs`` (+1, -1), at most
    ``limit`` (:data:`EVENTS_MAX`), then ``dropped`` counts the rest. Parallel lists rather
    than a tuple per event: each tuple would be one more object for the garbage collector
    to visit, in a cell that makes thousands."""

    def __init__(self, limit: int = EVENTS_MAX) -> None:
        self.records: list[Record] = []
        self.signs: list[int] = []
        self.dropped = 0
        self.limit = limit

    def add(self, rec: Record, sign: int) -> None:
        if len(self.signs) < self.limit:
            self.records.append(rec)
            self.signs.append(sign)
        else:
            self.dropped += 1


class Ledger:
    """Bytes alive by category, the open statement's peak, and its log (module docstring)."""

    def __init__(self, events: EventLog | None = None, *, detail: bool = False) -> None:
        self.totals = [0] * (PENDING + 1)
        self.current = 0
        self.peak = 0
        self.by_module: dict[int, int] = {}  # activations alive, by module token
        self.serial = 0  # the open statement execution
        self.statement = -1  # its index (-1: none yet)
        self.fresh: list[Record] = []  # records made since the open statement began
        self.events = events
        # the open statement's log: record, signed bytes, its category then (parallel lists,
        # for the same reason as EventLog's)
        self._log: list[Record] = []
        self._log_n: list[int] = []
        self._log_cat: list[int] = []
        self._peak_at = -1  # log length at the open statement's highest point
        self._start = list(self.totals)
        self._start_modules: dict[int, int] = {}
        self._folded: tuple[int, tuple[int, ...], dict[int, int]] | None = None
        self._quiet: Settled | None = None  # what a statement that did nothing settles to
        # detail=True: the storages alive (insertion-ordered set), and at the open
        # statement's start with their categories then
        self._alive: dict[Record, None] | None = {} if detail else None
        self._start_alive: dict[Record, int] = {}

    # -- what the tracker reports --------------------------------------------------------------
    def add(self, rec: Record) -> None:
        """A storage made now (or found alive at the start: then before any statement)."""
        n = rec.nbytes
        self.totals[rec.cat] += n
        if rec.cat == ACTIVATIONS:
            self.by_module[rec.module] = self.by_module.get(rec.module, 0) + n
        self.current += n
        self._log.append(rec)
        self._log_n.append(n)
        self._log_cat.append(rec.cat)
        if rec.serial == self.serial and rec.born != EARLIER:
            self.fresh.append(rec)
        if self.events is not None:
            self.events.add(rec, 1)
        if self._alive is not None:
            self._alive[rec] = None
        if self.current > self.peak:
            self.peak = self.current
            self._peak_at = len(self._log)
            if len(self._log) > LOG_MAX:
                self._fold()

    def drop(self, rec: Record, by_backward: bool) -> None:
        """A storage freed; ``by_backward``: autograd's engine freed it (a graph let go)."""
        if not rec.alive:
            return
        rec.alive = False
        n = rec.nbytes
        cat = rec.cat
        self.totals[cat] -= n
        if cat == ACTIVATIONS:
            self._unmodule(rec.module, n)
        self.current -= n
        self._log.append(rec)
        self._log_n.append(-n)
        self._log_cat.append(cat)
        if self.events is not None:
            self.events.add(rec, -1)
        if self._alive is not None:
            self._alive.pop(rec, None)
        if cat == PENDING:
            # Its category for the replay: a forward pass's tensor that backward() let go was
            # held for it (an activation); anything else lived and died in its statement.
            rec.cat = ACTIVATIONS if by_backward and rec.born == FORWARD else TEMPORARIES

    def move(self, rec: Record, cat: int) -> None:
        """Classify ``rec`` as ``cat`` from now on."""
        old = rec.cat
        if old == cat:
            return
        if rec.alive:
            n = rec.nbytes
            self.totals[old] -= n
            self.totals[cat] += n
            if old == ACTIVATIONS:
                self._unmodule(rec.module, n)
            if cat == ACTIVATIONS:
                self.by_module[rec.module] = self.by_module.get(rec.module, 0) + n
            if rec.serial != self.serial:
                # made before this statement: the replay must see the move where it happened
                self._log += (rec, rec)
                self._log_n += (-n, n)
                self._log_cat += (old, cat)
        rec.cat = cat

    def _unmodule(self, module: int, n: int) -> None:
        left = self.by_module.get(module, 0) - n
        if left:
            self.by_module[module] = left
        else:
            self.by_module.pop(module, None)

    # -- statement boundaries --------------------------------------------------------------------
    def after(self) -> tuple[int, ...]:
        """Bytes alive by category now; made-but-unclassified storages count as temporaries."""
        out = list(self.totals[:PENDING])
        out[TEMPORARIES] += self.totals[PENDING]
        return tuple(out)

    def settle(self, classify: Callable[[list[Record]], None], statement: int) -> Settled:
        """End the open statement: classify its surviving storages (``classify`` calls
        :meth:`move` on each), replay its log to its peak, and open ``statement``."""
        quiet = self.settle_quiet(statement)
        if quiet is not None:
            return quiet
        survivors = [r for r in self.fresh if r.alive and r.cat == PENDING]
        if survivors:
            classify(survivors)
        at_peak: tuple[int, ...] | None = None
        modules: dict[int, int] | None = None
        alive: tuple[tuple[Record, int, int], ...] | None = None
        approximate = False
        if self._peak_at > 0:
            at_peak, modules = self._replay(self._peak_at)
            if self._alive is not None:
                alive = self._replay_records(self._peak_at)
        elif self._folded is not None:
            _, at_peak, modules = self._folded
            approximate = True
        settled = Settled(self.after(), self.peak, at_peak, modules, approximate, alive)
        self.begin(statement)
        self._quiet = Settled(settled.after, self.current, None, None)
        return settled

    def settle_quiet(self, statement: int) -> Settled | None:
        """:meth:`settle` when nothing was made, freed or moved since the last settlement (the
        common case in a loop of plain Python): the statement ended where it began, so that
        settlement's numbers stand, and ``statement`` opens. None, and nothing done, otherwise.
        The same object comes back until something happens: a caller may keep what it
        derives from it."""
        if self._log or self._folded is not None or self._quiet is None:
            return None
        self.serial += 1
        self.statement = statement
        self.peak = self.current
        return self._quiet

    def begin(self, statement: int) -> None:
        """Open a statement execution: its peak starts at the current total."""
        self._quiet = None
        self.serial += 1
        self.statement = statement
        self.fresh = []
        self._log, self._log_n, self._log_cat = [], [], []
        self._peak_at = -1
        self._folded = None
        self._start = list(self.totals)
        self._start_modules = dict(self.by_module)
        if self._alive is not None:
            self._start_alive = {r: r.cat for r in self._alive}
        self.peak = self.current

    def _replay(self, upto: int) -> tuple[tuple[int, ...], dict[int, int]]:
        sums = list(self._start)
        modules = dict(self._start_modules)
        serial = self.serial
        for rec, n, then in zip(self._log[:upto], self._log_n[:upto], self._log_cat[:upto]):
            # made in this statement: counted under what it turned out to be
            cat = rec.cat if rec.serial == serial else then
            sums[cat] += n
            if cat == ACTIVATIONS:
                modules[rec.module] = modules.get(rec.module, 0) + n
        sums[TEMPORARIES] += sums[PENDING]
        return tuple(sums[:PENDING]), {k: v for k, v in modules.items() if v > 0}

    def alive_now(self) -> tuple[tuple[Record, int, int], ...] | None:
        """With ``detail``: every storage alive now, with its category and bytes."""
        if self._alive is None:
            return None
        return tuple((r, TEMPORARIES if r.cat == PENDING else r.cat, r.nbytes) for r in self._alive)

    def _replay_records(self, upto: int) -> tuple[tuple[Record, int, int], ...]:
        """The storages alive at the log's position ``upto``, each with its category then
        (by the same rule as :meth:`_replay`, so they add up to its sums) and its bytes."""
        alive = {r: (c, r.nbytes) for r, c in self._start_alive.items()}
        serial = self.serial
        for rec, n, then in zip(self._log[:upto], self._log_n[:upto], self._log_cat[:upto]):
            if n < 0:
                alive.pop(rec, None)
            else:
                cat = rec.cat if rec.serial == serial else then
                alive[rec] = (TEMPORARIES if cat == PENDING else cat, n)
        return tuple((r, c, n) for r, (c, n) in alive.items())

    def _fold(self) -> None:
        """A statement with too many events: keep its peak's breakdown as known now and
        start its log again from here (see the module docstring)."""
        at_peak, modules = self._replay(self._peak_at)
        self._folded = (self.peak, at_peak, modules)
        # What was made before the fold is counted from here on as made earlier (under the
        # category it had then), so the replay of the rest stays consistent.
        self.serial += 1
        self._log, self._log_n, self._log_cat = [], [], []
        self._peak_at = -1
        self._start = list(self.totals)
        self._start_modules = dict(self.by_module)
        self.fresh = [r for r in self.fresh if r.alive]
