"""One ``%%memtrace`` run, without IPython: pick the device, trace, build the result."""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from gpumagic.cell import Statement
from gpumagic.memory.holders import ModelMemory, device_filter, named_tensors, unnamed_tensor_bytes
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
        return Device("cuda", f"cuda:{index} ({reader.name})", why, index, reader.total), reader
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

    def finish(self, error: BaseException | None = None) -> MemTrace:
        try:
            failing = self.tracer.finish()
            oom = self._oom_report(error) if error is not None and is_oom(error) else None
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

    def _oom_report(self, error: BaseException) -> OomReport:
        holders = list(named_tensors(self.namespace, self.keep))
        unnamed = unnamed_tensor_bytes({h.storage for h in holders}, self.keep)
        if self.device.kind == "cuda":
            assert isinstance(self.reader, CudaMemory)
            return build_cuda_report(
                error,
                self.reader.stats(),
                self.reader.mem_get_info(),
                self.device.label,
                holders,
                unnamed,
            )
        import psutil

        vm = psutil.virtual_memory()
        limit, used = _address_space_limit()
        return build_host_report(
            error,
            self.tracer.final,
            int(vm.available),
            int(vm.total),
            holders,
            unnamed,
            address_limit=limit,
            address_used=used,
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
        traceback.clear_frames(tb)
        exc = exc.__context__
