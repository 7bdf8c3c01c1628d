"""The watcher: one sampler thread over its sources, and the one-per-process "current watcher".

A ``Watcher`` reads its sources (:mod:`gpumagic.monitor.source`): this machine's GPUs and
host by default, or a job's GPUs through Prometheus (:mod:`gpumagic.monitor.job`). It
validates everything (interval, window, price, log path) in its constructor, so bad input
fails before any thread exists. ``start()`` replaces whatever watcher was running (two
samplers would double the cost and fight over the cell events), reads the sources' history
(a job's recent past), takes the first sample on the calling thread (so ``status()`` has
data at once) and starts a daemon thread that samples every ``interval`` seconds until
``stop()``, which takes a last sample.

A sample is a row per device (each source fills its own rows), kept in a ring of the
window's length, written to the CSV, folded into the running cells' records, looked at for
alerts and metered (cost, idle time, energy). Nothing the thread does raises: a sample that
fails part-way records the error and the next sample runs as usual. The thread's own CPU
time per sample is measured (``time.thread_time``) so its cost is a number, not a guess.

The watcher publishes and never draws: ``seq`` is a version counter a reader polls (it
changes exactly when a new sample is in), and ``subscribe()`` tells a front end about
every sample and about the stop. The live view (``gpumagic.render.watch_live``) and the
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

from gpumagic.device_kinds import CUDA
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellMarks, CellRecord
from gpumagic.monitor.cost import CostMeter, combine
from gpumagic.monitor.csvlog import CsvLog
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.host import HostSource
from gpumagic.monitor.nvml_source import GpuSource
from gpumagic.monitor.processes import ProcessTable
from gpumagic.monitor.result import WatchResult, WatchStatus
from gpumagic.monitor.ring import Ring, capacity_for
from gpumagic.monitor.snapshot import Snapshot
from gpumagic.monitor.source import Recent, Source
from gpumagic.units import parse_duration, parse_price

__all__ = ["WatchEvent", "Watcher", "current", "machine_sources", "stop_current"]

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
# A sample may be a request to Prometheus in flight (its timeout, 3 s by default).
_JOIN_TIMEOUT_S = 10.0


def machine_sources(gpus: int | str | Sequence[int] | None = None) -> list[Source]:
    """This machine: its GPUs through NVML (``gpus``: CUDA indexes, default all visible;
    none where NVML has none) and its host through psutil."""
    return [GpuSource(gpus), HostSource()]


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


class Watcher:
    """Samples its sources (default: this machine's GPUs and host) in a background thread.

    ``interval``: seconds between samples (default: the sources' layout's, 1 s here, 5 s
    for a job). ``cells`` registers cell marks on ``shell`` (an IPython shell:
    ``%gpuwatch`` passes its own; in a notebook, ``shell=get_ipython()``) while the watcher
    runs. Without a shell no cell is marked: this core never looks for one.

    ``price`` puts a cost on every cell and on the idle time (dollars per hour, or per
    GPU-hour for a job); ``idle_alert`` (seconds, or ``"30m"``, ``"2h"``) raises an alert,
    and calls ``on_idle`` with it, when every watched GPU has been idle that long while this
    kernel holds GPU memory (without a GPU: while no cell runs). See
    :mod:`gpumagic.monitor.cost`.
    """

    def __init__(
        self,
        sources: Sequence[Source] | None = None,
        *,
        interval: float | None = None,
        window: float = 300.0,
        log: str | os.PathLike[str] | None = None,
        cells: bool = True,
        shell: Any = None,
        price: float | None = None,
        idle_alert: float | str | None = None,
        on_idle: Callable[[Alert], object] | None = None,
    ) -> None:
        self.sources: tuple[Source, ...] = tuple(
            machine_sources() if sources is None else sources
        )
        if not self.sources:
            raise ValueError("a watcher needs a source to read")
        self.layout = self.sources[0].layout
        if any(s.layout is not self.layout for s in self.sources):
            raise ValueError(
                "the sources of one watcher fill one layout: "
                f"{sorted({s.layout.view for s in self.sources})} cannot share a watcher"
            )
        self.interval, floor_note = _check_interval(
            self.layout.interval_s if interval is None else interval
        )
        self.price = parse_price(price)
        self.idle_alert_s = parse_duration(idle_alert) if idle_alert is not None else None
        if on_idle is not None and not callable(on_idle):
            raise ValueError(f"on_idle must be callable, got {on_idle!r}")
        self.window = _check_window(window, self.interval)
        self.reason = next((s.reason for s in self.sources if s.reason is not None), None)
        self.origin = " · ".join(s.origin for s in self.sources if s.origin)
        self._notes: list[str] = [floor_note] if floor_note else []
        self._rows_lock = threading.Lock()  # devices and the ring's width change together
        self._counts = [len(s.devices) for s in self.sources]
        self._has_gpus = [any(d.kind == CUDA for d in s.devices) for s in self.sources]
        self.devices: tuple[WatchedDevice, ...] = tuple(d for s in self.sources for d in s.devices)
        self._ring = Ring(
            capacity_for(self.window, self.interval), len(self.devices), len(self.layout.metrics)
        )
        self._meter = CostMeter(
            self.devices, self.price, self.idle_alert_s, on_idle, self.layout.price_per_gpu
        )
        # Opened here, before any thread: an unwritable path is a ValueError naming it.
        self._log = CsvLog(log, self.layout, self.devices) if log is not None else None

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
            self._read_history()
            self._meter.start(self.started)
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
            self._meter.close(self.stopped_at, self.marks)
            if self._log is not None:
                self._log.close()
            for source in self.sources:
                source.close()
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

    @property
    def gpus(self) -> tuple[WatchedDevice, ...]:
        """The GPUs watched (this machine's, or a job's on every node)."""
        return tuple(d for d in self.devices if d.kind == CUDA)

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
        with self._rows_lock:
            devices = self.devices
            last = self._ring.last()
            now = last[0] if last is not None else time.time()
            times, values = self._ring.since(now - self.window)
        with self._state_lock:
            alerts = list(self._alerts)
            seen = list(self._alerts_seen.values())
        return Snapshot(
            layout=self.layout,
            devices=devices,
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
            origin=self.origin,
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
        tables = [t for s in self.sources if (t := s.processes()) is not None]
        if len(tables) == 1:
            return tables[0]
        merged = ProcessTable(time=max((t.time for t in tables), default=math.nan))
        for table in tables:
            merged.rows += table.rows
            merged.notes += table.notes
            merged.read = merged.read or table.read
        return merged

    def _with_processes(self, snap: Snapshot) -> Snapshot:
        return dataclasses.replace(snap, processes=self.processes())

    def notes(self) -> list[str]:
        """Why some values are missing: unsupported metrics, lost GPUs, log or source errors."""
        out = list(self._notes)
        for source in self.sources:
            out.extend(source.notes())
        if self._log is not None and self._log.error:
            out.append(self._log.error)
        if self.last_error:
            out.append(f"sampling error ({self.sample_errors} so far): {self.last_error}")
        if self._subscriber_error:
            out.append(self._subscriber_error)
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
        parts = [source.read(t) for source in self.sources]
        self._follow_devices()
        block = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._push(t, block)

        def fold(cell: CellRecord) -> None:
            for source, rows in zip(self.sources, parts):
                source.fold(cell, rows)

        self.marks.fold(t, fold)
        self._update_alerts(t)
        idle, holds, energy = combine(
            [
                (len(rows), gpus, s.meter(rows))
                for s, rows, gpus in zip(self.sources, parts, self._has_gpus)
            ]
        )
        self._meter.sample(t, self.marks, idle, holds, energy)
        alert = self._meter.alert  # the idle alert, which the meter keeps
        if alert is not None:
            with self._state_lock:
                self._alerts = [*self._alerts, alert]
            self._seen(t, [alert])

    def _push(self, t: float, block: np.ndarray) -> None:
        self._ring.push(t, block)
        if self._log is not None:
            self._log.write(t, block, self.devices)

    def _follow_devices(self) -> None:
        """A source found devices (a node joined a job): the ring widens, the samples so far
        keep their rows, the new rows come at the end of that source's."""
        counts = [len(s.devices) for s in self.sources]
        if counts == self._counts:
            return
        positions: list[int] = []
        start = 0
        for before, now in zip(self._counts, counts):
            positions += range(start, start + before)
            start += now
        devices = tuple(d for s in self.sources for d in s.devices)
        with self._rows_lock:
            self._ring.widen(positions, len(devices))
            self._meter.widen(devices, positions)
            self.devices, self._counts = devices, counts
            self._has_gpus = [any(d.kind == CUDA for d in s.devices) for s in self.sources]

    def _read_history(self) -> None:
        """The sources' samples from before the start, in time order (a job's recent past)."""
        found: list[tuple[float, int, np.ndarray]] = []
        for i, source in enumerate(self.sources):
            try:
                found += [(t, i, rows) for t, rows in source.history(
                    self.started - self.window, self.started, self.interval
                )]
            except Exception as exc:  # a source's history is a bonus: note, then sample on
                self._notes.append(f"the window's history could not be read: {exc}")
        self._follow_devices()
        for t, i, rows in sorted(found, key=lambda x: (x[0], x[1])):
            block = np.full((len(self.devices), len(self.layout.metrics)), np.nan)
            start = sum(self._counts[:i])
            block[start : start + len(rows)] = rows
            self._push(t, block)

    def _update_alerts(self, t: float) -> None:
        running = self.marks.running()
        # One copy of the ring's tail for every source that looks back (the longest asked
        # for so far, sliced for shorter spans): this runs at every sample.
        held: list[tuple[int | None, np.ndarray, np.ndarray]] = []

        def samples(n: int | None) -> tuple[np.ndarray, np.ndarray]:
            if held:
                m, times, values = held[0]
                if n is None and m is None:
                    return times, values
                if n is not None and m is not None and n <= m:
                    return times[-n:], values[-n:]
            if n is None:
                last = self._ring.last()
                times, values = self._ring.since(last[0] - self.window if last else -math.inf)
            else:
                times, values = self._ring.tail(n)
            held[:] = [(n, times, values)]
            return times, values

        def recent_of(rows: slice) -> Recent:
            def recent(seconds: float | None) -> tuple[np.ndarray, np.ndarray]:
                n = None if seconds is None else math.ceil(seconds / self.interval) + 2
                times, values = samples(n)
                return times, values[:, rows]

            return recent

        alerts: list[Alert] = []
        start = 0
        for source, count in zip(self.sources, self._counts):
            alerts += source.alerts(recent_of(slice(start, start + count)), running)
            start += count
        with self._state_lock:
            self._alerts = alerts
        self._seen(t, alerts)

    def _seen(self, t: float, alerts: list[Alert]) -> None:
        """Count each alert's samples since it first showed (the summary's "alerts seen")."""
        with self._state_lock:
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
        gpus = self.gpus
        hosts = len({d.host for d in gpus if d.host is not None})
        if gpus:
            what = f"{len(gpus)} GPU(s)" + (f" on {hosts} node(s)" if hosts else "")
        else:
            what = f"host only ({self.reason})"
        origin = f", {self.origin}" if self.origin else ""
        log = f", log={self.log_path!r}" if self.log_path else ""
        return f"<gpumagic Watcher {state}, every {self.interval:g} s, {what}{origin}{log}>"


# -- the current watcher: one per process, whatever it reads --------------------------------
_current: Watcher | None = None
_current_lock = threading.RLock()
_atexit_registered = False


def _register_atexit() -> None:
    # A script that never calls stop() would otherwise have the daemon thread killed
    # mid-call at interpreter shutdown; stop_current closes the log cleanly.
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(stop_current)
        _atexit_registered = True


def current() -> Watcher | None:
    """The running watcher, if any."""
    return _current


def stop_current() -> WatchResult | None:
    """Stop the running watcher, if any (``%unload_ext`` and kernel shutdown); a metrics
    endpoint serving it stops with it."""
    with _current_lock:
        watcher = _current
    return watcher.stop() if watcher is not None else None
