"""The CSV log: one row per device per sample, flushed after every sample so a crash of
the kernel loses at most the sample being written.

Column names follow ``nvidia-smi --query-gpu=... --format=csv,nounits`` (units in the
header, bare numbers in the cells); host metrics use names of the same style. Missing
values are empty cells (pandas reads NaN) rather than nvidia-smi's ``[N/A]``.
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

ID_COLUMNS = ("timestamp", "device", "index", "cuda.index", "name")
THROTTLE_NAMES_COLUMN = "clocks_throttle_reasons.names"


def columns(with_gpus: bool) -> list[str]:
    """The header: GPU columns only when GPUs are watched (a host-only log stays narrow)."""
    cols = list(ID_COLUMNS)
    for metric in M.METRICS:
        if metric.scope == CUDA and not with_gpus:
            continue
        cols.append(metric.csv)
        if metric.key == "throttle_reasons":
            cols.append(THROTTLE_NAMES_COLUMN)
    return cols


def timestamp(t: float) -> str:
    """ISO 8601 local time with offset and milliseconds: unambiguous across time zones and DST."""
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


class CsvLog:
    """Opens (and validates) the file on construction, so a bad path fails before any thread starts.

    An existing file with the same header is appended to (re-running ``%gpuwatch --log x.csv``
    continues the log); an existing non-empty file with any other content is refused rather
    than overwritten, because the path may be someone's data.
    """

    def __init__(self, path: str | os.PathLike[str], devices: Sequence[WatchedDevice]) -> None:
        self.path = Path(path).expanduser()
        self._devices = list(devices)
        with_gpus = any(d.kind == CUDA for d in devices)
        self.header = columns(with_gpus)
        self._metrics = [m for m in M.METRICS if with_gpus or m.scope != CUDA]
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

    def write(self, t: float, block: np.ndarray) -> None:
        """Write one sample (a row per device) and flush; a failing disk disables the log, noted."""
        if self._file is None:
            return
        stamp = timestamp(t)
        rows = []
        for device, values in zip(self._devices, block):
            row = [
                stamp,
                device.key,
                "" if device.nvml_index is None else str(device.nvml_index),
                "" if device.cuda_index is None else str(device.cuda_index),
                device.name,
            ]
            for metric in self._metrics:
                value = float(values[M.INDEX[metric.key]])
                row.append(M.csv_value(metric, value))
                if metric.key == "throttle_reasons":
                    row.append(";".join(M.throttle_names(value)))
            rows.append(row)
        try:
            self._writer.writerows(rows)
            self._file.flush()
            self.rows_written += len(rows)
        except OSError as exc:  # disk full, file system gone: stop logging, keep sampling
            self.error = f"log {str(self.path)!r} stopped: {exc}"
            self.close()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
