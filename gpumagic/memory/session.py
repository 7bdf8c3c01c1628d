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
from gpumagic.memory.oom import OomReport, build_cuda_report, build_host_report, is_oom
from gpumagic.memory.probes import CudaMemory, HostMemory
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
    ``cpu``, ``cuda`` or ``cuda:N``."""
    torch = _torch()
    choice = (spec or "").strip().lower()
    cuda_ok = torch is not None and torch.cuda.is_available()
    if choice in ("", "auto") and cuda_ok:
        choice = f"cuda:{torch.cuda.current_device()}"
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
        index = int(index_text) if index_text else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceError(
                f"unknown device {spec!r}; devices here: {', '.join(available_devices())}"
            )
        reader = CudaMemory(torch, index)
        why = (
            "CUDA caching allocator counters (torch.cuda.memory_stats); per-statement peaks "
            "reset torch.cuda's peak counter at each statement"
        )
        label = f"cuda:{index} ({reader.name})" if reader.name else f"cuda:{index}"
        return Device("cuda", label, why, index), reader
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


class TraceSession:
    """Trace one cell: ``probe`` goes to :func:`gpumagic.cell.execute`; ``finish`` makes the result."""

    def __init__(
        self,
        statements: Sequence[Statement],
        namespace: Mapping[str, Any],
        device: str | None = None,
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
        self.tracer = MemoryTracer(statements, self.device, self.reader, self.host, breakdown)

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
            )
        finally:
            self.host.close()
            self.reader.close()

    def _oom(self, error: BaseException, cell_filename: str | None) -> OomReport | None:
        """Report, then release the frames, then measure what the release gave back.

        The state at the failure (free, reserved, fragmentation, who holds what) is read
        first; then the failed call's frames are cleared, which frees its activations; what
        that gave back is reported as held by the failing call, and the tensors no name
        reaches are counted only after it, so what remains is what leaks. Building the
        report must not fail the cell a second time: under a tight cap even walking the heap
        can raise MemoryError, and then a report without holders is shown.
        """
        at_failure: dict[str, Any] = {}
        holders: list[Holder] = []
        released: int | None = None
        unnamed = (0, 0)
        try:
            try:
                at_failure = self._state_at_failure()
                holders = list(named_tensors(self.namespace, self.keep))
                if cell_filename is not None:
                    seen = {h.storage for h in holders}
                    holders += frame_tensors(error, cell_filename, self.keep, seen)
            except MemoryError:
                holders = []
            before = self.reader.read().current
        finally:
            if cell_filename is not None:
                release_frames(error, cell_filename)
        try:
            after = self.reader.read()
            released = max(before - after.current, 0)
            self.tracer.final = after.current  # the cell's net change, once the frames let go
            self.tracer.final_reserved = after.reserved
            unnamed = unnamed_tensor_bytes({h.storage for h in holders}, self.keep)
        except MemoryError:
            pass
        try:
            return self._build(error, at_failure, holders, unnamed, released)
        except MemoryError:
            return None

    def _state_at_failure(self) -> dict[str, Any]:
        if self.device.kind == "cuda":
            assert isinstance(self.reader, CudaMemory)
            return {"stats": self.reader.stats(), "mem_info": self.reader.mem_get_info()}
        import psutil

        vm = psutil.virtual_memory()
        limit, used = _address_space_limit()
        return {
            "rss": self.tracer.final,
            "available": int(vm.available),
            "total": int(vm.total),
            "limit": limit,
            "used": used,
        }

    def _build(
        self,
        error: BaseException,
        state: dict[str, Any],
        holders: list[Holder],
        unnamed: tuple[int, int],
        released: int | None,
    ) -> OomReport:
        if self.device.kind == "cuda":
            return build_cuda_report(
                error,
                state.get("stats", {}),
                state.get("mem_info"),
                self.device.label,
                holders,
                unnamed,
                released=released,
            )
        return build_host_report(
            error,
            state.get("rss", self.tracer.final),
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
