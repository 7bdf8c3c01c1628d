"""A job's GPUs, every node's, through Prometheus and DCGM: a source for the one watcher.

On a cluster, each node runs NVIDIA's dcgm-exporter (``:9400/metrics``) and Prometheus
scrapes them all; a notebook that drives a multi-node job can read every GPU of the job
from there, which NVML (this machine's GPUs only) cannot. A :class:`PrometheusSource` asks
Prometheus for the DCGM fields in :data:`gpumagic.monitor.job.dcgm.JOB_FIELDS` of every
GPU its selector matches: the window's history once (``query_range``), then the values
now (``query``) at every sample, one request each time for all fields and GPUs. The values
are Prometheus's: at each evaluation time, the latest scrape within its lookback (polling
faster than the scrape interval repeats values, as a Grafana panel does).

It checks everything when built (the URL answers, the selector matches GPUs, which fields
exist), so a wrong URL or selector fails at once, with a message naming it, before any
watcher exists. A GPU first seen later (a node joined) is a new row. A value DCGM could
not read comes as one of its blank codes; it is left out and named in the notes.

Times are this machine's clock and Prometheus's; cell marks line up with the series as
far as the two clocks agree (NTP keeps cluster nodes within milliseconds).
"""

from __future__ import annotations

import numpy as np

from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.cost import Metered, gpus_idle
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.job import dcgm
from gpumagic.monitor.job.frames import cells_frame, gpu_frame, stragglers_frame, xid_frame
from gpumagic.monitor.job.prometheus import (
    DEFAULT_TIMEOUT_S,
    PrometheusClient,
    PrometheusError,
    Series,
    normalize_selector,
    selector_expr,
)
from gpumagic.monitor.job.stats import ENERGY, UTIL, energy_deltas, gpu_from_labels, job_alerts
from gpumagic.monitor.snapshot import Label, Layout
from gpumagic.monitor.source import Recent, SourceBase

__all__ = ["JOB", "PrometheusSource"]

# Prometheus refuses a range query of more than 11,000 points per series.
_MAX_POINTS = 10_000
_NAMES = tuple(f.name for f in dcgm.JOB_FIELDS)

JOB = Layout(
    view="job",
    metrics=dcgm.JOB_FIELDS,
    labels=(
        Label("Hostname", "Hostname", lambda d: d.host),
        Label("gpu", "gpu", lambda d: d.node_index),
        Label("UUID", "UUID", lambda d: d.uuid or ""),
        Label("modelName", "modelName", lambda d: d.name),
    ),
    time_column="time",
    per_value=True,
    # Prometheus scrapes dcgm-exporter every 15-30 s on most clusters, so polling it every
    # second only repeats values.
    interval_s=5.0,
    price_per_gpu=True,
    cells=cells_frame,
    frames={"gpus": gpu_frame, "stragglers": stragglers_frame, "xid_errors": xid_frame},
)


def _order(gpu: WatchedDevice) -> tuple[str, int, str]:
    index = gpu.node_index or ""
    return (gpu.host or "", int(index) if index.isdigit() else 1 << 30, index)


class PrometheusSource(SourceBase):
    """The DCGM series of a job's GPUs, from one Prometheus server.

    ``prometheus``: the server's URL (``http://prometheus:9090``). ``selector``: PromQL label
    matchers that pick the job's GPUs (``Hostname=~"node-[0-7]"``, ``namespace="team-a",
    pod=~"train-.*"``; braces optional; default: every GPU Prometheus knows). ``timeout``:
    seconds any one request to Prometheus may take.
    """

    layout = JOB

    def __init__(
        self, prometheus: str, selector: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.client = PrometheusClient(prometheus, timeout)
        self.url = self.client.url
        self.selector = normalize_selector(selector)
        self.origin = f"Prometheus {self.url}" + (f" {{{self.selector}}}" if self.selector else "")
        self._expr = selector_expr(_NAMES, self.selector)
        self._notes: list[str] = []
        self._devices: list[WatchedDevice] = []
        self._rows: dict[str, int] = {}
        self._blank: dict[str, set[str]] = {}
        self._counters: np.ndarray | None = None
        self.missing: tuple[str, ...] = ()
        self._discover()

    @property
    def devices(self) -> tuple[WatchedDevice, ...]:
        return tuple(self._devices)

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
        row = self._rows.get(gpu.key)
        if row is None:
            row = len(self._devices)
            self._devices.append(gpu)
            self._rows[gpu.key] = row
        return row

    def _block(self, found: list[Series]) -> np.ndarray:
        """One sample's (gpus, fields) values from a query's series (their latest point)."""
        rows = [self._row_of(s.labels) for s in found]
        block = np.full((len(self._devices), len(dcgm.JOB_FIELDS)), np.nan)
        for s, row in zip(found, rows):
            f = dcgm.FIELD_INDEX.get(s.name)
            if f is None or not len(s.values):
                continue
            value = float(s.values[-1])
            if dcgm.is_blank(value, dcgm.JOB_FIELDS[f]):
                self._blank.setdefault(s.name, set()).add(self._devices[row].label)
                continue
            block[row, f] = value
        return block

    # -- the source -------------------------------------------------------------------------
    def history(self, start: float, end: float, step: float) -> list[tuple[float, np.ndarray]]:
        """The window before the start, once: the chart has the job's recent past at once."""
        try:
            found = self.client.query_range(
                self._expr, start, end, max(step, (end - start) / _MAX_POINTS)
            )
        except PrometheusError as exc:
            self._notes.append(f"the window's history could not be read: {exc}")
            return []
        rows = [self._row_of(s.labels) for s in found]  # every GPU first: one block width
        by_time: dict[float, list[tuple[int, int, float]]] = {}
        for s, row in zip(found, rows):
            f = dcgm.FIELD_INDEX.get(s.name)
            if f is None:
                continue
            for t, value in zip(s.times.tolist(), s.values.tolist()):
                if not dcgm.is_blank(value, dcgm.JOB_FIELDS[f]):
                    by_time.setdefault(t, []).append((row, f, value))
        out = []
        for t in sorted(by_time):
            block = np.full((len(self._devices), len(dcgm.JOB_FIELDS)), np.nan)
            for row, f, value in by_time[t]:
                block[row, f] = value
            out.append((t, block))
        return out

    def read(self, t: float) -> np.ndarray:
        """The values now: a query that fails (Prometheus restarting) costs this sample only."""
        return self._block(self.client.query(self._expr, at=t))

    def alerts(self, recent: Recent, running: CellRecord | None) -> list[Alert]:
        times, values = recent(None)
        return job_alerts(self._devices, times, values)

    def meter(self, rows: np.ndarray) -> Metered:
        # The counter is each board's mJ since its driver loaded: what moved between two
        # samples is the job's energy in that time, spread over the cells that ran in it.
        idle = gpus_idle(rows[:, UTIL])
        if dcgm.ENERGY in self.missing:
            return Metered(idle=idle)
        counter = rows[:, ENERGY]
        previous = self._counters
        if previous is None:
            self._counters = counter.copy()
            return Metered(idle=idle, energy_mj=np.full(len(counter), np.nan))
        last = np.concatenate([previous, np.full(len(counter) - len(previous), np.nan)])
        self._counters = np.where(np.isnan(counter), last, counter)
        return Metered(idle=idle, energy_mj=energy_deltas(previous, counter))

    def notes(self) -> list[str]:
        out = list(self._notes)
        for name, gpus in sorted(self._blank.items()):
            shown = ", ".join(sorted(gpus)[:4]) + (" ..." if len(gpus) > 4 else "")
            out.append(f"{name}: DCGM published its 'no value' code for {shown}; left out")
        return out

    def __repr__(self) -> str:
        hosts = len({g.host for g in self._devices})
        return f"<PrometheusSource {self.origin}, {len(self._devices)} GPU(s) on {hosts} node(s)>"
