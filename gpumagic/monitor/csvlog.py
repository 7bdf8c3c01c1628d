"""The CSV log, flushed after every sample so a crash of the kernel loses at most the sample
being written. Its shape is the layout's:

- one row per device per sample (this machine): column names follow ``nvidia-smi
  --query-gpu=... --format=csv,nounits`` (units in the header, bare numbers in the cells);
  host metrics use names of the same style. Missing values are empty cells (pandas reads
  NaN) rather than nvidia-smi's ``[N/A]``.
- one row per value (a job's series): ``time, metric``, the row's labels (``Hostname``,
  ``gpu``, ``UUID``, ``modelName``) and ``value``, in the source's units; a missing value
  has no row.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import IO

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import metrics as M
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.snapshot import Layout

THROTTLE_NAMES_COLUMN = "clocks_throttle_reasons.names"


def header(layout: Layout, with_gpus: bool) -> list[str]:
    """The columns: a series' (time, metric, labels, value), or the time, the labels and
    the metrics, GPU columns only when GPUs are watched (a host-only log stays narrow)."""
    labels = [label.csv for label in layout.labels]
    if layout.per_value:
        return [layout.time_column, "metric", *labels, "value"]
    cols = [layout.time_column, *labels]
    for metric in layout.metrics:
        if metric.scope == CUDA and not with_gpus:
            continue
        cols.append(metric.csv)
        if metric.unit == "mask":
            cols.append(THROTTLE_NAMES_COLUMN)
    return cols


def timestamp(t: float) -> str:
    """ISO 8601 local time with offset and milliseconds: unambiguous across time zones and DST."""
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


def _label(value: str | int | None) -> str:
    return "" if value is None else str(value)


class CsvLog:
    """Opens (and validates) the file on construction, so a bad path fails before any thread starts.

    An existing file with the same header is appended to (re-running ``%gpuwatch --log x.csv``
    continues the log); an existing non-empty file with any other content is refused rather
    than overwritten, because the path may be someone's data.
    """

    def __init__(
        self, path: str | os.PathLike[str], layout: Layout, devices: Sequence[WatchedDevice]
    ) -> None:
        self.path = Path(path).expanduser()
        self.layout = layout
        with_gpus = any(d.kind == CUDA for d in devices)
        self.header = header(layout, with_gpus)
        self._metrics = [
            (i, m) for i, m in enumerate(layout.metrics) if with_gpus or m.scope != CUDA
        ]
        self.rows_written = 0
        self.error: str | None = None
        header_line = ",".join(self.header)
        if self.path.is_dir():
            raise ValueError(f"cannot write the gpuwatch log {str(self.path)!r}: it is a directory")
        append = False
        if self.path.exists() and self.path.stat().st_size > 0:
            try:
                with self.path.open(encoding="utf-8", newline="") as existing:
                    first = existing.readline().rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"cannot read the existing gpuwatch log {str(self.path)!r}: {exc}"
                ) from exc
            if first != header_line:
                raise ValueError(
                    f"{str(self.path)!r} exists and is not a gpuwatch log with these columns; "
                    "choose another path or remove the file"
                )
            append = True
        try:
            self._file: IO[str] | None = self.path.open(
                "a" if append else "w", encoding="utf-8", newline=""
            )
        except OSError as exc:
            raise ValueError(
                f"cannot write the gpuwatch log {str(self.path)!r}: {exc.strerror or exc}"
            ) from exc
        self._writer = csv.writer(self._file, lineterminator="\n")
        if not append:
            self._writer.writerow(self.header)
            self._file.flush()

    def write(self, t: float, block: np.ndarray, devices: Sequence[WatchedDevice]) -> None:
        """Write one sample and flush; a failing disk disables the log, noted."""
        if self._file is None:
            return
        stamp = timestamp(t)
        if self.layout.per_value:
            rows = self._values(stamp, block, devices)
        else:
            rows = self._devices(stamp, block, devices)
        try:
            self._writer.writerows(rows)
            self._file.flush()
            self.rows_written += len(rows)
        except OSError as exc:  # disk full, file system gone: stop logging, keep sampling
            self.error = f"log {str(self.path)!r} stopped: {exc}"
            self.close()

    def _devices(
        self, stamp: str, block: np.ndarray, devices: Sequence[WatchedDevice]
    ) -> list[list[str]]:
        rows = []
        for device, values in zip(devices, block):
            row = [stamp, *(_label(label.read(device)) for label in self.layout.labels)]
            for i, metric in self._metrics:
                value = float(values[i])
                row.append(M.csv_value(metric, value))
                if metric.unit == "mask":
                    row.append(";".join(M.throttle_names(value)))
            rows.append(row)
        return rows

    def _values(
        self, stamp: str, block: np.ndarray, devices: Sequence[WatchedDevice]
    ) -> list[list[str]]:
        rows = []
        for g, f in zip(*np.nonzero(~np.isnan(block))):
            device = devices[int(g)]
            labels = [_label(label.read(device)) for label in self.layout.labels]
            metric = self.layout.metrics[int(f)].key
            rows.append([stamp, metric, *labels, repr(float(block[g, f]))])
        return rows

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
