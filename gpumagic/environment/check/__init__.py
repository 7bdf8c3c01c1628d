"""``%gpucheck``'s core: each card judged against its defaults and its specification, the
host's figures, and what to fix, ranked (issue 29).

The room, read downward:

- ``readings``: what NVML says about each card now (clocks and the clock-event reasons,
  power limits, the PCIe link, temperature, persistence, compute and MIG modes, ECC); NVML
  alone, no torch. :func:`gpumagic.clock_events.read_clock_events` reads and names the
  reasons for anyone else (``%gpuwatch``).
- ``measurements``: short timed runs (matmul in FP32/TF32/BF16/FP16, memory copy, host to
  device and back, kernel launch; on the CPU matmul and memory copy), each beside the card
  table's figure (:mod:`gpumagic.cards`) with its source.
- ``facts``: what the rules read; ``findings`` the cards' rules, ``judge`` the host's and the
  ranking; ``result`` :class:`GpuCheck`; ``run`` one check from start to end.

:func:`gpucheck` runs one and keeps it as the session's last check, which
``%gpuenv --save`` writes beside the environment report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumagic.environment.check.result import GpuCheck

__all__ = ["gpucheck", "last_check"]

_last: list[GpuCheck] = []


def gpucheck(measure: bool = True, devices: list[int] | None = None, seconds: float = 0.3) -> GpuCheck:
    """Check this machine: each visible card's readings against its defaults, short
    measurements against its specification (``measure=False``: readings only), the host's
    figures, and the findings, ranked. ``devices``: the CUDA indexes to check (default all
    visible); ``seconds``: how long each figure is measured. The result is also kept as this
    session's last check (:func:`last_check`)."""
    from gpumagic.environment.check.run import run_check

    result = run_check(measure=measure, devices=devices, seconds=seconds)
    _last[:] = [result]
    return result


def last_check() -> GpuCheck | None:
    """The last check this process ran, None before the first."""
    return _last[0] if _last else None
