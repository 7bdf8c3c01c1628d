"""Where tensor memory goes: the one vocabulary of categories every row, chart, peak and
prediction of ``%%memtrace`` and ``%%memfit`` uses.

Each category is a number (:data:`PARAMETERS`... :data:`OTHER`: the census's ledger counts
by it, and tuples of bytes are in its order) and has four spellings, each in one tuple
indexed by that number: :data:`KEYS`, an identifier (a key of ``MemFit.categories``, the
stem of a what-if column: ``optimizer_state``); :data:`NAMES`, as a report writes it
(``optimizer state``, the ``category`` of ``MemTrace.timeline``); :data:`SHORT`, a table's
header (``optimizer``); :data:`COLUMNS`, a ``MemTrace.lines`` column
(``optimizer_bytes``); and :data:`DESCRIPTIONS`, one line on what it holds.

The seed's out-of-memory chapter names them, and torch's own ``_memory_profiler`` classifies
allocations the same way (PARAMETER, GRADIENT, OPTIMIZER_STATE, ACTIVATION, TEMPORARY, INPUT).
Each live tensor storage is in exactly one category at any moment, so the categories add up
to the tensor bytes alive; "other" makes them add up to the allocator's total on CUDA.

How a storage is classified (:mod:`gpumagic.memory.census.tracker` does it, the first rule that
holds wins):

* parameters: a parameter or buffer of an ``nn.Module`` the namespace names or the cell
  calls, or a parameter an optimizer updates;
* gradients: the ``.grad`` of one of those parameters, or of a tensor the namespace names;
* optimizer state: a tensor in an optimizer's ``state`` (Adam's ``exp_avg``...), from the
  ``step()`` that creates it on;
* inputs: a tensor the namespace names (a variable, or an element of a small list, tuple or
  dict): the data, the outputs, the loss;
* activations: a tensor made in a forward pass (grad mode on, outside ``backward()`` and the
  optimizer) that outlives its statement without a name (autograd's graph holds it for the
  backward pass), or that ``backward()`` frees;
* temporaries: a tensor that lives and dies inside one statement, and was no activation;
* other: the rest (a tensor kept where no name reaches: an object's attribute, a long list);
  on CUDA also the allocator's bytes no tensor accounts for (library workspaces, tensors from
  before the cell that nothing names).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACTIVATIONS",
    "COLUMNS",
    "DESCRIPTIONS",
    "GRADIENTS",
    "INPUTS",
    "KEYS",
    "NAMES",
    "NAME_OF_KEY",
    "OPTIMIZER",
    "OTHER",
    "PARAMETERS",
    "SHORT",
    "TEMPORARIES",
]

PARAMETERS: Final = 0
GRADIENTS: Final = 1
OPTIMIZER: Final = 2
ACTIVATIONS: Final = 3
TEMPORARIES: Final = 4
INPUTS: Final = 5
OTHER: Final = 6

# In the order reports list them (model state first, then what a step makes).
KEYS: Final = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "inputs",
    "other",
)
NAMES: Final = tuple(key.replace("_", " ") for key in KEYS)
# Column headers of the per-statement table.
SHORT: Final = ("params", "grads", "optimizer", "activations", "temporaries", "inputs", "other")
# ``MemTrace.lines`` columns, one per category (issue 16 names them).
COLUMNS: Final = tuple(f"{s}_bytes" for s in SHORT)
DESCRIPTIONS: Final = (
    "parameters and buffers of the models the namespace names or the cell calls",
    "the parameters' .grad",
    "tensors in an optimizer's state (created by its first step())",
    "tensors a forward pass made that autograd keeps for backward()",
    "tensors made and freed inside one statement",
    "tensors your variables name: the data, outputs, losses",
    "tensors nothing names (an attribute, a long list); on CUDA, allocator bytes no tensor accounts for",
)
# A key as a report writes it ("optimizer_state" -> "optimizer state").
NAME_OF_KEY: Final = dict(zip(KEYS, NAMES))
