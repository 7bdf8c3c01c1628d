"""One ``%%memtrace`` run, without IPython: pick the device, trace, build the result."""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpumagic.cell import Statement
from gpumagic.memory.holders import (
    Holder,
    ModelMemory,
    device_filter,
    frame_tensors,
    named_tensors,
    unnamed_tensor_bytes,
)
from gpumagic.memory.oom import (
    OomReport,
    build_cuda_report,
    build_host_report,
    is_oom,
    oom_device_index,
    oom_kind,
)
from gpumagic.memory.probes import CudaMemory, HostMemory, allocator_backend_note
from gpumagic.memory.report import MemTrace
from gpumagic.memory.tracer import Device, MemoryTracer


class DeviceError(ValueError):
    """An unknown or unusable ``--device``; the message names the devices there are."""


def _torch() -> Any:
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def available_devices() -> list[str]:
    torch = _torch()
    names = ["host"]
    if torch is not None and torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return names


def resolve_device(spec: str | None, host: HostMemory) -> tuple[Device, CudaMemory | HostMemory]:
    """The device to track and its reader. ``spec``: None (CUDA if there is one), ``host``,
    ``cpu``, ``cuda`` or ``cuda:N``.

    Never initialises torch's CUDA state (audit M1): ``torch.cuda.current_device()`` and
    the device's name would run ``_lazy_init``, which also makes every later ``fork``
    (DataLoader workers, multiprocessing) fail with "Cannot re-initialize CUDA in forked
    subprocess" in a kernel whose cell never touched the GPU. Until CUDA is initialised the
    current device is 0 (``torch.cuda.set_device`` initialises it), and the device's
    name is read at the end of the cell if the cell initialised CUDA.
    """
    torch = _torch()
    choice = (spec or "").strip().lower()
    cuda_ok = torch is not None and torch.cuda.is_available()
    if choice in ("", "auto") and cuda_ok:
        try:
            return _cuda_device("cuda", torch)
        except Exception as exc:  # e.g. a broken driver behind PYTORCH_NVML_BASED_CUDA_CHECK=1
            why = (
                f"CUDA is available but unusable ({type(exc).__name__}: {exc}): "
                f"host RSS, {host.why}"
            )
            return Device("host", "host RSS", why), host
    if choice.startswith("cuda"):
        index_text = choice[5:] if choice.startswith("cuda:") else ""
        if (
            not cuda_ok
            or (index_text and not index_text.isdigit())
            or choice not in ("cuda", f"cuda:{index_text}")
        ):
            raise DeviceError(
                f"unknown device {spec!r}; devices here: {', '.join(available_devices())}"
            )
        try:
            return _cuda_device(choice, torch)
        except DeviceError:
            raise
        except Exception as exc:
            raise DeviceError(
                f"device {spec!r} is unusable: {type(exc).__name__}: {exc}"
            ) from None
    if choice not in ("", "auto", "host", "cpu"):
        raise DeviceError(
            f"unknown device {spec!r}; devices here: {', '.join(available_devices())}"
        )
    if choice in ("", "auto"):
        if torch is None:
            reason = "torch is not installed"
        elif torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            reason = f"torch {torch.__version__} is a CPU-only build"
        else:
            reason = "torch.cuda.is_available() is False"
        why = f"no CUDA device ({reason}): host RSS, {host.why}"
    else:
        why = f"host RSS as asked, {host.why}"
    return Device("host", "host RSS", why), host


def _cuda_device(choice: str, torch: Any) -> tuple[Device, CudaMemory]:
    """``cuda`` (the current device) or ``cuda:N``, without initialising CUDA."""
    if choice == "cuda":
        index = int(torch.cuda.current_device()) if torch.cuda.is_initialized() else 0
    else:
        index = int(choice[5:])
    if index >= torch.cuda.device_count():
        raise DeviceError(f"unknown device {choice!r}; devices here: {', '.join(available_devices())}")
    reader = CudaMemory(torch, index)
    reader.read()  # fails here, before the cell runs, if the allocator cannot be read
    return cuda_device(reader), reader


def cuda_device(reader: CudaMemory) -> Device:
    """The ``Device`` for a CUDA reader, labelled with its name once that is known."""
    why = (
        "CUDA caching allocator counters (torch.cuda.memory_stats_as_nested_dict); "
        "per-statement peaks reset torch.cuda's peak counter at each statement"
    )
    index = reader.index
    label = f"cuda:{index} ({reader.name})" if reader.name else f"cuda:{index}"
    return Device("cuda", label, why, index)


class TraceSession:
    """Trace one cell: ``probe`` goes to :func:`gpumagic.cell.execute`; ``finish`` makes the result.

    ``sync``: synchronise the traced CUDA device at every statement boundary, so each
    statement's time includes the GPU work it queued (kernels run asynchronously: without
    it, a statement's time is the host's, and the next statement that waits for the GPU is
    charged for the work). It has no effect when the host is traced.
    """

    def __init__(
        self,
        statements: Sequence[Statement],
        namespace: Mapping[str, Any],
        device: str | None = None,
        sync: bool = False,
    ) -> None:
        self.host = HostMemory()
        try:
            self.device, self.reader = resolve_device(device, self.host)
        except Exception:
            self.host.close()
            raise
        self.namespace = namespace
        self.keep = device_filter(self.device.kind, self.device.index)
        breakdown = ModelMemory(namespace, self.keep) if "torch" in sys.modules else None
        self.sync = sync
        waiter = self.reader.synchronize if sync and isinstance(self.reader, CudaMemory) else None
        self.tracer = MemoryTracer(
            statements, self.device, self.reader, self.host, breakdown, sync=waiter
        )

    @property
    def probe(self) -> MemoryTracer:
        return self.tracer

    def finish(
        self, error: BaseException | None = None, cell_filename: str | None = None
    ) -> MemTrace:
        """The result. After an OOM, also build its report and release the failed call's
        frames (``cell_filename``: the cell's code name, where the release starts)."""
        try:
            failing = self.tracer.finish()
            if isinstance(self.reader, CudaMemory) and self.reader.name is None:
                # the cell initialised CUDA: now the name can be read without side effects
                try:
                    if self.reader.describe():
                        self.device = self.tracer.device = cuda_device(self.reader)
                except Exception:
                    pass
            oom = None
            if error is not None and is_oom(error):
                oom = self._oom(error, cell_filename)
            text = ""
            if error is not None:
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                text = f"{type(error).__name__}: {first}" if first else type(error).__name__
            return MemTrace.from_tracer(
                self.tracer,
                error_index=failing if error is not None else -1,
                error=text[:300],
                oom=oom,
                host_method=self.host.method,
                notes=self._notes(),
            )
        finally:
            self.host.close()
            self.reader.close()

    def _notes(self) -> list[str]:
        notes: list[str] = []
        if self.device.kind == "cuda":
            backend = allocator_backend_note()
            if backend:
                notes.append(backend)
        elif self.sync:
            notes.append(
                "--sync has no effect here: the host is traced, and host work is done when "
                "its statement ends"
            )
        if self.tracer.sync_error:
            notes.append(
                f"--sync stopped: synchronising raised {self.tracer.sync_error}; the cell "
                "meets that error at its own next synchronisation"
            )
        return notes

    def _oom(self, error: BaseException, cell_filename: str | None) -> OomReport | None:
        """Report, then release the frames, then measure what the release gave back.

        The report follows the error, not the traced device (audit M2): a host OOM on a
        GPU machine reports the host and the CPU tensors. The state at the failure (free,
        reserved, fragmentation, who holds what) is read first; then the failed call's
        frames are cleared, which frees its activations; what that gave back is reported
        as held by the failing call, and the tensors no name reaches are counted only after
        it, so what remains is what leaks. Building the report must not fail the cell a
        second time: under a tight cap even walking the heap can raise MemoryError, and
        then a report without holders is shown.
        """
        kind = oom_kind(error) or self.device.kind
        reader: CudaMemory | HostMemory | None
        if kind == "cuda":
            reader = self._cuda_reader_for(error)
            keep = device_filter("cuda", reader.index) if reader is not None else self.keep
        else:
            reader, keep = self.host, device_filter("host")
        traced = reader is self.reader
        at_failure: dict[str, Any] = {}
        holders: list[Holder] = []
        released: int | None = None
        unnamed = (0, 0)
        before: int | None = None
        try:
            try:
                at_failure = self._state_at_failure(kind, reader)
                holders = list(named_tensors(self.namespace, keep))
                if cell_filename is not None:
                    seen = {h.storage for h in holders}
                    holders += frame_tensors(error, cell_filename, keep, seen)
            except MemoryError:
                holders = []
            if reader is not None:
                before = reader.read().current
        finally:
            if cell_filename is not None:
                release_frames(error, cell_filename)
        try:
            if reader is not None and before is not None:
                after = reader.read()
                released = max(before - after.current, 0)
                if traced:
                    self.tracer.final = after.current  # the cell's net change, once released
                    self.tracer.final_reserved = after.reserved
            unnamed = unnamed_tensor_bytes({h.storage for h in holders}, keep)
        except MemoryError:
            pass
        try:
            return self._build(kind, reader, error, at_failure, holders, unnamed, released)
        except MemoryError:
            return None

    def _cuda_reader_for(self, error: BaseException) -> CudaMemory | None:
        """The traced CUDA reader, or one for the device the error names when the host is
        traced (CUDA is initialised by then: the error came from it)."""
        if isinstance(self.reader, CudaMemory):
            index = oom_device_index(error)
            if index is None or index == self.reader.index:
                return self.reader
        torch = _torch()
        try:
            if torch is None or not torch.cuda.is_initialized():
                return None
            index = oom_device_index(error)
            return CudaMemory(torch, int(torch.cuda.current_device()) if index is None else index)
        except Exception:
            return None

    def _state_at_failure(
        self, kind: str, reader: CudaMemory | HostMemory | None
    ) -> dict[str, Any]:
        if kind == "cuda":
            if not isinstance(reader, CudaMemory):
                return {}
            return {"stats": reader.stats(), "mem_info": reader.mem_get_info()}
        import psutil

        vm = psutil.virtual_memory()
        limit, used = _address_space_limit()
        return {
            "rss": self.host.read().current,
            "available": int(vm.available),
            "total": int(vm.total),
            "limit": limit,
            "used": used,
        }

    def _build(
        self,
        kind: str,
        reader: CudaMemory | HostMemory | None,
        error: BaseException,
        state: dict[str, Any],
        holders: list[Holder],
        unnamed: tuple[int, int],
        released: int | None,
    ) -> OomReport:
        if kind == "cuda":
            if isinstance(reader, CudaMemory):
                label = cuda_device(reader).label if reader.describe() else f"cuda:{reader.index}"
            else:
                label = "cuda"
            return build_cuda_report(
                error,
                state.get("stats", {}),
                state.get("mem_info"),
                label,
                holders,
                unnamed,
                released=released,
            )
        return build_host_report(
            error,
            state.get("rss", self.tracer.final_host),
            state.get("available"),
            state.get("total"),
            holders,
            unnamed,
            address_limit=state.get("limit"),
            address_used=state.get("used"),
            released=released,
        )


def _address_space_limit() -> tuple[int | None, int | None]:
    """(RLIMIT_AS soft limit, virtual size in use) when a cap is set, else (None, None)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None, None
    try:
        with open("/proc/self/statm", "rb") as f:
            used: int | None = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        used = None
    return int(soft), used


def release_frames(error: BaseException, cell_filename: str) -> None:
    """Drop the locals of the failed cell's frames so the tensors they hold are freed.

    An OOM's traceback keeps every frame of the failing call alive (and IPython keeps the
    traceback in ``sys.last_traceback``), and with them the activations the user was
    trying to free. Only frames from the cell's own code down are cleared (the magic's
    frames keep what the traceback display needs), and only for OOM errors: for other
    errors the locals stay for ``%debug``.
    """
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != cell_filename:
            tb = tb.tb_next
        while tb is not None:
            frame = tb.tb_frame
            try:
                frame.clear()
            except RuntimeError:  # still executing: not one of the failed call's frames
                pass
            else:
                # A locals snapshot (frame.f_locals, read by frame_tensors or a debugger)
                # outlives clear() on Python < 3.13; reading it again re-syncs it with the
                # now empty locals, which drops its references.
                _ = frame.f_locals
            tb = tb.tb_next
        exc = exc.__context__
