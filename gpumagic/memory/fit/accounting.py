"""What a dry run needs from a tensor-accounting engine, said once as a narrow interface.

``%%memfit`` runs a cell on fake tensors and asks one question of the accounting: *run this
callable; tell me the peak, what was alive at the peak by category and by module, and which
statement was running then.* :class:`TensorAccounting` is that question; :class:`Accounting`
its answer. The engine behind it (today :class:`~.storage_tracker.StorageTracker`) may count
real tensors or fake ones alike: a storage is a storage.

The categories are the out-of-memory chapter's: parameters (buffers included), gradients,
optimizer state, activations (tensors autograd saved for backward), temporaries (everything
else the cell's operations made) and inputs (tensors the cell was given or made from data
outside any model: the batch, the labels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
TEMPORARIES = "temporaries"
INPUTS = "inputs"
# In the order a report lists them; the same names are the keys of Accounting.categories.
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, TEMPORARIES, INPUTS)


@dataclass
class AccountingScope:
    """What the engine is told about the run.

    ``namespace``: the names the cell sees, so that parameters, gradients and optimizer
    state are recognised and modules are named as the namespace names them
    (``model.layer1.0.conv1``). ``statement``: the index of the statement running now (-1
    before the first). ``round_to``: the allocation granularity every storage is rounded up
    to (512 bytes for CUDA's caching allocator, 1 for the exact bytes). ``device_of``: the
    device label of a tensor as the run should count it (a dry run without a GPU labels the
    tensors a GPU run would hold "cuda" although they are fake CPU tensors); ``counted``: the
    labels whose storages count, chosen after the run from the labels seen.
    """

    namespace: Mapping[str, object]
    statement: Callable[[], int] = lambda: -1
    round_to: int = 1
    device_of: Callable[[Any], object] | None = None  # a label: str() gives its name when the run ends
    counted: Callable[[set[str]], set[str]] = lambda seen: seen


@dataclass
class Accounting:
    """The answer: bytes at the peak, in total, by category and by module.

    ``modules``: (module, category, bytes) for what was alive at the peak, the module named
    as the namespace names it ("" for tensors no module made or owns). ``peak_statement``:
    the index of the statement running when the peak was reached (-1: before the cell, when
    the peak is what the cell was given). ``start_bytes`` / ``end_bytes``: counted bytes
    alive before the first statement and after the last. ``devices``: the device labels
    whose tensors were counted.
    """

    peak_bytes: int
    categories: dict[str, int]
    modules: list[tuple[str, str, int]]
    peak_statement: int
    start_bytes: int
    end_bytes: int
    devices: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    # The counted allocations in order, (storage key, +bytes) and (key, -bytes), for the
    # caching allocator's model; None when the engine does not keep them.
    trace: list[tuple[int, int]] | None = None
    ops: dict[str, int] = field(default_factory=dict)


class TensorAccounting(Protocol):
    """An engine that runs ``fn`` under accounting. Returns the accounting and the exception
    ``fn`` raised (None when it returned): a partial accounting is still an answer. An
    interrupt (``BaseException`` that is no ``Exception``) propagates once the engine's hooks
    are removed."""

    def __call__(
        self, fn: Callable[[], object], scope: AccountingScope
    ) -> tuple[Accounting, Exception | None]: ...
