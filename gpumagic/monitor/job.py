"""``%gpuwatch --prometheus``: a job's GPUs, every node's, through Prometheus and DCGM.

On a cluster, each node runs NVIDIA's dcgm-exporter (``:9400/metrics``) and Prometheus
scrapes them all; a notebook that drives a multi-node job can read every GPU of the job
from there, which NVML (this machine's GPUs only) cannot. A :class:`JobWatcher` asks
Prometheus for the DCGM fields in :data:`gpumagic.monitor.dcgm.JOB_FIELDS` of every GPU
its selector matches: the window's history once (``query_range``), then the values now
(``query``) every ``interval`` in a background thread, one request each time for all
fields and GPUs. The values are Prometheus's: at each evaluation time, the latest scrape
within its lookback (polling faster than the scrape interval repeats values, as a Grafana
panel does).

Like the NVML :class:`~gpumagic.monitor.watcher.Watcher` it validates everything in its
constructor (the URL answers, the selector matches GPUs, which fields exist), so a wrong
URL or selector fails at once, with a message naming it, before any thread exists; marks
the cells of a shell it is given; publishes (``seq``, ``subscribe()``) and never draws.
A poll that fails (Prometheus restarting) is a note, and the next one runs as usual.

Times are this machine's clock and Prometheus's; cell marks line up with the series as
far as the two clocks agree (NTP keeps cluster nodes within milliseconds).
"""

from __future__ import annotations

import csv
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from gpumagic.monitor import dcgm
from gpumagic.monitor.cells import CellMarks
from gpumagic.monitor.csvlog import timestamp
from gpumagic.monitor.job_result import SERIES_COLUMNS, JobResult, JobStatus
from gpumagic.monitor.job_stats import (
    JobGpu,
    JobSnapshot,
    energy_deltas,
    gpu_from_labels,
    job_alerts,
)
from gpumagic.monitor.prometheus import (
    DEFAULT_TIMEOUT_S,
    PrometheusClient,
    PrometheusError,
    Series,
    normalize_selector,
    selector_expr,
)
from gpumagic.monitor.ring import Ring, capacity_for
from gpumagic.monitor.watcher import MIN_SPACING, WatchEvent, _check_interval, _check_window
from gpumagic.units import parse_price

__all__ = ["JobWatcher"]

# Prometheus refuses a range query of more than 11,000 points per series.
_MAX_POINTS = 10_000
_JOIN_TIMEOUT_S = 10.0
_NAMES = tuple(f.name for f in dcgm.JOB_FIELDS)


class JobWatcher:
    """Polls Prometheus for the DCGM series of a job's GPUs in a background thread.

    ``prometheus``: the server's URL (``http://prometheus:9090``). ``selector``: PromQL label
    matchers that pick the job's GPUs (``Hostname=~"node-[0-7]"``, ``namespace="team-a",
    pod=~"train-.*"``; braces optional; default: every GPU Prometheus knows). ``price``:
    dollars per GPU-hour, so a cell's cost is its duration times the GPUs watched times the
    price. ``timeout``: seconds any one request to Prometheus may take.
    """

    def __init__(
        self,
        prometheus: str,
        selector: str | None = None,
        interval: float = 5.0,
        window: float = 300.0,
        log: str | os.PathLike[str] | None = None,
        *,
        cells: bool = True,
        shell: Any = None,
        price: float | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.interval, floor_note = _check_interval(interval)
        self.window = _check_window(window, self.interval)
        self.price = parse_price(price)
        self.client = PrometheusClient(prometheus, timeout)
        self.url = self.client.url
        self.selector = normalize_selector(selector)
        self._expr = selector_expr(_NAMES, self.selector)
        self._notes: list[str] = [floor_note] if floor_note else []
        self._thread: threading.Thread | None = None
        self._result: JobResult | None = None
        self._gpus: list[JobGpu] = []
        self._gpu_rows: dict[tuple[str, str], int] = {}
        self._blank: dict[str, set[str]] = {}
        self.missing: tuple[str, ...] = ()
        self._discover()
        self._ring_gpus = len(self._gpus)
        self._ring = Ring(
            capacity_for(self.window, self.interval), self._ring_gpus, len(dcgm.JOB_FIELDS)
        )
        # Opened here, before any thread: an unwritable path is a ValueError naming it.
        self._log = JobCsv(log) if log is not None else None

        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.marks = CellMarks(on_cell_end=self._wake.set)
        self._want_cells = cells
        self._shell = shell
        self._energy_mj = np.zeros(len(self._gpus))
        self._last_energy: np.ndarray | None = None
        self._last_poll: float | None = None
        self.history_from: float | None = None
        self.started = math.nan
        self.stopped_at: float | None = None
        self.polls = 0
        self.poll_errors = 0
        self.last_error: str | None = None
        self._subscribers: list[Callable[[WatchEvent], None]] = []
        self._stop_published = False
        self._subscriber_error: str | None = None

    # -- what Prometheus holds --------------------------------------------------------------
    def _discover(self) -> None:
        """The job's GPUs and fields, now; a clear error when there are none."""
        found = self.client.query(self._expr)
        if not found:
            raise PrometheusError(self._explain_empty())
        # node by node, GPU by GPU (a GPU that appears later is added at the end)
        for s in sorted(found, key=lambda s: _order(gpu_from_labels(s.labels))):
            self._row_of(s.labels)
        present = {s.name for s in found}
        self.missing = tuple(n for n in dcgm.REQUIRED if n not in present)
        where = f" matching {{{self.selector}}}" if self.selector else ""
        for name in self.missing:
            what = {
                dcgm.UTIL: "utilisation and stragglers are",
                dcgm.ENERGY: "energy per cell is",
            }.get(name, "its values are")
            self._notes.append(
                f"{name}: no series at {self.url}{where}; {what} not shown "
                "(is the field in dcgm-exporter's counters CSV?)"
            )
        optional = [f.name for f in dcgm.JOB_FIELDS if not f.required and f.name not in present]
        if optional:
            self._notes.append(
                f"not exported for these GPUs: {', '.join(optional)} (profiling fields need "
                "a data-centre GPU and dcgm-exporter's DCP counters)"
            )

    def _explain_empty(self) -> str:
        if self.selector:
            anywhere = self.client.query(selector_expr(_NAMES, ""))
            if anywhere:
                example = gpu_from_labels(anywhere[0].labels)
                labels = ", ".join(
                    f'{k}="{v}"' for k, v in sorted(anywhere[0].labels.items()) if k != "__name__"
                )
                return (
                    f"no GPU series at {self.url} match the selector {{{self.selector}}}: "
                    f"Prometheus has DCGM series for {len({gpu_from_labels(s.labels).key for s in anywhere})} "
                    f"GPUs, none with these labels (one is {example.label}: {{{labels}}})"
                )
        return (
            f"Prometheus at {self.url} has no DCGM series ({dcgm.UTIL} and the other "
            f"{len(_NAMES) - 1} fields): is dcgm-exporter (port 9400) one of its scrape targets?"
        )

    def _row_of(self, labels: dict[str, str]) -> int:
        gpu = gpu_from_labels(labels)
        row = self._gpu_rows.get(gpu.key)
        if row is None:
            row = len(self._gpus)
            self._gpus.append(gpu)
            self._gpu_rows[gpu.key] = row
        return row

    def _block(self, found: list[Series], at: int = -1) -> np.ndarray:
        """One sample's (gpus, fields) values from a query's series (``at``: which point)."""
        rows = [self._row_of(s.labels) for s in found]
        block = np.full((len(self._gpus), len(dcgm.JOB_FIELDS)), np.nan)
        for s, row in zip(found, rows):
            f = dcgm.FIELD_INDEX.get(s.name)
            if f is None or not len(s.values):
                continue
            value = float(s.values[at])
            if dcgm.is_blank(value, dcgm.JOB_FIELDS[f]):
                self._blank.setdefault(s.name, set()).add(self._gpus[row].label)
                continue
            block[row, f] = value
        return block

    def _push(self, t: float, block: np.ndarray) -> None:
        if block.shape[0] > self._ring_gpus:
            self._grow(block.shape[0])
        self._ring.push(t, block)
        if self._log is not None:
            self._log.write(t, block, self._gpus)

    def _grow(self, gpus: int) -> None:
        # a GPU seen for the first time (a node joined): a wider ring with the samples so far
        times, values = self._ring.tail()
        ring = Ring(self._ring.capacity, gpus, len(dcgm.JOB_FIELDS))
        pad = np.full((len(times), gpus - values.shape[1], values.shape[2]), np.nan)
        for t, block in zip(times, np.concatenate([values, pad], axis=1)):
            ring.push(float(t), block)
        ring.pushed = self._ring.pushed
        self._ring, self._ring_gpus = ring, gpus
        self._energy_mj = np.concatenate([self._energy_mj, np.zeros(gpus - len(self._energy_mj))])

    def _history(self) -> None:
        """The window before the start, once: the chart has the job's recent past at once."""
        end = time.time()
        start = end - self.window
        step = max(self.interval, self.window / _MAX_POINTS)
        found = self.client.query_range(self._expr, start, end, step)
        rows = [self._row_of(s.labels) for s in found]  # every GPU first: one block width
        by_time: dict[float, list[tuple[int, int, float]]] = {}
        for s, row in zip(found, rows):
            f = dcgm.FIELD_INDEX.get(s.name)
            if f is None:
                continue
            for t, value in zip(s.times.tolist(), s.values.tolist()):
                if not dcgm.is_blank(value, dcgm.JOB_FIELDS[f]):
                    by_time.setdefault(t, []).append((row, f, value))
        for t in sorted(by_time):
            block = np.full((len(self._gpus), len(dcgm.JOB_FIELDS)), np.nan)
            for row, f, value in by_time[t]:
                block[row, f] = value
            self._push(t, block)
        self.history_from = start

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> JobWatcher:
        """Read the window's history, take a first sample and start polling; returns self."""
        if self._result is not None:
            raise RuntimeError("this watcher was stopped; start a new one with gpumagic.watch()")
        if self._thread is not None:
            return self
        if self._want_cells and self._shell is not None:
            self.marks.attach(self._shell)
        self.started = time.time()
        try:
            self._history()
        except PrometheusError as exc:
            self._notes.append(f"the window's history could not be read: {exc}")
        self.poll_now()
        self._thread = threading.Thread(target=self._run, name="gpumagic-job-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> JobResult:
        """Stop polling, close the log, unregister cell marks; returns the result (idempotent)."""
        with self._lock:
            if self._result is not None:
                return self._result
            self._stopping.set()
            self._wake.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_JOIN_TIMEOUT_S)
        self.marks.detach()
        self.stopped_at = time.time()
        self.marks.close_all(self.stopped_at)
        if self._log is not None:
            self._log.close()
        result = JobResult(self.snapshot(all_cells=True))
        with self._lock:
            self._result = result
        self._publish("stop")
        return result

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def seq(self) -> int:
        return self._ring.pushed

    @property
    def log_path(self) -> str | None:
        return str(self._log.path) if self._log is not None else None

    @property
    def gpus(self) -> tuple[JobGpu, ...]:
        return tuple(self._gpus)

    def attach(self, shell: Any) -> None:
        self.marks.attach(shell)

    def detach(self) -> None:
        self.marks.detach()

    def subscribe(self, callback: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """As :meth:`Watcher.subscribe <gpumagic.monitor.watcher.Watcher.subscribe>`: told of
        every sample (on the polling thread) and, once, of the stop."""
        with self._lock:
            stopped = self._stop_published
            if not stopped:
                self._subscribers.append(callback)
        if stopped:
            self._tell(callback, "stop")

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def _publish(self, event: WatchEvent) -> None:
        with self._lock:
            if self._stop_published:
                return
            subscribers = list(self._subscribers)
            if event == "stop":
                self._stop_published = True
                self._subscribers.clear()
        for callback in subscribers:
            self._tell(callback, event)

    def _tell(self, callback: Callable[[WatchEvent], None], event: WatchEvent) -> None:
        try:
            callback(event)
        except Exception as exc:  # a front end's bug must not stop the polling
            self._subscriber_error = f"{event!r} subscriber failed: {type(exc).__name__}: {exc}"

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self, all_cells: bool = False) -> JobSnapshot:
        """A consistent copy of the window; cells of the window only unless ``all_cells``."""
        last = self._ring.last()
        latest = last[0] if last is not None else time.time()
        times, values = self._ring.since(latest - self.window)
        if self.running or self.stopped_at is None:
            now = max(time.time(), latest)
        else:
            now = self.stopped_at
        snap = JobSnapshot(
            url=self.url,
            selector=self.selector,
            gpus=tuple(self._gpus[: values.shape[1]]),
            times=times,
            values=values,
            cells=self.marks.records(None if all_cells else now - self.window),
            alerts=[],
            notes=self.notes(),
            interval=self.interval,
            window=self.window,
            started=self.started,
            now=now,
            running=self.running,
            log_path=self.log_path,
            polls=self.polls,
            seq=self._ring.pushed,
            price=self.price,
            energy_mj=self._energy_mj.copy(),
            missing=self.missing,
            history_from=self.history_from,
        )
        snap.alerts = job_alerts(snap)
        return snap

    def status(self) -> JobStatus:
        """The latest values of every GPU, the alerts (stragglers, XID errors) and notes."""
        return JobStatus(self.snapshot())

    def result(self) -> JobResult:
        """The summary so far, without stopping (``stop()`` returns the final one)."""
        return (
            self._result if self._result is not None else JobResult(self.snapshot(all_cells=True))
        )

    def notes(self) -> list[str]:
        out = list(self._notes)
        for name, gpus in sorted(self._blank.items()):
            shown = ", ".join(sorted(gpus)[:4]) + (" ..." if len(gpus) > 4 else "")
            out.append(f"{name}: DCGM published its 'no value' code for {shown}; left out")
        if self.last_error:
            out.append(f"polling Prometheus failed ({self.poll_errors} so far): {self.last_error}")
        if self._log is not None and self._log.error:
            out.append(self._log.error)
        if self._subscriber_error:
            out.append(self._subscriber_error)
        return out

    # -- polling ----------------------------------------------------------------------------
    def poll_now(self) -> None:
        """Ask Prometheus for the values now (also what the thread does every interval)."""
        t = time.time()
        try:
            found = self.client.query(self._expr, at=t)
        except PrometheusError as exc:  # never into the user's cells; shown in the notes
            self.poll_errors += 1
            self.last_error = str(exc)
            return
        self.last_error = None
        block = self._block(found)
        self._push(t, block)
        self._account_energy(t, block[:, dcgm.FIELD_INDEX[dcgm.ENERGY]])
        self.marks.fold(t, np.zeros((0, 0)), [], None)
        self.polls += 1
        self._publish("sample")

    def _account_energy(self, t: float, counter: np.ndarray) -> None:
        # The counter is each board's mJ since its driver loaded: what moved between two polls
        # is the job's energy in that time, spread over the cells that ran in it.
        if self._last_energy is not None and self._last_poll is not None:
            moved = energy_deltas(self._last_energy, counter)
            self._energy_mj[: len(moved)] += moved[: len(self._energy_mj)]
            self.marks.add_energy(self._last_poll, t, float(moved.sum()))
        known = ~np.isnan(counter)
        if self._last_energy is None:
            self._last_energy = counter.copy()
        else:
            last = np.concatenate(
                [self._last_energy, np.full(len(counter) - len(self._last_energy), np.nan)]
            )
            self._last_energy = np.where(known, counter, last)
        self._last_poll = t

    def _run(self) -> None:
        next_due = time.monotonic() + self.interval
        last = time.monotonic()
        while not self._stopping.is_set():
            delay = next_due - time.monotonic()
            if delay > 0 and self._wake.wait(delay):
                self._wake.clear()
            if self._stopping.is_set():
                break
            gap = MIN_SPACING - (time.monotonic() - last)
            if gap > 0 and self._stopping.wait(gap):
                break
            self.poll_now()
            last = time.monotonic()
            if last >= next_due:
                next_due += self.interval
                if next_due <= last:
                    next_due = last + self.interval

    def __repr__(self) -> str:
        state = (
            "running"
            if self.running
            else ("stopped" if self._result is not None else "not started")
        )
        hosts = len({g.host for g in self._gpus})
        return (
            f"<gpumagic JobWatcher {state}, {self.url}"
            + (f" {{{self.selector}}}" if self.selector else "")
            + f", {len(self._gpus)} GPU(s) on {hosts} node(s), every {self.interval:g} s>"
        )


def _order(gpu: JobGpu) -> tuple[str, int, str]:
    return (gpu.host, int(gpu.gpu) if gpu.gpu.isdigit() else 1 << 30, gpu.gpu)


class JobCsv:
    """The job's series as CSV, one row per value: the same columns as ``JobResult.series``.

    As the NVML log does: the file is opened (and checked) on construction, appended to when
    it already has this header, refused when it holds anything else, flushed every sample.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self.error: str | None = None
        self.rows_written = 0
        header = ",".join(SERIES_COLUMNS)
        try:
            if self.path.exists() and self.path.stat().st_size > 0:
                with self.path.open(encoding="utf-8", newline="") as f:
                    first = f.readline().rstrip("\r\n")
                if first != header:
                    raise ValueError(
                        f"log file {self.path} already holds other data (its first line is not "
                        f"the job log's header {header!r}); choose another path"
                    )
                self._file: IO[str] = self.path.open("a", encoding="utf-8", newline="")
            else:
                self._file = self.path.open("w", encoding="utf-8", newline="")
                self._file.write(header + "\n")
                self._file.flush()
        except OSError as exc:
            raise ValueError(f"cannot write the log {self.path}: {exc.strerror or exc}") from None
        self._writer = csv.writer(self._file)

    def write(self, t: float, block: np.ndarray, gpus: list[JobGpu]) -> None:
        if self._file.closed:
            return
        stamp = timestamp(t)
        try:
            for g, f in zip(*np.nonzero(~np.isnan(block))):
                gpu = gpus[int(g)]
                self._writer.writerow(
                    [
                        stamp,
                        dcgm.JOB_FIELDS[int(f)].name,
                        gpu.host,
                        gpu.gpu,
                        gpu.uuid,
                        gpu.model,
                        repr(float(block[g, f])),
                    ]
                )
                self.rows_written += 1
            self._file.flush()
        except OSError as exc:  # a full disk must not stop the polling
            self.error = f"writing the log {self.path} failed: {exc.strerror or exc}"

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
