"""One ``%%memtrace`` run, without IPython: a :class:`gpumagic.cell.MeasuredRun` that traces
memory per statement and makes the result.

``start`` opens the host's readers, the tensor census (:mod:`gpumagic.memory.census.tracker`:
its dispatch mode and hooks) and the tracer (the probe the cell's statements call),
``stop`` closes the last statement, takes the tracer's totals and removes the census's mode
and hooks, ``finish`` runs the out-of-memory post-mortem when the cell ran out of memory
and builds the :class:`~gpumagic.memory.trace.result.MemTrace`, ``close`` closes the readers and
lets the census go (until then it still counts frees: the post-mortem's release of the
failed call's frames is measured in tensors). While the cell runs,
:meth:`MemtraceRun.status` is the live view's data.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumagic.cell import Statement, error_text
from gpumagic.device_kinds import CUDA, HOST
from gpumagic.memory.trace.device import TracedDevice, cpu_tensors, cuda_device, resolve_device
from gpumagic.memory.trace.oom.detect import is_oom
from gpumagic.memory.trace.oom.memfit_line import memfit_next
from gpumagic.memory.trace.oom.postmortem import post_mortem
from gpumagic.memory.trace.readers import (
    CudaMemory,
    HostMemory,
    Reader,
    TensorMemory,
    allocator_backend_note,
)
from gpumagic.memory.trace.result import MemTrace
from gpumagic.memory.trace.tracer import MemoryTracer, Timeline, TraceTotals

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
    raises :class:`~gpumagic.memory.trace.device.DeviceError` here, before anything is acquired.
    ``sync``: synchronise the traced CUDA device at every statement boundary, so each
    statement's time includes the GPU work it queued (kernels run asynchronously: without
    it, a statement's time is the host's, and the next statement that waits for the GPU is
    charged for the work). It has no effect when the host is traced. ``cell_filename``: the
    cell's code name (:attr:`gpumagic.cell.PreparedCell.filename`), where the release of an
    out-of-memory error's frames starts. ``tensors``: count tensors by category (the
    census); False reads the allocator's counters alone on CUDA and the process's RSS on the
    host, and nothing of the namespace (``--no-tensors``).
    """

    def __init__(
        self,
        statements: Sequence[Statement],
        namespace: Mapping[str, Any],
        device: str | None = None,
        *,
        sync: bool = False,
        cell_filename: str | None = None,
        tensors: bool = True,
    ) -> None:
        self.device, self._cuda = resolve_device(device)
        self.statements = list(statements)
        self.namespace = namespace
        self.sync = sync
        self.cell_filename = cell_filename
        self._host: HostMemory | None = None
        self._tracer: MemoryTracer | None = None
        self._totals: TraceTotals | None = None
        self.tensors = tensors
        self._census: Any = None  # gpumagic.memory.census.tracker.TensorTracker
        self._census_reader: Reader | None = None

    # -- the lifecycle ---------------------------------------------------------------------
    def start(self) -> MemoryTracer:
        self._host = HostMemory()
        if self.tensors and "torch" in sys.modules:
            self._start_census()
        elif self.device.kind == HOST:
            self.device = self.device.measured_by(self._host.why)
        reader = self._reader()
        waiter = reader.synchronize if self.sync and isinstance(reader, CudaMemory) else None
        self._tracer = MemoryTracer(
            self.statements, reader, self._host, sync=waiter, census=self._census
        )
        return self._tracer

    def _start_census(self) -> None:
        from gpumagic.memory.census.tracker import CUDA_ROUNDING, TensorTracker, on_cpu

        if self.device.kind == CUDA:
            census = TensorTracker(self.namespace, self.device.holds(), rounding=CUDA_ROUNDING)
        else:
            census = TensorTracker(self.namespace, on_cpu)
        self._census = census  # before start(): stop() removes whatever start() installed
        census.start()
        if self.device.kind == HOST:
            self.device = cpu_tensors(self.device)
            self._census_reader = TensorMemory(census)

    def stop(self) -> None:
        try:
            if self._tracer is not None:
                self._totals = self._tracer.stop()
        finally:
            if self._census is not None:
                self._census.stop()

    def finish(self, error: BaseException | None) -> MemTrace:
        """The result. After an out-of-memory error, also its report, and the release of the
        failed call's frames (see :func:`gpumagic.memory.trace.oom.postmortem.post_mortem`)."""
        assert self._tracer is not None and self._host is not None, "finish() before start()"
        if error is not None and self._census is not None:
            from gpumagic.memory.census.tracker import drop_own_frames

            drop_own_frames(error)
        totals = self._totals if self._totals is not None else self._tracer.stop()
        device = self._named_device()
        oom = None
        names = self._census.module_names() if self._census is not None else {}
        # the census at the failure, before the post-mortem releases the failed call's frames
        failure = self._at_failure(totals, names) if error is not None else None
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
            if oom is not None and failure is not None:
                oom.categories, oom.activations = failure
            if oom is not None:
                oom.memfit = memfit_next(oom, [s.source for s in self.statements], self.namespace)
            after = found.traced_after_release
            if after is not None:  # the cell's net change, once the failed call let go
                totals = totals.after_release(after.current, after.reserved)
        result = MemTrace.from_totals(
            totals,
            device,
            error=error_text(error) if error is not None else "",
            oom=oom,
            host_method=self._host.method,
            notes=self._notes(totals, device),
        )
        if self._census is not None:
            result.module_names = names
            result.events = self._census.ledger.events
        return result

    def _at_failure(
        self, totals: TraceTotals, names: dict[int, str]
    ) -> tuple[tuple[int, ...], list[tuple[str, int]]] | None:
        """Bytes by category when the cell failed, and the activations alive by module."""
        if self._census is None or totals.failing < 0:
            return None
        categories = totals.categories[totals.failing]
        if categories is None:
            return None
        modules: dict[str, int] = {}
        for token, n in self._census.ledger.by_module.items():
            name = names.get(token, "outside any module") if token else "outside any module"
            modules[name] = modules.get(name, 0) + n
        return categories, sorted(modules.items(), key=lambda kv: -kv[1])

    def close(self) -> None:
        try:
            if self._census is not None:
                self._census.close()
        finally:
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
    def _reader(self) -> Reader:
        if self._cuda is not None:
            return self._cuda
        if self._census_reader is not None:
            return self._census_reader
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
        if self._census is not None:
            notes += census_notes(self._census, totals, device)
        return notes


def census_notes(census: Any, totals: TraceTotals, device: TracedDevice) -> list[str]:
    """What the tensor census could not see, said rather than guessed."""
    notes: list[str] = []
    where = "they are in 'other'" if device.kind == CUDA else "they are not counted"
    for error in census.errors:
        notes.append(
            f"the tensor census stopped: its own code failed ({error}); the numbers after that "
            "point are incomplete (the cell itself was not affected)"
        )
    if census.unseen:
        notes.append(
            f"{census.unseen} op(s) wrote into tensors made where the census could not see "
            "them (before the cell, unreachable by any name; or inside a compiled region): "
            f"{where}"
        )
    uncounted = getattr(census, "uncounted", None)
    if uncounted:
        named = "; ".join(f"{who} ({why})" for who, why in uncounted.items())
        more = f"; and {census.uncounted_more} more" if census.uncounted_more else ""
        notes.append(
            f"memory the tensor census cannot count: {named}{more}: "
            + ("it is in 'other'" if device.kind == CUDA else "it is in none of the figures")
        )
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        try:
            compiled = dynamo.utils.counters["frames"]["ok"] > 0
        except Exception:
            compiled = False
        if compiled:
            notes.append(
                "torch.compile has compiled code in this kernel: compiled regions run as "
                "compiled, and the tensors they allocate inside themselves (Inductor's buffers) "
                f"are not seen by the census: {where}"
            )
    if totals.approximate:
        lines = ", ".join(str(totals.statements[i].line) for i in totals.approximate)
        notes.append(
            f"line(s) {lines} made over a million allocations in one statement: the categories "
            "at their peak are those known at the time (each tensor is classified when its "
            "statement ends)"
        )
    return notes
