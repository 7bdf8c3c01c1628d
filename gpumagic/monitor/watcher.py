"""The sampler thread and the one-per-process "current watcher".

A ``Watcher`` validates everything (interval, window, GPU indexes, log path) in its
constructor, so bad input fails before any thread exists. ``start()`` replaces whatever
watcher was running (two samplers would double the cost and fight over the cell events),
takes the first sample on the calling thread (so ``status()`` has data at once) and
starts a daemon thread that samples every ``interval`` seconds until ``stop()``.

Nothing the thread does raises: a sample that fails part-way records the error and the
next sample runs as usual. The thread's own CPU time per sample is measured
(``time.thread_time``) so its cost is a number, not a guess.

The watcher publishes and never draws: ``seq`` is a version counter a reader polls (it
changes exactly when a new sample is in), and ``subscribe()`` tells a front end about
every sample and about the stop. The live chart (``gpumagic.render.watch_live``) and the
shell whose cells are marked are handed in by the IPython glue; this module imports
neither IPython nor any display code (issue 8, checked by ``lint-imports``).
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import LOW_UTIL_SPAN_S, Alert, compute_alerts
from gpumagic.monitor.cells import CellMarks
from gpumagic.monitor.cost import CostMeter
from gpumagic.monitor.csvlog import CsvLog
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.host import HostReader
from gpumagic.monitor.nvml import GpuReader, cuda_devices_in_use, cuda_in_use, gpus_to_watch
from gpumagic.monitor.processes import ProcessTable, read_processes
from gpumagic.monitor.result import WatchResult, WatchStatus
from gpumagic.monitor.ring import Ring, capacity_for
from gpumagic.monitor.snapshot import Snapshot
from gpumagic.units import parse_duration, parse_price

__all__ = ["Snapshot", "WatchEvent", "Watcher", "current", "stop_current", "watch"]

# What a subscriber is told: a new sample is in, or the watcher stopped (its result is final).
WatchEvent = Literal["sample", "stop"]

# NVML's utilisation is the share of its last sample period that was busy, and "each sample
# period may be between 1 second and 1/6 second" (nvmlDeviceGetUtilizationRates): 1-6 Hz.
# Power on Ampere (except GA100) and newer is a 1 s average. Faster than this floor mostly
# re-reads the same values and only costs CPU.
MIN_INTERVAL = 0.1
# A cell-end sample is taken at once, but never closer than this to the previous one, so a
# notebook of many tiny cells ("Run all") cannot turn the sampler into a busy loop.
MIN_SPACING = 0.1
_JOIN_TIMEOUT_S = 5.0


def _check_interval(interval: float) -> tuple[float, str | None]:
    try:
        value = float(interval)
    except (TypeError, ValueError):
        raise ValueError(f"interval must be a number of seconds, got {interval!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    if value < MIN_INTERVAL:
        return MIN_INTERVAL, f"interval raised from {value:g} s to the {MIN_INTERVAL:g} s floor"
    return value, None


def _check_window(window: float, interval: float) -> float:
    try:
        value = float(window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be a number of seconds, got {window!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"window must be a positive number of seconds, got {window!r}")
    if value < interval:
        raise ValueError(f"window ({value:g} s) must be at least one interval ({interval:g} s)")
    return value


def _check_gpus(gpus: int | str | Sequence[int] | None) -> list[int] | None:
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


class Watcher:
    """Samples every visible GPU (or the host) in a background thread.

    ``gpus`` are CUDA indexes (``cuda:N`` as PyTorch numbers them under
    ``CUDA_VISIBLE_DEVICES``). ``cells`` registers cell marks on ``shell`` (an IPython
    shell: ``%gpuwatch`` passes its own; in a notebook, ``shell=get_ipython()``) while the
    watcher runs. Without a shell no cell is marked: this core never looks for one.

    ``price`` (dollars per hour) puts a cost on every cell and on the idle time;
    ``idle_alert`` (seconds, or ``"30m"``, ``"2h"``) raises an alert, and calls ``on_idle``
    with it, when every watched GPU has been idle that long while this kernel holds GPU
    memory (without a GPU: while no cell runs). See :mod:`gpumagic.monitor.cost`.
    """

    def __init__(
        self,
        interval: float = 1.0,
        log: str | os.PathLike[str] | None = None,
        gpus: int | str | Sequence[int] | None = None,
        window: float = 300.0,
        *,
        cells: bool = True,
        shell: Any = None,
        price: float | None = None,
        idle_alert: float | str | None = None,
        on_idle: Callable[[Alert], object] | None = None,
    ) -> None:
        self.interval, floor_note = _check_interval(interval)
        self.price = parse_price(price)
        self.idle_alert_s = parse_duration(idle_alert) if idle_alert is not None else None
        if on_idle is not None and not callable(on_idle):
            raise ValueError(f"on_idle must be callable, got {on_idle!r}")
        self.window = _check_window(window, self.interval)
        selection = gpus_to_watch(_check_gpus(gpus))
        self.reason = selection.reason
        self._notes: list[str] = ([floor_note] if floor_note else []) + selection.notes
        pid = os.getpid()
        self._gpu_readers = [GpuReader(selection.module, d, g, pid) for d, g in selection.gpus]
        self._nvml = selection.module
        self._gpu_handles = [(d, g.handle) for d, g in selection.gpus]
        self._host = HostReader()
        self.devices: tuple[WatchedDevice, ...] = (
            *(r.device for r in self._gpu_readers),
            self._host.device,
        )
        self._gpu_rows = list(range(len(self._gpu_readers)))
        self._host_row = len(self.devices) - 1
        self._ring = Ring(capacity_for(self.window, self.interval), len(self.devices), M.N_METRICS)
        self._meter = CostMeter(
            self.devices,
            self._gpu_handles,
            selection.module,
            self.price,
            self.idle_alert_s,
            on_idle,
            # The total-energy counter is the whole board's: on a MIG instance it would count
            # the other tenants' work as this kernel's cells.
            energy_unavailable=(
                "energy per cell not available: MIG instances share their board's energy counter"
                if any(getattr(g, "mig_index", None) is not None for _, g in selection.gpus)
                else None
            ),
        )
        # Opened here, before any thread: an unwritable path is a ValueError naming it.
        self._log = CsvLog(log, self.devices) if log is not None else None

        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.marks = CellMarks(on_cell_end=self._wake.set)
        self._want_cells = cells
        self._shell = shell
        self._thread: threading.Thread | None = None
        self._sample_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._alerts: list[Alert] = []
        self._alerts_seen: dict[tuple[str, str], tuple[Alert, float, int]] = {}
        self._process_note: str | None = None
        self.started = math.nan
        self.stopped_at: float | None = None
        self.samples_taken = 0
        self.sample_cpu_s = 0.0  # thread CPU seconds spent sampling, all samples together
        self.sample_errors = 0
        self.last_error: str | None = None
        self._result: WatchResult | None = None
        self._subscribers: list[Callable[[WatchEvent], None]] = []
        self._stop_published = False
        self._subscriber_error: str | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> Watcher:
        """Start sampling (stopping any other running watcher first); returns self."""
        global _current
        with _current_lock:
            if self._result is not None:
                raise RuntimeError(
                    "this watcher was stopped; start a new one with gpumagic.watch()"
                )
            if self._thread is not None:
                return self
            previous = _current
            if previous is not None and previous is not self:
                previous.stop()
            _register_atexit()
            if self._want_cells and self._shell is not None:
                self.marks.attach(self._shell)
            self.started = time.time()
            self.sample_now()
            self._thread = threading.Thread(target=self._run, name="gpumagic-watch", daemon=True)
            self._thread.start()
            _current = self
        return self

    def stop(self) -> WatchResult:
        """Stop the thread, close the log, unregister cell marks; returns the result (idempotent)."""
        global _current
        with _current_lock:
            if self._result is not None:
                return self._result
            self._stopping.set()
            self._wake.set()
            thread, self._thread = self._thread, None
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=_JOIN_TIMEOUT_S)
            if thread is not None and not thread.is_alive():
                # A last sample: the state at the stop, and the closing sample of a cell
                # that ended just before it (the thread may not have got to it).
                self.sample_now()
            self.marks.detach()
            self.stopped_at = time.time()
            self.marks.close_all(self.stopped_at)
            if self._log is not None:
                self._log.close()
            self._result = WatchResult(self._with_processes(self.snapshot(all_cells=True)))
            if _current is self:
                _current = None
            result = self._result
        # Outside the lock: a subscriber (the live chart) may join its own thread, which
        # reads this watcher meanwhile.
        self._publish("stop")
        return result

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def seq(self) -> int:
        """Samples ever taken into the ring: changes exactly when there is something new to draw."""
        return self._ring.pushed

    @property
    def log_path(self) -> str | None:
        return str(self._log.path) if self._log is not None else None

    def attach(self, shell: Any) -> None:
        """Record cell marks from ``shell`` (replaces any shell attached before)."""
        self.marks.attach(shell)

    def detach(self) -> None:
        self.marks.detach()

    def subscribe(self, callback: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Be told when there is something new; returns the function that unsubscribes.

        ``callback("sample")`` runs after every sample, on the thread that took it (the
        sampler's, mostly: keep it short). ``callback("stop")`` runs once, on the thread that
        called ``stop()``, when the result is final; subscribing to a stopped watcher gets it
        at once. A callback that raises never reaches the sampler or ``stop()``'s caller; the
        error shows in ``notes()``.
        """
        with self._state_lock:
            stopped = self._stop_published
            if not stopped:
                self._subscribers.append(callback)
        if stopped:
            self._tell(callback, "stop")

        def unsubscribe() -> None:
            with self._state_lock:
                for i, cb in enumerate(self._subscribers):
                    if cb is callback:
                        del self._subscribers[i]
                        break

        return unsubscribe

    def _publish(self, event: WatchEvent) -> None:
        with self._state_lock:
            if self._stop_published:
                return
            subscribers = list(self._subscribers)
            if event == "stop":  # the last word: nothing is published after it
                self._stop_published = True
                self._subscribers.clear()
        for callback in subscribers:
            self._tell(callback, event)

    def _tell(self, callback: Callable[[WatchEvent], None], event: WatchEvent) -> None:
        try:
            callback(event)
        except Exception as exc:  # a front end's bug must not stop the sampling
            self._subscriber_error = f"{event!r} subscriber failed: {type(exc).__name__}: {exc}"

    # -- reading -------------------------------------------------------------------------
    def snapshot(self, all_cells: bool = False) -> Snapshot:
        """A consistent copy of the window; cells of the window only unless ``all_cells``."""
        last = self._ring.last()
        now = last[0] if last is not None else time.time()
        times, values = self._ring.since(now - self.window)
        with self._state_lock:
            alerts = list(self._alerts)
            seen = list(self._alerts_seen.values())
        return Snapshot(
            devices=self.devices,
            times=times,
            values=values,
            cells=self.marks.records(None if all_cells else now - self.window),
            alerts=alerts,
            alerts_seen=seen,
            reason=self.reason,
            notes=self.notes(),
            interval=self.interval,
            window=self.window,
            started=self.started,
            now=now,
            running=self.running,
            log_path=self.log_path,
            samples_taken=self.samples_taken,
            sample_cpu_s=self.sample_cpu_s,
            seq=self._ring.pushed,
            cost=self._meter.state(),
        )

    def status(self) -> WatchStatus:
        """Current values of every device, active alerts, the GPUs' processes and notes."""
        if self._ring.last() is None:
            self.sample_now()
        snap = self._with_processes(self.snapshot())
        running = self.marks.running()
        idle = self._meter.status_alert(running.start if running is not None else None)
        if idle is not None and all(a.key != idle.key for a in snap.alerts):
            snap = dataclasses.replace(snap, alerts=[*snap.alerts, idle])
        return WatchStatus(snap)

    def result(self) -> WatchResult:
        """The summary so far, without stopping (``stop()`` returns the final one)."""
        if self._result is not None:
            return self._result
        return WatchResult(self._with_processes(self.snapshot(all_cells=True)))

    def processes(self) -> ProcessTable:
        """The compute processes on the watched GPUs now (nvidia-smi's bottom table)."""
        if not self._gpu_handles:
            return ProcessTable()
        return read_processes(self._nvml, self._gpu_handles, os.getpid(), time.time())

    def _with_processes(self, snap: Snapshot) -> Snapshot:
        return dataclasses.replace(snap, processes=self.processes())

    def notes(self) -> list[str]:
        """Why some values are missing: unsupported metrics, lost GPUs, log or host errors."""
        out = list(self._notes)
        for reader in self._gpu_readers:
            out.extend(reader.notes())
        if self._process_note:
            out.append(self._process_note)
        if self._host.error:
            out.append(self._host.error)
        if self._log is not None and self._log.error:
            out.append(self._log.error)
        if self.last_error:
            out.append(f"sampling error ({self.sample_errors} so far): {self.last_error}")
        if self._subscriber_error:
            out.append(self._subscriber_error)
        if self._meter.energy_note:
            out.append(self._meter.energy_note)
        if self._meter.callback_error:
            out.append(self._meter.callback_error)
        return out

    @property
    def sample_cpu_mean_s(self) -> float:
        """Mean thread CPU seconds one sample costs (NaN before the first)."""
        return self.sample_cpu_s / self.samples_taken if self.samples_taken else math.nan

    # -- sampling ------------------------------------------------------------------------
    def sample_now(self) -> None:
        """Take one sample on the calling thread (also what the thread does every interval)."""
        with self._sample_lock:
            cpu0 = time.thread_time()
            try:
                self._sample()
            except Exception as exc:  # never into the user's cells; shown in the notes
                self.sample_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            self.sample_cpu_s += time.thread_time() - cpu0
            self.samples_taken += 1
        self._publish("sample")  # outside the lock: a subscriber may read the watcher

    def _sample(self) -> None:
        t = time.time()
        block = np.full((len(self.devices), M.N_METRICS), np.nan)
        for row, reader in enumerate(self._gpu_readers):
            reader.read(block[row])
        if self._gpu_readers:
            self._process_memory_check(block)
        self._host.read(block[self._host_row])
        self._ring.push(t, block)
        if self._log is not None:
            self._log.write(t, block)
        self.marks.fold(t, block, self._gpu_rows, self._host_row, self._own_rows(block))
        self._update_alerts(t)
        self._update_cost(t, block)

    def _update_cost(self, t: float, block: np.ndarray) -> None:
        # After the marks took the sample: the meter spreads energy over the cells it covers.
        # Whether CUDA is up matters only where NVML could not tell this process's memory.
        unknown = bool(self._gpu_rows) and bool(np.isnan(block[self._gpu_rows, M.PROC_MEM]).all())
        self._meter.sample(t, block, self.marks, cuda_in_use() if unknown else False)
        alert = self._meter.alert
        if alert is None:
            return
        with self._state_lock:
            self._alerts = [*self._alerts, alert]
            first = self._alerts_seen.get(alert.key)
            if first is None:
                self._alerts_seen[alert.key] = (alert, t, 1)
            else:
                self._alerts_seen[alert.key] = (first[0], t, first[2] + 1)

    def _own_rows(self, block: np.ndarray) -> list[int]:
        """GPU rows this process uses: NVML lists its memory there, or (NVML cannot tell, as
        in a container's PID namespace) it holds a CUDA context there. A cell's utilisation
        comes from these, not from another user's busiest GPU on a shared box."""
        if not self._gpu_readers:
            return []
        proc = block[self._gpu_rows, M.PROC_MEM]
        own = [row for row, used in zip(self._gpu_rows, proc) if used > 0]
        if own or not np.isnan(proc).any():
            return own
        contexts = cuda_devices_in_use()
        return [
            row
            for row, reader in zip(self._gpu_rows, self._gpu_readers)
            if math.isnan(block[row, M.PROC_MEM]) and reader.device.cuda_index in contexts
        ]

    def _process_memory_check(self, block: np.ndarray) -> None:
        # NVML reports host PIDs; inside a container's PID namespace os.getpid() matches none,
        # and "0 bytes" would be a lie for a process that is using CUDA.
        readers = [r for r in self._gpu_readers if r.process_checked]
        if not readers or any(r.process_found for r in readers) or not cuda_in_use():
            return
        for row, reader in enumerate(self._gpu_readers):
            if reader in readers:
                block[row, M.PROC_MEM] = np.nan
        if any(r.process_listed_any for r in readers):
            self._process_note = (
                "this process is not in NVML's process list (a container's PID namespace?): "
                "its own GPU memory is unknown"
            )

    def _update_alerts(self, t: float) -> None:
        span = math.ceil(LOW_UTIL_SPAN_S / self.interval) + 2
        times, values = self._ring.tail(span)
        alerts = compute_alerts(self.devices, times, values, self.marks.running(), cuda_in_use())
        with self._state_lock:
            self._alerts = alerts
            for alert in alerts:
                first = self._alerts_seen.get(alert.key)
                if first is None:
                    self._alerts_seen[alert.key] = (alert, t, 1)
                else:
                    self._alerts_seen[alert.key] = (first[0], t, first[2] + 1)

    def _run(self) -> None:
        next_due = time.monotonic() + self.interval
        last = time.monotonic()
        while not self._stopping.is_set():
            delay = next_due - time.monotonic()
            if delay > 0 and self._wake.wait(delay):
                self._wake.clear()
            if self._stopping.is_set():
                break
            # Woken by a cell end right after a sample: hold the minimum spacing.
            gap = MIN_SPACING - (time.monotonic() - last)
            if gap > 0 and self._stopping.wait(gap):
                break
            self.sample_now()
            last = time.monotonic()
            if last >= next_due:
                next_due += self.interval
                if next_due <= last:  # fell behind (suspended laptop, slow NVML): no burst
                    next_due = last + self.interval

    def __repr__(self) -> str:
        state = (
            "running"
            if self.running
            else ("stopped" if self._result is not None else "not started")
        )
        what = (
            f"{len(self._gpu_readers)} GPU(s)"
            if self._gpu_readers
            else f"host only ({self.reason})"
        )
        log = f", log={self.log_path!r}" if self.log_path else ""
        return f"<gpumagic Watcher {state}, every {self.interval:g} s, {what}{log}>"


# -- the current watcher ---------------------------------------------------------------------
_current: Watcher | None = None
_current_lock = threading.RLock()
_atexit_registered = False


def _register_atexit() -> None:
    # A script that never calls stop() would otherwise have the daemon thread killed
    # mid-NVML-call at interpreter shutdown; stop_current closes the log cleanly.
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(stop_current)
        _atexit_registered = True


def watch(
    interval: float = 1.0,
    log: str | os.PathLike[str] | None = None,
    gpus: int | str | Sequence[int] | None = None,
    window: float = 300.0,
    *,
    cells: bool = True,
    shell: Any = None,
    price: float | None = None,
    idle_alert: float | str | None = None,
    on_idle: Callable[[Alert], object] | None = None,
) -> Watcher:
    """Start watching (replacing any running watcher) and return the started ``Watcher``.

    ``interval``: seconds between samples (floor 0.1). ``log``: CSV path, one row per device
    per sample. ``gpus``: CUDA indexes to watch (default every visible GPU). ``window``:
    seconds of history kept in memory and drawn. ``shell``: the IPython shell whose cells
    to mark (``get_ipython()`` in a notebook; none are marked without it). Bad input
    raises ValueError before any thread starts. ``stop()`` on the watcher returns a
    ``WatchResult``. ``price`` ($/h), ``idle_alert`` (``"30m"``) and ``on_idle(alert)``:
    the cost of each cell and of the idle time, and an alert when the instance sits idle.
    """
    return Watcher(
        interval,
        log,
        gpus,
        window,
        cells=cells,
        shell=shell,
        price=price,
        idle_alert=idle_alert,
        on_idle=on_idle,
    ).start()


def current() -> Watcher | None:
    """The running watcher, if any."""
    return _current


def stop_current() -> WatchResult | None:
    """Stop the running watcher, if any (for ``on_unload`` and kernel shutdown)."""
    with _current_lock:
        watcher = _current
    return watcher.stop() if watcher is not None else None
