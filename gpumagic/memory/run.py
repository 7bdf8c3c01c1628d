"""One ``%%memtrace`` run, without IPython: a :class:`gpumagic.cell.MeasuredRun` that traces
memory per statement and makes the result.

``start`` opens the host's readers and the tracer (the probe the cell's statements call),
``stop`` closes the last statement and takes the tracer's totals, ``finish`` runs the
out-of-memory post-mortem when the cell ran out of memory and builds the
:class:`~gpumagic.memory.report.MemTrace`, ``close`` closes the readers. While the cell
runs, :meth:`MemtraceRun.status` is the live view's data.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumagic.cell import Statement, error_text
from gpumagic.device_kinds import CUDA, HOST
from gpumagic.memory.device import TracedDevice, cuda_device, resolve_device
from gpumagic.memory.holders import ModelMemory
from gpumagic.memory.oom import is_oom, post_mortem
from gpumagic.memory.probes import CudaMemory, HostMemory, allocator_backend_note
from gpumagic.memory.report import MemTrace
from gpumagic.memory.tracer import MemoryTracer, Timeline, TraceTotals

__all__ = ["MemtraceRun", "MemtraceStatus"]


@dataclass(frozen=True)
class MemtraceStatus:
    """What a live view shows while the cell runs: the statement running now (None between
    statements) and its hit count, and memory over the statements so far."""

    device_label: str
    statement: Statement | None
    hits: int
    timeline: Timeline


class MemtraceRun:
    """Trace one cell's memory per statement (a :class:`gpumagic.cell.MeasuredRun`).

    ``device``: ``--device`` (None: CUDA if there is one); an unknown or unusable device
    raises :class:`~gpumagic.memory.device.DeviceError` here, before anything is acquired.
    ``sync``: synchronise the traced CUDA device at every statement boundary, so each
    statement's time includes the GPU work it queued (kernels run asynchronously: without
    it, a statement's time is the host's, and the next statement that waits for the GPU is
    charged for the work). It has no effect when the host is traced. ``cell_filename``: the
    cell's code name (:attr:`gpumagic.cell.PreparedCell.filename`), where the release of an
    out-of-memory error's frames starts.
    """

    def __init__(
        self,
        statements: Sequence[Statement],
        namespace: Mapping[str, Any],
        device: str | None = None,
        *,
        sync: bool = False,
        cell_filename: str | None = None,
    ) -> None:
        self.device, self._cuda = resolve_device(device)
        self.statements = list(statements)
        self.namespace = namespace
        self.sync = sync
        self.cell_filename = cell_filename
        self._host: HostMemory | None = None
        self._tracer: MemoryTracer | None = None
        self._totals: TraceTotals | None = None

    # -- the lifecycle ---------------------------------------------------------------------
    def start(self) -> MemoryTracer:
        self._host = HostMemory()
        if self.device.kind == HOST:
            self.device = self.device.measured_by(self._host.why)
        reader = self._reader()
        breakdown = ModelMemory(self.namespace, self.device.holds()) if "torch" in sys.modules else None
        waiter = reader.synchronize if self.sync and isinstance(reader, CudaMemory) else None
        self._tracer = MemoryTracer(self.statements, reader, self._host, breakdown, sync=waiter)
        return self._tracer

    def stop(self) -> None:
        if self._tracer is not None:
            self._totals = self._tracer.finish()

    def finish(self, error: BaseException | None) -> MemTrace:
        """The result. After an out-of-memory error, also its report, and the release of the
        failed call's frames (see :func:`gpumagic.memory.oom.post_mortem`)."""
        assert self._tracer is not None and self._host is not None, "finish() before start()"
        totals = self._totals if self._totals is not None else self._tracer.finish()
        device = self._named_device()
        oom = None
        if error is not None and is_oom(error):
            found = post_mortem(
                error,
                traced=device,
                reader=self._reader(),
                host=self._host,
                namespace=self.namespace,
                cell_filename=self.cell_filename,
                rss_fallback=totals.final_host,
            )
            oom = found.report
            after = found.traced_after_release
            if after is not None:  # the cell's net change, once the failed call let go
                totals = totals.after_release(after.current, after.reserved)
        return MemTrace.from_totals(
            totals,
            device,
            error=error_text(error) if error is not None else "",
            oom=oom,
            host_method=self._host.method,
            notes=self._notes(totals, device),
        )

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
        if self._cuda is not None:
            self._cuda.close()

    # -- the live view's data (any thread) -------------------------------------------------
    def status(self) -> MemtraceStatus:
        tracer = self._tracer
        if tracer is None:
            return MemtraceStatus(self.device.label, None, 0, ())
        index, hits, timeline = tracer.live_state()
        statement = self.statements[index] if index >= 0 else None
        return MemtraceStatus(self.device.label, statement, hits, tuple(timeline))

    # -- helpers ---------------------------------------------------------------------------
    def _reader(self) -> CudaMemory | HostMemory:
        if self._cuda is not None:
            return self._cuda
        assert self._host is not None
        return self._host

    def _named_device(self) -> TracedDevice:
        """The traced device, named now if the cell initialised CUDA: its name can be read
        without side effects once CUDA is initialised."""
        reader = self._cuda
        if reader is not None and reader.name is None:
            try:
                if reader.describe():
                    return cuda_device(reader)
            except Exception:
                pass
        return self.device

    def _notes(self, totals: TraceTotals, device: TracedDevice) -> list[str]:
        notes: list[str] = []
        if device.kind == CUDA:
            backend = allocator_backend_note()
            if backend:
                notes.append(backend)
        elif self.sync:
            notes.append(
                "--sync has no effect here: the host is traced, and host work is done when "
                "its statement ends"
            )
        if totals.sync_error:
            notes.append(
                f"--sync stopped: synchronising raised {totals.sync_error}; the cell "
                "meets that error at its own next synchronisation"
            )
        return notes
