"""The measured exact peak: a cell run for real in a namespace, counted by issue 16's tensor
census (the accounting ``%%memtrace`` reports, exact bytes on the CPU), through the same
:func:`~.accounting.account` a dry run uses. What a prediction is checked against on the CPU
(the tests, the benchmark): the difference between the two is only what fake execution and
CUDA's 512-byte rounding change."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gpumagic.cell import PreparedCell, Probe, execute
from gpumagic.memory.fit.accounting import Accounting, AccountingScope, account


class _Namespace:
    def __init__(self, ns: dict[str, Any]) -> None:
        self.user_global_ns = ns
        self.user_ns = ns


def measure(
    prepared: PreparedCell,
    namespace: dict[str, Any],
    *,
    autocast: torch.dtype | None = None,
    round_to: int = 1,
) -> Accounting:
    """Run ``prepared`` for real in ``namespace`` (which it changes, as running the cell
    would) and return the census's accounting of the CPU's tensors; the cell's exception
    propagates."""

    def run(probe: Probe) -> object:
        ctx: Any = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ctx:
            return execute(_Namespace(namespace), prepared, probe)

    accounting, error = account(run, AccountingScope(namespace, rounding=round_to))
    if error is not None:
        raise error
    return accounting
