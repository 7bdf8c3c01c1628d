"""This machine's GPUs as a source of samples: one row per GPU (or MIG instance) CUDA sees,
read through NVML (:mod:`gpumagic.monitor.nvml`).

Beside the readings, it knows what only NVML can tell: which of its GPUs this process uses
(NVML lists its memory there, or it holds a CUDA context: a cell's utilisation is theirs),
the energy counters (per cell, issue 12), whether the GPUs sit idle while this kernel holds
memory (the idle alert), and the compute processes on them. Without a usable GPU it has no
rows, and ``reason`` says why.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import LOW_UTIL_SPAN_S, Alert, compute_alerts
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.cost import Metered, gpus_idle
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.machine import MACHINE
from gpumagic.monitor.nvml import GpuReader, cuda_devices_in_use, cuda_in_use, gpus_to_watch
from gpumagic.monitor.processes import ProcessTable, read_processes
from gpumagic.monitor.source import Recent, SourceBase

# NVML return codes (nvml.h) after which the energy counter is not asked again
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_FUNCTION_NOT_FOUND = 13


def check_gpus(gpus: int | str | Sequence[int] | None) -> list[int] | None:
    """``gpus`` as CUDA indexes: an int, ``"0,1"`` or a sequence; None for every visible GPU."""
    if gpus is None:
        return None
    items: Sequence[Any]
    if isinstance(gpus, str):
        items = [g for g in gpus.replace(" ", "").split(",") if g]
    elif isinstance(gpus, int):
        items = [gpus]
    else:
        items = list(gpus)
    out: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"GPU indexes must be integers, got {item!r}")
        try:
            out.append(int(item))
        except (TypeError, ValueError):
            raise ValueError(f"GPU indexes must be integers (CUDA indexes), got {item!r}") from None
    if not out:
        raise ValueError("gpus is empty: pass None to watch every visible GPU")
    return out


class EnergyReader:
    """NVML's total-energy counters of the watched GPUs; never raises."""

    def __init__(
        self, module: Any, gpus: Sequence[tuple[WatchedDevice, Any]], unavailable: str | None = None
    ) -> None:
        self._nv = module
        self._gpus = list(gpus)
        self.note: str | None = unavailable
        self.errors = 0
        fn = getattr(module, "nvmlDeviceGetTotalEnergyConsumption", None) if gpus else None
        self._fn: Any = fn
        if gpus and fn is None and self.note is None:
            self.note = "energy per cell not available: this nvidia-ml-py has no nvmlDeviceGetTotalEnergyConsumption"

    @property
    def available(self) -> bool:
        return self._fn is not None and self.note is None

    def read(self) -> np.ndarray:
        """mJ of each watched GPU, or NaN (for good once a GPU has no counter)."""
        out = np.full(len(self._gpus), np.nan)
        if not self.available:
            return out
        for i, (device, handle) in enumerate(self._gpus):
            try:
                out[i] = float(self._fn(handle))
            except Exception as exc:
                code = getattr(exc, "value", None)
                if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NO_PERMISSION) or code is None:
                    self.note = (
                        f"energy per cell not available: {device.label} has no total-energy "
                        f"counter (NVML reports it on Volta and later GPUs; {exc or type(exc).__name__})"
                    )
                else:
                    self.errors += 1  # transient: this interval's energy is lost, not the rest
                return np.full(len(self._gpus), np.nan)
        return out


class GpuSource(SourceBase):
    """This machine's GPUs through NVML (none, with ``reason``, where NVML has none).

    ``gpus`` are CUDA indexes (``cuda:N`` as PyTorch numbers them under
    ``CUDA_VISIBLE_DEVICES``); an index that is not visible is a ValueError listing those
    that are.
    """

    layout = MACHINE

    def __init__(self, gpus: int | str | Sequence[int] | None = None) -> None:
        selection = gpus_to_watch(check_gpus(gpus))
        self.reason = selection.reason
        self._notes = list(selection.notes)
        pid = os.getpid()
        self.readers = [GpuReader(selection.module, d, g, pid) for d, g in selection.gpus]
        self._nvml = selection.module
        self._handles = [(d, g.handle) for d, g in selection.gpus]
        self._devices = tuple(r.device for r in self.readers)
        self._keys = [d.key for d in self._devices]
        # The total-energy counter is the whole board's: on a MIG instance it would count
        # the other tenants' work as this kernel's cells.
        mig = any(getattr(g, "mig_index", None) is not None for _, g in selection.gpus)
        self._energy = EnergyReader(
            selection.module,
            self._handles,
            "energy per cell not available: MIG instances share their board's energy counter"
            if mig
            else None,
        )
        self._counters: np.ndarray | None = None
        self._own: list[int] = []  # rows this process uses, as of the last sample
        self._process_note: str | None = None

    @property
    def devices(self) -> tuple[WatchedDevice, ...]:
        return self._devices

    def read(self, t: float) -> np.ndarray:
        block = np.full((len(self.readers), M.N_METRICS), np.nan)
        for row, reader in enumerate(self.readers):
            reader.read(block[row])
        if self.readers:
            self._process_memory_check(block)
            self._own = self._own_rows(block)
        return block

    def fold(self, cell: CellRecord, rows: np.ndarray) -> None:
        cell.fold_gpus(rows, self._own, self._keys)

    def alerts(self, recent: Recent, running: CellRecord | None) -> list[Alert]:
        if not self.readers:
            return []
        times, values = recent(LOW_UTIL_SPAN_S)
        return compute_alerts(self._devices, times, values, running, cuda_in_use())

    def meter(self, rows: np.ndarray) -> Metered:
        if not self.readers:
            return Metered()
        idle = gpus_idle(rows[:, M.UTIL_GPU])
        return Metered(
            idle=idle,
            holds_memory=idle is True and self._holds_memory(rows),
            energy_mj=self._energy_moved() if self._energy.available else None,
        )

    def processes(self) -> ProcessTable:
        """The compute processes on these GPUs now (nvidia-smi's bottom table)."""
        if not self._handles:
            return ProcessTable()
        return read_processes(self._nvml, self._handles, os.getpid(), time.time())

    def notes(self) -> list[str]:
        out = list(self._notes)
        for reader in self.readers:
            out.extend(reader.notes())
        if self._process_note:
            out.append(self._process_note)
        if self._energy.note:
            out.append(self._energy.note)
        return out

    # -- what only NVML tells --------------------------------------------------------------
    def _energy_moved(self) -> np.ndarray:
        """mJ each GPU's counter moved since the previous sample: all NaN when any is unknown
        or went back (the driver reloaded): that interval's energy is lost, not the rest."""
        counters = self._energy.read()
        previous, self._counters = self._counters, counters
        if previous is None:
            return np.full(len(counters), np.nan)
        moved = counters - previous
        if np.isnan(moved).any() or (moved < 0).any():
            return np.full(len(counters), np.nan)
        return moved

    def _holds_memory(self, rows: np.ndarray) -> bool:
        proc = rows[:, M.PROC_MEM]
        if np.isnan(proc).all():
            # NVML could not tell (a container's PID namespace): torch having CUDA up is the
            # best evidence left that this kernel holds memory.
            return cuda_in_use()
        return bool(np.nansum(proc) > 0)

    def _own_rows(self, block: np.ndarray) -> list[int]:
        """Rows this process uses: NVML lists its memory there, or (NVML cannot tell, as in a
        container's PID namespace) it holds a CUDA context there. A cell's utilisation comes
        from these, not from another user's busiest GPU on a shared box."""
        proc = block[:, M.PROC_MEM]
        own = [row for row, used in enumerate(proc) if used > 0]
        if own or not np.isnan(proc).any():
            return own
        contexts = cuda_devices_in_use()
        return [
            row
            for row, reader in enumerate(self.readers)
            if math.isnan(block[row, M.PROC_MEM]) and reader.device.cuda_index in contexts
        ]

    def _process_memory_check(self, block: np.ndarray) -> None:
        # NVML reports host PIDs; inside a container's PID namespace os.getpid() matches none,
        # and "0 bytes" would be a lie for a process that is using CUDA.
        readers = [r for r in self.readers if r.process_checked]
        if not readers or any(r.process_found for r in readers) or not cuda_in_use():
            return
        for row, reader in enumerate(self.readers):
            if reader in readers:
                block[row, M.PROC_MEM] = np.nan
        if any(r.process_listed_any for r in readers):
            self._process_note = (
                "this process is not in NVML's process list (a container's PID namespace?): "
                "its own GPU memory is unknown"
            )
