"""The line an out-of-memory report ends with: the ``%%memfit`` command that answers "what
would fit" (a dry run: nothing allocated, no GPU needed).

The one place ``%%memtrace`` uses ``%%memfit`` (the import contract in ``pyproject.toml``
names it): the line is ``%%memfit``'s own knowledge, its options, its card table and which
variable is a batch size (:mod:`gpumagic.memory.fit.suggest`), so the report asks for it and
for nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpumagic.device_kinds import HOST
from gpumagic.memory.fit.suggest import oom_memfit_line
from gpumagic.memory.trace.device import loaded_torch
from gpumagic.memory.trace.oom.model import OomReport

__all__ = ["memfit_next"]


def memfit_next(report: OomReport, sources: Sequence[str], namespace: Mapping[str, Any]) -> str:
    """The ``%%memfit`` line for ``report``'s cell (its statements' ``sources``): the card
    that ran out and the batch-size variable the cell reads (see
    :func:`gpumagic.memory.fit.suggest.oom_memfit_line`)."""
    torch = loaded_torch()
    try:
        gpu_here = bool(torch is not None and torch.cuda.is_available())
        return oom_memfit_line(
            cuda=report.device != HOST,
            device=report.device,
            total=report.total,
            sources=sources,
            namespace=namespace,
            gpu_here=gpu_here,
        )
    except Exception:  # a next step is no reason to lose the report (a user's odd namespace)
        return ""
