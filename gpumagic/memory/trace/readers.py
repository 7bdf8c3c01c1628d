"""The readers ``%%memtrace`` reads memory with at statement boundaries: the host's RSS
(:class:`HostMemory`), the CUDA caching allocator (:class:`CudaMemory`) and, on the CPU, the
tensor census's running total (:class:`TensorMemory`).

Each answers the same two questions cheaply, many thousand times per second:
"how much is in use now" and "what was the highest use since my last reset"
(:class:`Reader`). A "probe" is something else: the call before each statement
(:mod:`gpumagic.instrument`), which the tracer answers by reading its readers.

Host: Linux keeps the peak RSS (``VmHWM``) and lets a process reset it to the current
RSS by writing ``5`` to ``/proc/self/clear_refs``; reading ``VmRSS`` and ``VmHWM`` from
``/proc/self/status`` after each statement therefore gives the exact peak reached inside
that statement. The files stay open and are re-read with ``pread`` (about 8 µs a
reading here, against 12 µs for ``psutil.Process().memory_info()``). Where that reset is
unavailable (not Linux, a locked-down container), a sampling thread polls the RSS every
millisecond and the peak is the highest sample: a statement shorter than that may show
no peak above its end state.

RSS counts pages in use, not bytes handed out: glibc serves allocations below its mmap
threshold (128 KiB, rising up to 32 MiB after large frees) from heap pages it already
holds, so a small tensor may not move the RSS while a large one (above 32 MiB always)
shows to the page. The CUDA numbers below are the allocator's exact bytes.

CUDA: one ``torch.cuda.memory_stats_as_nested_dict(device)`` call per reading, three
dictionary lookups in it. ``torch.cuda.memory_stats()`` is the same data flattened into
dotted keys and sorted in Python (about 122 keys, 65-76 µs a call against under a
microsecond for the lookups), and ``memory_allocated()`` and friends each
rebuild that flat dictionary. ``torch.cuda.reset_peak_memory_stats(device)`` runs at each
statement start. That reset is visible to the user's own code:
``torch.cuda.max_memory_allocated()`` read inside a traced cell reports the peak since
the current statement began. Neither call initialises CUDA (both answer "nothing" before
``torch.cuda.is_initialized()``), neither synchronises the device.

With ``backend:cudaMallocAsync`` in ``PYTORCH_CUDA_ALLOC_CONF``, the allocated and
reserved counters come from the driver's memory pool (``cudaMemPoolAttrUsedMem*``,
``ReservedMem*``), which follows stream order, and every other counter is zero:
:func:`allocator_backend_note` says so in the report.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpumagic.cell import error_text

if TYPE_CHECKING:
    from gpumagic.memory.census.tracker import TensorTracker

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Reading:
    """Memory at one instant, in bytes. ``peak`` is the highest ``current`` since the last reset."""

    current: int
    peak: int
    reserved: int


class Reader(Protocol):
    """What the tracer reads at each statement boundary: a :class:`Reading`, and a reset of
    the peak at each statement's start."""

    def read(self) -> Reading: ...

    def reset_peak(self) -> None: ...


class HostMemory:
    """The process's resident set size, with per-interval peaks (see module docstring)."""

    def __init__(self, force_sampled: bool = False) -> None:
        self.method = "sampled"
        self.why = ""
        self._status_fd: int | None = None
        self._clear_fd: int | None = None
        self._sampler: _RssSampler | None = None
        self._peak_above_now = True  # unknown until the first reading: reset to be sure
        if not force_sampled:
            try:
                self._status_fd = os.open("/proc/self/status", os.O_RDONLY)
                self._clear_fd = os.open("/proc/self/clear_refs", os.O_WRONLY)
                os.write(self._clear_fd, b"5")
                self._parse(os.pread(self._status_fd, 8192, 0))
                self.method = "clear_refs"
                self.why = "exact peaks from VmHWM after resetting it through /proc/self/clear_refs"
            except (OSError, ValueError) as exc:
                self._close_fds()
                self.why = f"peak-RSS reset unavailable ({error_text(exc)}); peaks sampled every 1 ms"
            except BaseException:  # interrupted: nobody holds this object yet to close it
                self._close_fds()
                raise
        else:
            self.why = "peaks sampled every 1 ms"
        if self.method == "sampled":
            self._sampler = _RssSampler(interval=0.001)
            try:
                self._sampler.start()
            except BaseException:
                self.close()
                raise

    @staticmethod
    def _parse(status: bytes) -> tuple[int, int]:
        i = status.find(b"VmRSS:")
        j = status.find(b"VmHWM:")
        if i < 0 or j < 0:
            raise ValueError("no VmRSS/VmHWM in /proc/self/status")
        rss = int(status[i + 6 : status.index(b"kB", i)])
        hwm = int(status[j + 6 : status.index(b"kB", j)])
        return rss * 1024, hwm * 1024

    def read(self) -> Reading:
        if self._status_fd is not None:
            rss, hwm = self._parse(os.pread(self._status_fd, 8192, 0))
            self._peak_above_now = hwm > rss
            return Reading(rss, max(rss, hwm), rss)
        assert self._sampler is not None
        rss = _current_rss()
        return Reading(rss, max(rss, self._sampler.peak), rss)

    def reset_peak(self) -> None:
        # A reset sets the peak to the current RSS; when the last reading found them equal
        # there is nothing to reset. Each syscall here costs more than its own few
        # microseconds (the kernel entry disturbs the caches and predictors of the code
        # that follows), and skipping this one saves most of them: RSS mostly grows or holds.
        if self._clear_fd is not None:
            if self._peak_above_now:
                os.write(self._clear_fd, b"5")
                self._peak_above_now = False
        elif self._sampler is not None:
            self._sampler.reset()

    def close(self) -> None:
        self._close_fds()
        if self._sampler is not None:
            self._sampler.stop()
            if self._sampler.is_alive():  # ends within its 1 ms poll: no thread outlives us
                self._sampler.join(timeout=1.0)
            self._sampler = None

    def _close_fds(self) -> None:
        for fd in (self._status_fd, self._clear_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._status_fd = self._clear_fd = None


def _current_rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss)


class _RssSampler(threading.Thread):
    """Fallback peak tracker: polls the RSS; ``peak`` is the highest sample since ``reset``."""

    def __init__(self, interval: float) -> None:
        super().__init__(name="gpumagic-rss-sampler", daemon=True)
        self.interval = interval
        self.peak = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            rss = _current_rss()
            if rss > self.peak:
                self.peak = rss

    def reset(self) -> None:
        self.peak = _current_rss()

    def stop(self) -> None:
        self._stop_event.set()


class CudaMemory:
    """The CUDA caching allocator's counters for one device (see module docstring)."""

    def __init__(self, torch: Any, index: int) -> None:
        self._torch = torch
        self.index = index
        # Asking for the device's name or size initialises torch's CUDA state (``_lazy_init``,
        # after which fork() fails in every DataLoader worker), so they are read only once
        # something else has initialised it.
        self.name: str | None = None
        self.total: int | None = None
        self.describe()
        self._nested = getattr(torch.cuda, "memory_stats_as_nested_dict", None)

    def describe(self) -> bool:
        """Read the device's name and size if CUDA is initialised by now; True when known."""
        if self.name is None and self._torch.cuda.is_initialized():
            self.name = str(self._torch.cuda.get_device_name(self.index))
            self.total = int(self._torch.cuda.get_device_properties(self.index).total_memory)
        return self.name is not None

    def read(self) -> Reading:
        if self._nested is not None:
            return reading_from_nested(self._nested(self.index))
        return reading_from_stats(self._torch.cuda.memory_stats(self.index))

    def reset_peak(self) -> None:
        # Before CUDA is initialised there is nothing to reset, and resetting would
        # initialise a context (hundreds of MiB) in a cell that may never use the GPU.
        if self._torch.cuda.is_initialized():
            self._torch.cuda.reset_peak_memory_stats(self.index)

    def synchronize(self) -> bool:
        """Wait for the device's queued work (``--sync``); False when CUDA is not initialised
        yet: nothing can be queued then, and synchronising would initialise it."""
        if not self._torch.cuda.is_initialized():
            return False
        self._torch.cuda.synchronize(self.index)
        return True

    def stats(self) -> dict[str, Any]:
        return dict(self._torch.cuda.memory_stats(self.index))

    def mem_get_info(self) -> tuple[int, int] | None:
        try:
            free, total = self._torch.cuda.mem_get_info(self.index)
            return int(free), int(total)
        except Exception:  # context lost after a failure: report what the allocator says
            return None

    def close(self) -> None:
        pass


class TensorMemory:
    """The CPU's tensor bytes as the tracer's reader: the census's running total and the open
    statement's peak (:class:`gpumagic.memory.census.tracker.TensorTracker`). The peak
    restarts when the census settles a statement, which the tracer does at every boundary."""

    def __init__(self, tracker: TensorTracker) -> None:
        self.tracker = tracker

    def read(self) -> Reading:
        ledger = self.tracker.ledger
        return Reading(ledger.current, max(ledger.peak, ledger.current), ledger.current)

    def reset_peak(self) -> None:
        pass


def reading_from_stats(stats: dict[str, Any]) -> Reading:
    """A reading from a ``torch.cuda.memory_stats()`` dictionary (empty before CUDA init)."""
    current = int(stats.get("allocated_bytes.all.current", 0))
    peak = int(stats.get("allocated_bytes.all.peak", current))
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    return Reading(current, max(peak, current), reserved)


def reading_from_nested(stats: dict[str, Any]) -> Reading:
    """A reading from ``torch.cuda.memory_stats_as_nested_dict()`` (``{}`` before CUDA init)."""
    if not stats:
        return Reading(0, 0, 0)
    allocated = stats["allocated_bytes"]["all"]
    current = int(allocated["current"])
    return Reading(
        current, max(int(allocated["peak"]), current), int(stats["reserved_bytes"]["all"]["current"])
    )


def allocator_backend_note(env: dict[str, str] | None = None) -> str:
    """A caveat when torch's CUDA memory comes from ``cudaMallocAsync`` ("" for the native one).

    Read from the environment variables torch reads at start-up, so asking never
    initialises CUDA.
    """
    env = dict(os.environ) if env is None else env
    # Recent torch reads PYTORCH_ALLOC_CONF first, PYTORCH_CUDA_ALLOC_CONF when it is unset.
    conf = env.get("PYTORCH_ALLOC_CONF") or env.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    settings = {
        k.strip(): v.strip() for k, _, v in (item.partition(":") for item in conf.split(","))
    }
    if settings.get("backend") != "cudaMallocAsync":
        return ""
    return (
        "the allocator backend is cudaMallocAsync: allocated and reserved are "
        "the driver pool's counters, which follow stream order (memory a kernel still uses "
        "can count as freed), and a statement's peak is the pool's high-water mark"
    )
