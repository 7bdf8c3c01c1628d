"""A source of samples: what the one :class:`~gpumagic.monitor.watcher.Watcher` reads.

The watcher owns the lifecycle: the thread, the ring of samples, the cell marks, the CSV,
the alerts seen, the meter and the subscribers. A source owns what is particular to where
its numbers come from: the rows it fills (its devices), how it reads them, what a sample of
them adds to a cell's record, the alerts they raise, what they tell the meter, and why
anything is missing. This machine is two sources, its GPUs through NVML
(:mod:`gpumagic.monitor.nvml_source`) and the host through psutil
(:mod:`gpumagic.monitor.host`); a job's GPUs through Prometheus are a third
(:mod:`gpumagic.monitor.job`). The sources of one watcher fill one
:class:`~gpumagic.monitor.snapshot.Layout` (the same columns), each its own rows, in order.

A new source implements :class:`Source`: ``layout``, ``devices`` and ``read`` say what it
is; :class:`SourceBase` gives the rest defaults that offer nothing, to override where the
source knows more (a reading that marks a cell's row overrides ``fold``; one that warns,
``alerts``). Every method runs on the sampler thread unless said otherwise, and one that
raises costs that sample only (the watcher notes the error and samples again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.cost import Metered
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.processes import ProcessTable
from gpumagic.monitor.snapshot import Layout

# (seconds) -> (times, values of the source's rows): the samples of the last ``seconds``
# (None: the whole window), oldest first, the latest included; what alerts look back on.
Recent = Callable[[float | None], tuple[np.ndarray, np.ndarray]]


class Source(Protocol):
    """One origin of samples for a watcher."""

    layout: Layout  # the columns it fills, how its rows are labelled: shared by a watcher's sources
    reason: str | None  # why it watches nothing it was meant to (shown in place of its panel)
    origin: str  # where its numbers come from, beyond this machine ("" for this machine)

    @property
    def devices(self) -> Sequence[WatchedDevice]:
        """Its rows, in order. May grow between samples (a node joined): new rows come last."""
        ...

    def history(self, start: float, end: float, step: float) -> list[tuple[float, np.ndarray]]:
        """Samples from before the watch started (``(time, rows)``), read once at the start."""
        ...

    def read(self, t: float) -> np.ndarray:
        """One sample at ``t``: ``(len(devices), len(layout.metrics))`` float64, NaN = missing."""
        ...

    def fold(self, cell: CellRecord, rows: np.ndarray) -> None:
        """Take a sample of its rows into the record of a cell that runs (or just ended)."""
        ...

    def alerts(self, recent: Recent, running: CellRecord | None) -> list[Alert]:
        """The alerts its latest sample raises (``recent`` gives the samples before it)."""
        ...

    def meter(self, rows: np.ndarray) -> Metered:
        """What a sample of its rows tells the cost meter (idle, memory held, energy moved)."""
        ...

    def processes(self) -> ProcessTable | None:
        """The compute processes on its GPUs now (asked for a status or a result only)."""
        ...

    def notes(self) -> list[str]:
        """Why values are missing (any thread)."""
        ...

    def close(self) -> None:
        """The watch stopped: release what it holds."""
        ...


class SourceBase:
    """Defaults for everything but ``layout``, ``devices`` and ``read``: a source that has no
    history, folds nothing into cells, raises no alert, tells the meter nothing, lists no
    processes and has no notes."""

    reason: str | None = None
    origin: str = ""

    def history(self, start: float, end: float, step: float) -> list[tuple[float, np.ndarray]]:
        return []

    def fold(self, cell: CellRecord, rows: np.ndarray) -> None:
        return None

    def alerts(self, recent: Recent, running: CellRecord | None) -> list[Alert]:
        return []

    def meter(self, rows: np.ndarray) -> Metered:
        return Metered()

    def processes(self) -> ProcessTable | None:
        return None

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        return None
