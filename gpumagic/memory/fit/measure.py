"""The same accounting on real tensors: a cell run for real in a namespace, counted by the
engine a dry run uses. What a prediction is checked against on the CPU (the tests, the
benchmark) until issue 16's exact accounting is the reference: the difference between the
two is then only what fake execution changes."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gpumagic.cell import PreparedCell, execute
from gpumagic.memory.fit.accounting import Accounting, AccountingScope, TensorAccounting
from gpumagic.memory.fit.storage_tracker import StorageTracker


class _Probe:
    def __init__(self) -> None:
        self.current = -1

    def enter(self, index: int) -> None:
        self.current = index


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
    engine: TensorAccounting | None = None,
) -> Accounting:
    """Run ``prepared`` for real in ``namespace`` (which it changes, as running the cell
    would) and return its accounting; the cell's exception propagates."""
    probe = _Probe()

    def run() -> object:
        ctx: Any = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ctx:
            return execute(_Namespace(namespace), prepared, probe)

    scope = AccountingScope(namespace, statement=lambda: probe.current, round_to=round_to)
    accounting, error = (engine or StorageTracker())(run, scope)
    if error is not None:
        raise error
    return accounting
