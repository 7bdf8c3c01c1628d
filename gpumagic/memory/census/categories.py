"""Where tensor memory goes: the categories every ``%%memtrace`` row, chart and peak uses.

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
    "CATEGORIES",
    "COLUMNS",
    "DESCRIPTIONS",
    "GRADIENTS",
    "INPUTS",
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

# Names in the order reports list them (model state first, then what a step makes).
CATEGORIES: Final = (
    "parameters",
    "gradients",
    "optimizer state",
    "activations",
    "temporaries",
    "inputs",
    "other",
)
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
