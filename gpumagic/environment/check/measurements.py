"""Short measurements of what a device really does, each beside the figure it should reach.

One timing rule for every figure, on the CPU and on CUDA alike (so the suite runs the same
code on the CPU): a warm-up call (cuBLAS handles and heuristics, first-touch page faults),
one timed call to size the run, then as many calls as fill ``seconds`` (at least 3), timed
between two device synchronisations with ``time.perf_counter``. Per-call host overhead
(~10 µs) is small beside the milliseconds each timed call takes at these sizes.

- matmul: ``2 n^3`` FLOP per call. FP32 runs with TF32 off, TF32 with it on, whatever the
  user's setting; the setting is put back exactly as it was (the same API it was read with:
  torch 2.9's ``fp32_precision`` where it exists, which refuses to be mixed with
  ``allow_tf32``).
- memory: ``dst.copy_(src)`` reads and writes each byte once: ``2 x size`` bytes per call, as
  a datasheet's bandwidth counts both directions of traffic.
- host to device and back: one ``copy_`` of ``size`` bytes, from pageable memory and from
  pinned memory (``pin_memory=True``), the path ``DataLoader(pin_memory=True)`` takes.
- launch: the host time of one tiny kernel (``x.add_(1)`` on one element), over 2,000 launches
  and one synchronisation: what each small op of a training step costs at least.

Values: FLOP/s, bytes/s, µs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gpumagic.card_specs import CardSpecs, Sourced, pcie_bandwidth

MiB = 2**20

# What a figure is called, its unit, and the card_specs figure it compares with.
FIGURES: dict[str, tuple[str, str, str | None]] = {
    "fp32": ("FP32 matmul (no tensor cores)", "FLOP/s", "fp32"),
    "tf32": ("TF32 matmul", "FLOP/s", "tf32"),
    "bf16": ("BF16 matmul", "FLOP/s", "bf16"),
    "fp16": ("FP16 matmul", "FLOP/s", "fp16"),
    "memory": ("device memory copy", "B/s", "memory_bandwidth"),
    "h2d_pinned": ("host to device, pinned", "B/s", "pcie"),
    "h2d_pageable": ("host to device, pageable", "B/s", "pcie"),
    "d2h_pinned": ("device to host, pinned", "B/s", "pcie"),
    "d2h_pageable": ("device to host, pageable", "B/s", "pcie"),
    "launch": ("kernel launch (host time per launch)", "µs", None),
    "cpu_matmul": ("FP32 matmul, torch's threads", "FLOP/s", None),
    "cpu_matmul_1": ("FP32 matmul, one thread", "FLOP/s", None),
    "cpu_memory": ("memory copy", "B/s", None),
}


@dataclass
class Measurement:
    """One figure: ``value`` in ``unit``; ``spec`` what the card should reach, with its
    source; ``size`` what was timed; ``calls`` how many timed calls it averaged."""

    device: str
    key: str
    value: float
    size: str
    calls: int
    spec: float | None = None
    spec_source: str | None = None

    @property
    def name(self) -> str:
        return FIGURES[self.key][0]

    @property
    def unit(self) -> str:
        return FIGURES[self.key][1]

    @property
    def ratio(self) -> float | None:
        """The measured figure over the specification's (None without one)."""
        return self.value / self.spec if self.spec else None


@dataclass
class LoadSample:
    """NVML read while a measurement kept the card busy: the clocks, power and link as they
    are under load (at rest the link trains down and the clocks drop, by design)."""

    sm_clock: int | None = None
    power_draw: float | None = None
    temperature: int | None = None
    clock_events: tuple[str, ...] | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None


Probe = Callable[[], LoadSample | None]


def synchronize(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def per_call(
    torch: Any, device: str, step: Callable[[], object], seconds: float,
    during: Callable[[], object] | None = None,
) -> tuple[float, int]:  # fmt: skip
    """Seconds per call of ``step`` and the number of timed calls (module docstring).
    ``during`` runs once after the timed calls were queued and before the wait for them:
    on CUDA the card is still busy with them then."""
    step()
    synchronize(torch, device)
    start = time.perf_counter()
    step()
    synchronize(torch, device)
    one = max(time.perf_counter() - start, 1e-7)
    calls = max(3, min(2000, int(seconds / one)))
    start = time.perf_counter()
    for _ in range(calls):
        step()
    if during is not None:
        during()
    synchronize(torch, device)
    return (time.perf_counter() - start) / calls, calls


@contextlib.contextmanager
def tf32(torch: Any, on: bool) -> Iterator[None]:
    """FP32 matmuls with TF32 on or off for the block; the user's setting back exactly after."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        saved = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if on else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
    else:
        saved = matmul.allow_tf32
        matmul.allow_tf32 = on
        try:
            yield
        finally:
            matmul.allow_tf32 = saved


def matmul(torch: Any, device: str, key: str, n: int, seconds: float,
           during: Callable[[], object] | None = None) -> Measurement:  # fmt: skip
    """``n x n`` matmuls in the dtype ``key`` names (fp32, tf32, bf16, fp16, cpu_matmul*)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(key, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    def step() -> object:
        return torch.matmul(a, b, out=out)

    with tf32(torch, key == "tf32"):
        t, calls = per_call(torch, device, step, seconds, during)
    name = str(dtype).replace("torch.", "")
    return Measurement(device, key, 2 * n**3 / t, f"{n}×{n} {name}", calls)


def memory_copy(torch: Any, device: str, key: str, nbytes: int, seconds: float) -> Measurement:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)

    def step() -> object:
        return dst.copy_(src)

    t, calls = per_call(torch, device, step, seconds)
    return Measurement(device, key, 2 * nbytes / t, _size(nbytes), calls)


def transfers(torch: Any, device: str, nbytes: int, seconds: float,
              during: Callable[[], object] | None = None, pinned: bool = True) -> list[Measurement]:  # fmt: skip
    """Host to device and back, from pinned host memory (``pinned``) and from pageable."""
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    found = []
    for pin in (True, False) if pinned else (False,):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin).fill_(1)
        kind = "pinned" if pin else "pageable"

        def up(h: Any = host) -> object:
            return on_device.copy_(h, non_blocking=True)

        def down(h: Any = host) -> object:
            return h.copy_(on_device, non_blocking=True)

        t, calls = per_call(torch, device, up, seconds, during if pin else None)
        found.append(Measurement(device, f"h2d_{kind}", nbytes / t, _size(nbytes), calls))
        t, calls = per_call(torch, device, down, seconds)
        found.append(Measurement(device, f"d2h_{kind}", nbytes / t, _size(nbytes), calls))
    return found


def launch(torch: Any, device: str, launches: int = 2000) -> Measurement:
    x = torch.zeros(1, device=device)
    x.add_(1)
    synchronize(torch, device)
    start = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    synchronize(torch, device)
    return Measurement(device, "launch", (time.perf_counter() - start) / launches * 1e6,
                       "one element, x.add_(1)", launches)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    """What each figure times: the FP32 matmul's and the tensor-core matmuls' n, the bytes of
    the device copy and of the transfers, the number of launches."""

    fp32: int = 4096
    tensor: int = 8192
    memory: int = 1024 * MiB
    transfer: int = 256 * MiB
    launches: int = 2000


def measure_device(torch: Any, device: str, sizes: Sizes, seconds: float, specs: CardSpecs | None,
                   probe: Probe | None = None, pinned: bool = True) -> tuple[list[Measurement], LoadSample | None, LoadSample | None]:  # fmt: skip
    """Every figure of ``device``, with the specification's beside each, and what ``probe``
    read while a BF16 matmul (clocks, power) and a pinned copy (the link) kept it busy."""
    loads: dict[str, LoadSample | None] = {}

    def sample(name: str) -> Callable[[], object]:
        return lambda: loads.__setitem__(name, probe() if probe is not None else None)

    found = [
        matmul(torch, device, "fp32", sizes.fp32, seconds),
        matmul(torch, device, "tf32", sizes.tensor, seconds),
        matmul(torch, device, "bf16", sizes.tensor, seconds, during=sample("matmul")),
        matmul(torch, device, "fp16", sizes.tensor, seconds),
        memory_copy(torch, device, "memory", sizes.memory, seconds),
        *transfers(torch, device, sizes.transfer, seconds, sample("copy"), pinned),
        launch(torch, device, sizes.launches),
    ]
    for m in found:
        attach_spec(m, specs)
    return found, loads.get("matmul"), loads.get("copy")


def measure_gpu(torch: Any, index: int, specs: CardSpecs | None, seconds: float,
                probe: Probe | None = None) -> tuple[list[Measurement], LoadSample | None, LoadSample | None]:  # fmt: skip
    """:func:`measure_device` on CUDA device ``index``, sized to its free memory, which it
    gives back after (the caching allocator's blocks too)."""
    free, _ = torch.cuda.mem_get_info(index)
    # three n x n matrices: 8192 in 32 bits is 800 MB, a MIG slice's 10 GB takes it
    tensor = 8192 if free > 2 * 3 * 8192**2 * 4 else 4096
    sizes = Sizes(tensor=tensor, memory=min(1024 * MiB, free // 4))
    try:
        return measure_device(torch, f"cuda:{index}", sizes, seconds, specs, probe)
    finally:
        torch.cuda.empty_cache()


def attach_spec(m: Measurement, specs: CardSpecs | None) -> None:
    """Put the card's figure for ``m`` beside it (a transfer: the card's PCIe link)."""
    if specs is None:
        return
    want = FIGURES[m.key][2]
    figure: Sourced | None = None
    if want == "pcie":
        if specs.pcie_gen is not None and specs.pcie_width is not None:
            gen, width = int(specs.pcie_gen.value), int(specs.pcie_width.value)
            m.spec = pcie_bandwidth(gen, width)
            m.spec_source = f"PCIe Gen {gen} x{width} ({specs.pcie_gen.cite()})"
        return
    if want is not None:
        figure = specs.figure(want)
    if figure is not None:
        m.spec, m.spec_source = figure.value, figure.cite()


def measure_host(torch: Any, seconds: float, n: int = 1024, nbytes: int = 64 * MiB) -> list[Measurement]:
    """The CPU: FP32 matmul with torch's threads (and with one, to show what they add) and a
    memory copy larger than the caches."""
    found = [matmul(torch, "cpu", "cpu_matmul", n, seconds)]
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
        try:
            found.append(matmul(torch, "cpu", "cpu_matmul_1", n, seconds))
        finally:
            torch.set_num_threads(threads)
    found.append(memory_copy(torch, "cpu", "cpu_memory", nbytes, seconds))
    for m in found:
        m.device = "host"
    found[0].size += f", {threads} thread{'s' if threads != 1 else ''}"
    return found


def _size(nbytes: int) -> str:
    return f"{nbytes / MiB:.0f} MiB" if nbytes < 1024 * MiB else f"{nbytes / 1024 / MiB:.0f} GiB"
