"""Cell marks: when each notebook cell ran, and what the GPUs did while it ran.

IPython's ``pre_run_cell``/``post_run_cell`` events give start and end; the sampler thread
folds every sample taken while a cell is open into that cell's running peaks, so the
per-cell summary survives the ring buffer dropping old samples. Callbacks run on the
main thread inside IPython's event loop and must never raise (IPython would print a
traceback under the user's cell), so each one is guarded.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpumagic.clock_events import REASONS, name_reasons
from gpumagic.monitor import metrics as M

# Enough for a long day of notebook work; the list is bounded like everything else.
MAX_CELLS = 10_000
_SOURCE_CHARS = 120

# The clock-event reasons (gpumagic.clock_events) a cell's row is marked with: every reason
# NVML names but idle. A GPU at idle clocks because nothing runs on it is not news; each of
# the others held the GPU below its maximum clocks while the cell ran, which is what its
# time needs to be read with. The power cap is marked although it raises no alert (a healthy
# card at full load sits at its limit): a cell it held ran as fast as the power limit allows,
# and whether that limit is the card's default is what %gpucheck judges. Sync boost,
# applications and display clocks are settings, not faults, but a cell they held ran below
# what the card can do. A bit this version cannot name stays in the samples (the
# ``throttle`` column, the CSV): nothing can be said about it in words a user acts on.
MARKED_REASONS = frozenset(r.name for r in REASONS) - {"gpu_idle"}


def first_line(source: str) -> str:
    """The first non-blank line of a cell, trimmed, for labels and the summary table."""
    for line in source.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= _SOURCE_CHARS else line[: _SOURCE_CHARS - 1] + "…"
    return ""


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


@dataclass
class CellRecord:
    """One cell that ran while watching. Times are ``time.time()`` seconds."""

    execution_count: int | None
    source: str
    start: float
    end: float | None = None
    success: bool | None = None
    samples: int = 0
    # utilization.gpu, %: of the GPUs this process uses (utilization_devices), else the busiest
    peak_utilization: float = math.nan
    sum_utilization: float = 0.0
    n_utilization: int = 0
    peak_memory: float = math.nan  # largest memory.used of any watched GPU, bytes
    peak_process_memory: float = math.nan  # this process's GPU memory, all GPUs summed, bytes
    peak_host_cpu: float = math.nan
    peak_host_memory: float = math.nan
    holds_gpu_memory: bool | None = None  # whether this process held GPU memory (None: unknown)
    # The GPUs this process used (WatchedDevice.key, in row order): its utilisation's source
    utilization_devices: tuple[str, ...] = ()
    # Energy of the watched GPUs while the cell ran, mJ (NaN: no counter). Issue 12; filled by
    # the cost meter through CellMarks.add_energy, not by a source's fold.
    energy_mj: float = math.nan
    # Clock-event reasons, per GPU (WatchedDevice.key, in row order): the samples in which NVML
    # read its reasons, and of those, how many each marked reason (MARKED_REASONS) was active in.
    clock_samples: dict[str, int] = field(default_factory=dict)
    clock_events: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.end is None

    @property
    def mean_utilization(self) -> float:
        return self.sum_utilization / self.n_utilization if self.n_utilization else math.nan

    def copy(self) -> CellRecord:
        """A copy the sampler thread does not touch (its per-GPU counts too)."""
        record = CellRecord(**vars(self))
        record.clock_samples = dict(self.clock_samples)
        record.clock_events = {k: dict(v) for k, v in self.clock_events.items()}
        return record

    def clock_event_shares(self) -> dict[str, dict[str, float]] | None:
        """``{"cuda:0": {"sw_power_cap": 0.72}}``: for each GPU, the share of the cell's samples
        in which each marked reason was active (those NVML read its reasons in). Of the GPUs
        this process used when it used any, as its utilisation is (another user's card on a
        shared box is not this cell's news); a GPU with no reason active maps to ``{}``. None
        when NVML read no reasons of those GPUs during the cell: nothing can be said."""
        own = self.utilization_devices
        keys = [k for k in self.clock_samples if not own or k in own]
        if not keys:
            return None
        return {
            k: {name: n / self.clock_samples[k] for name, n in self.clock_events.get(k, {}).items()}
            for k in keys
        }

    def duration(self, now: float | None = None) -> float:
        """Seconds the cell ran (so far, for a running cell)."""
        end = self.end if self.end is not None else (time.time() if now is None else now)
        return max(0.0, end - self.start)

    def fold_gpus(self, rows: np.ndarray, own: Sequence[int], keys: Sequence[str]) -> None:
        """Take one sample of this machine's GPUs (``rows``: one per GPU, ``keys`` their
        devices') into the cell's peaks (sampler thread, under the marks' lock).

        ``own``: the rows this process uses in this sample. Utilisation is theirs when there
        are any (on a shared box another user's job is not this cell's), the busiest GPU's
        otherwise."""
        if not len(rows):
            return
        if own:
            used = {*self.utilization_devices, *(keys[r] for r in own)}
            self.utilization_devices = tuple(k for k in keys if k in used)
        util = rows[list(own) or slice(None), M.UTIL_GPU]
        if not np.isnan(util).all():
            busiest = float(np.nanmax(util))
            self.peak_utilization = _nanmax(self.peak_utilization, busiest)
            self.sum_utilization += busiest
            self.n_utilization += 1
        mem = rows[:, M.MEM_USED]
        if not np.isnan(mem).all():
            self.peak_memory = _nanmax(self.peak_memory, float(np.nanmax(mem)))
        proc = rows[:, M.PROC_MEM]
        if not np.isnan(proc).all():
            total = float(np.nansum(proc))
            self.peak_process_memory = _nanmax(self.peak_process_memory, total)
            self.holds_gpu_memory = bool(self.holds_gpu_memory) or total > 0
        self._fold_clock_events(rows[:, M.THROTTLE], keys)

    def _fold_clock_events(self, masks: np.ndarray, keys: Sequence[str]) -> None:
        """Count the marked reasons active in one sample of each GPU's reason mask (NaN: NVML
        could not read them then, a sample that counts for no share)."""
        for key, mask in zip(keys, masks):
            if math.isnan(mask):
                continue
            self.clock_samples[key] = self.clock_samples.get(key, 0) + 1
            for name in name_reasons(int(mask)).names:
                if name in MARKED_REASONS:
                    counts = self.clock_events.setdefault(key, {})
                    counts[name] = counts.get(name, 0) + 1

    def fold_host(self, row: np.ndarray) -> None:
        """Take one sample of the host's row into the cell's peaks."""
        self.peak_host_cpu = _nanmax(self.peak_host_cpu, float(row[M.HOST_CPU]))
        self.peak_host_memory = _nanmax(self.peak_host_memory, float(row[M.HOST_MEM_USED]))


class CellMarks:
    """Records cells from IPython events; ``attach(shell)`` / ``detach()`` (idempotent)."""

    def __init__(self, on_cell_end: Any = None) -> None:
        self.cells: deque[CellRecord] = deque(maxlen=MAX_CELLS)
        self._open: list[CellRecord] = []  # a stack: a cell may run a cell (shell.run_cell)
        self._closing: list[CellRecord] = []  # ended, waiting for the sample that closes them
        self._lock = threading.Lock()
        self._shell: Any = None
        self._on_cell_end = on_cell_end
        # pre_run_cell sees shell.execution_count before or after IPython increments it,
        # depending on the IPython version; the first post_run_cell tells us which.
        self._count_offset: int | None = None

    # -- registration --------------------------------------------------------------------
    def attach(self, shell: Any) -> None:
        if self._shell is shell:
            return
        self.detach()
        if self._count_offset is None:
            # Started from inside a cell (the magic): that cell's own number against the
            # shell's counter gives the offset before any cell has ended.
            from gpumagic.cell import running_cell_number

            number = running_cell_number(shell)
            if number is not None:
                self._count_offset = number - int(shell.execution_count)
        shell.events.register("pre_run_cell", self._pre_run_cell)
        shell.events.register("post_run_cell", self._post_run_cell)
        self._shell = shell

    def detach(self) -> None:
        shell, self._shell = self._shell, None
        if shell is None:
            return
        for event, fn in (
            ("pre_run_cell", self._pre_run_cell),
            ("post_run_cell", self._post_run_cell),
        ):
            try:
                shell.events.unregister(event, fn)
            except ValueError:  # already removed (someone reset the event manager)
                pass

    @property
    def attached(self) -> bool:
        return self._shell is not None

    # -- IPython callbacks (main thread) -------------------------------------------------
    def _pre_run_cell(self, info: Any) -> None:
        try:
            raw = getattr(info, "raw_cell", "") or ""
            count: int | None = None
            if getattr(info, "store_history", True) and self._shell is not None:
                count = int(self._shell.execution_count) + (self._count_offset or 0)
            self.open(first_line(raw), count)
        except Exception:  # never break the user's cell
            pass

    def _post_run_cell(self, result: Any) -> None:
        try:
            info = getattr(result, "info", None)
            raw = getattr(info, "raw_cell", None)
            if raw is not None and not raw.strip():
                return  # IPython fires post_run_cell (but not pre_run_cell) for empty cells
            count = getattr(result, "execution_count", None)
            success = getattr(result, "success", None)
            self.close(count, success)
        except Exception:
            pass

    # -- any thread ----------------------------------------------------------------------
    def open(
        self, source: str, execution_count: int | None, start: float | None = None
    ) -> CellRecord:
        record = CellRecord(execution_count, source, time.time() if start is None else start)
        with self._lock:
            self._open.append(record)
            self.cells.append(record)
        return record

    def close(
        self,
        execution_count: int | None = None,
        success: bool | None = None,
        end: float | None = None,
    ) -> CellRecord | None:
        with self._lock:
            if not self._open:
                return None  # the cell that started the watcher ends: it was never opened
            record = self._open.pop()
            record.end = time.time() if end is None else end
            record.success = success
            if execution_count is not None:
                if record.execution_count is not None and self._count_offset is None:
                    self._count_offset = execution_count - record.execution_count
                record.execution_count = execution_count
            self._closing.append(record)
        if self._on_cell_end is not None:
            self._on_cell_end()
        return record

    def close_all(self, end: float) -> None:
        """Stop watching: cells still open end now (their duration is cut at the stop)."""
        with self._lock:
            while self._open:
                record = self._open.pop()
                record.end = end
            self._closing.clear()

    def fold(self, t: float, fold: Callable[[CellRecord], None]) -> None:
        """Sampler thread: add a sample to every open cell and to cells that just ended;
        ``fold(record)`` takes the sample's values in (each source folds its own rows).

        NVML's utilisation is an average over the last sampling period of the driver, so the
        first sample after a cell ends still describes the cell's last moments; it is the
        only sample a cell shorter than the interval gets.
        """
        with self._lock:
            for record in self._open:
                if t >= record.start:
                    record.samples += 1
                    fold(record)
            for record in self._closing:
                record.samples += 1
                fold(record)
            self._closing.clear()

    def running(self) -> CellRecord | None:
        with self._lock:
            return self._open[-1] if self._open else None

    def records(self, since: float | None = None) -> list[CellRecord]:
        """Copies of the records (the sampler keeps updating the originals), oldest first;
        with ``since``, only cells still running or ended at or after it (what a live frame
        draws: copying a day's 10 000 cells every second would cost more than the frame)."""
        with self._lock:
            if since is None:
                return [r.copy() for r in self.cells]
            out = []
            for r in reversed(self.cells):
                if r.end is not None and r.end < since:
                    break  # cells are in start order, so everything older ended earlier
                out.append(r.copy())
            out.reverse()
            return out

    # -- cost and energy (issue 12): the meter asks, on the sampler thread ------------------
    def _overlapping(self, t0: float, t1: float) -> list[tuple[CellRecord, float]]:
        """(record, seconds of [t0, t1] it covers) for every cell that ran in it (lock held)."""
        out = [(r, t1 - max(t0, r.start)) for r in self._open]
        before = 0
        for r in reversed(self.cells):
            if r.end is None:
                continue  # open: counted above
            if r.end < t0:
                # Cells are in start order, so older ones ended earlier, except an outer cell
                # that ran an inner one (shell.run_cell): look a few records further.
                before += 1
                if before >= 8:
                    break
                continue
            out.append((r, min(t1, r.end) - max(t0, r.start)))
        return [(r, covered) for r, covered in out if covered > 0]

    def add_energy(self, t0: float, t1: float, mj: float) -> None:
        """Spread ``mj`` (the watched GPUs' energy over ``[t0, t1]``) over the cells in it, in
        proportion to their time in it: the power is taken as constant within one interval."""
        if t1 <= t0:
            return
        with self._lock:
            for record, covered in self._overlapping(t0, t1):
                share = mj * covered / (t1 - t0)
                record.energy_mj = share if math.isnan(record.energy_mj) else record.energy_mj + share

    def busy_seconds(self, t0: float, t1: float) -> float:
        """Seconds of ``[t0, t1]`` during which any cell ran (nested cells counted once)."""
        with self._lock:
            spans = sorted(
                (max(t0, r.start), min(t1, r.end if r.end is not None else t1))
                for r, _ in self._overlapping(t0, t1)
            )
        busy, reach = 0.0, t0
        for start, end in spans:
            start = max(start, reach)
            if end > start:
                busy += end - start
                reach = end
        return busy

    def last_end(self) -> float | None:
        """When the most recent cell ended (None: none has)."""
        with self._lock:
            ends = [r.end for r in itertools.islice(reversed(self.cells), 8) if r.end is not None]
        return max(ends) if ends else None
