"""The tensor census: the engine both memory magics run on. Every storage an op makes on one
device, from its allocation to its free, by category and by the module that made it; the
same code counts real tensors (``%%memtrace``, :mod:`gpumagic.memory.trace`) and
``FakeTensorMode``'s (``%%memfit``'s dry run, :mod:`gpumagic.memory.fit`).

* :mod:`.categories` - where tensor memory goes: parameters, gradients, optimizer state,
  activations, temporaries, inputs, other; one number each, and every spelling of it;
* :mod:`.ledger` - the running account (:class:`~.ledger.Ledger`): bytes alive by category,
  each statement's peak replayed with the categories settled at its end
  (:class:`~.ledger.Settled`), the allocations and frees in order (:class:`~.ledger.EventLog`);
* :mod:`.holdings` - what a tensor holds that a census counts (a sparse tensor's indices and
  values, what a wrapper wraps; nothing for a fake tensor in a real census), and why the rest
  cannot be counted: one definition for the start-up scan and the per-op path;
* :mod:`.dispatch` - the dispatch mode that sees each op's outputs, and what keeps the cell
  as it would be without it;
* :mod:`.reach` - what the census reaches of the user's namespace (read by
  :mod:`gpumagic.namespace`'s rules), of an optimizer's state and of autograd's graphs;
* :mod:`.tracker` - :class:`~.tracker.TensorTracker`, the census itself: ``start`` (what is
  alive, then the mode and the optimizer hooks), ``settle`` at each statement boundary,
  ``stop``, ``close``;
* :mod:`.viz` - its events as a snapshot for PyTorch's memory visualiser.

How a user runs it: through a magic. How a core runs it: make a ``TensorTracker`` over a
namespace with a ``keep`` predicate (which tensors count), ``start()`` it, call
``settle(i)`` as statement ``i`` begins, ``stop()`` and read the ledger. Importing this
package loads nothing heavy (torch is imported by the modules that need it).
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "TensorTracker": ("gpumagic.memory.census.tracker", "TensorTracker"),
    "CUDA_ROUNDING": ("gpumagic.memory.census.tracker", "CUDA_ROUNDING"),
    "on_cpu": ("gpumagic.memory.census.tracker", "on_cpu"),
    "Ledger": ("gpumagic.memory.census.ledger", "Ledger"),
    "Settled": ("gpumagic.memory.census.ledger", "Settled"),
    "EventLog": ("gpumagic.memory.census.ledger", "EventLog"),
    "Record": ("gpumagic.memory.census.ledger", "Record"),
    "KEYS": ("gpumagic.memory.census.categories", "KEYS"),
    "NAMES": ("gpumagic.memory.census.categories", "NAMES"),
    "COLUMNS": ("gpumagic.memory.census.categories", "COLUMNS"),
    "memory_viz_snapshot": ("gpumagic.memory.census.viz", "memory_viz_snapshot"),
    "write_memory_viz": ("gpumagic.memory.census.viz", "write_memory_viz"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
