"""The reference a dry run's prediction is checked against on the CPU: the cell run for real in
a namespace (which it changes, as running the cell would), counted by issue 16's tensor census
through the same :func:`~gpumagic.memory.fit.accounting.account` a dry run uses (exact bytes on
the CPU; ``test_counts_with_census.py`` checks it against ``%%memtrace``'s own peak). The
difference between the two is only what fake execution and CUDA's 512-byte rounding change.
The cells are scripts' strings, prepared with plain Python's compiler, no shell."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gpumagic.cell import PreparedCell, Probe, PythonCompiler, execute, prepare
from gpumagic.memory.fit.accounting import Accounting, AccountingScope, account


def prepare_source(source: str) -> PreparedCell:
    """``source`` compiled and instrumented as a script's cell whose first line is line 1."""
    return prepare(PythonCompiler(), source, None, instrument=True)


def measure(
    prepared: PreparedCell,
    namespace: dict[str, Any],
    *,
    autocast: torch.dtype | None = None,
    round_to: int = 1,
) -> Accounting:
    """Run ``prepared`` for real in ``namespace`` and return the census's accounting of the
    CPU's tensors; the cell's exception propagates."""

    def run(probe: Probe) -> object:
        ctx: Any = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ctx:
            return execute(namespace, prepared, probe)

    accounting, error = account(run, AccountingScope(namespace, rounding=round_to))
    if error is not None:
        raise error
    return accounting
