"""What each card of :mod:`gpumagic.cards` should do, by its vendor's word: the figures
``%gpucheck`` compares its readings and measurements with (issue 29).

Every number is a :class:`Sourced`: the value in base units (FLOP/s, bytes/s, W, °C, MHz),
the document it comes from (a datasheet or whitepaper URL and the table in it) and, where the
figure is not the document's own, a note that says how it follows from it.

Conventions, the same for every card:

- ``fp32``: FP32 on the CUDA cores, no tensor cores (``torch.matmul`` on float32 with
  ``torch.backends.cuda.matmul.allow_tf32 = False``).
- ``tf32``, ``bf16``, ``fp16``: dense tensor-core throughput. Data-centre datasheets print
  them "with sparsity" (NVIDIA's 2:4 structured sparsity, which a dense matmul never uses):
  the dense figure is half, and the note says so.
- ``fp16`` is FP16 inputs with FP32 accumulation, what torch asks cuBLAS for (a half-precision
  matmul accumulates in FP32). GeForce cards run that at half their FP16-accumulate rate,
  which is the figure their whitepapers lead with; the FP32-accumulate row is taken.
- ``memory_bandwidth``: the datasheet's peak, in bytes/s (10^9 per GB/s).
- ``pcie_gen``, ``pcie_width``: the card's host interface.
- ``power_default_w``: the board's rated power (TDP, TGP): its default power limit;
  ``power_max_w``: the highest limit the vendor allows where it says so ("up to").

A card whose vendor publishes no datasheet (the A10G is an AWS part) has no entry: the check
says it has nothing to compare with rather than borrow a near card's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

T = 1e12  # TFLOP/s
GB = 1e9  # GB/s, as datasheets count them


@dataclass(frozen=True)
class Source:
    """A vendor document and the table in it."""

    url: str
    table: str

    def __str__(self) -> str:
        return f"{self.url} ({self.table})"


@dataclass(frozen=True)
class Sourced:
    """One figure and where it comes from; ``note`` says how it follows from the document
    when it is not printed there as is (the dense half of a sparse figure)."""

    value: float
    source: Source
    note: str = ""

    def cite(self) -> str:
        return f"{self.source}; {self.note}" if self.note else str(self.source)


@dataclass(frozen=True)
class CardSpecs:
    """What a card should do. ``form`` is the board the figures are for (``SXM``, ``PCIe``,
    ``NVL``): a name that says another form (an "H100 PCIe" matching the SXM row) gets no
    comparison, since its clocks, power and bandwidth differ."""

    form: str
    fp32: Sourced | None = None
    tf32: Sourced | None = None
    bf16: Sourced | None = None
    fp16: Sourced | None = None
    memory_bandwidth: Sourced | None = None
    pcie_gen: Sourced | None = None
    pcie_width: Sourced | None = None
    power_default_w: Sourced | None = None
    power_max_w: Sourced | None = None
    boost_clock_mhz: Sourced | None = None
    base_clock_mhz: Sourced | None = None
    notes: tuple[str, ...] = ()

    def figure(self, name: str) -> Sourced | None:
        """The figure a measurement compares with: ``fp32``, ``tf32``, ``bf16``, ``fp16``,
        ``memory_bandwidth``."""
        value = getattr(self, name, None)
        return value if isinstance(value, Sourced) else None


_SPARSE = "dense: half the table's figure, which is with sparsity"
_FP32_ACC = "the FP16-input row with FP32 accumulate (torch's half-precision matmul)"


def _s(value: float, source: Source, note: str = "") -> Sourced:
    return Sourced(value, source, note)


# --- Hopper ------------------------------------------------------------------------------------
_H200 = Source("https://www.nvidia.com/en-us/data-center/h200/", "Technical Specifications, H200 SXM")
_H200_NVL = Source("https://www.nvidia.com/en-us/data-center/h200/", "Technical Specifications, H200 NVL")
_H100 = Source("https://www.nvidia.com/en-us/data-center/h100/", "Technical Specifications, H100 SXM")
_H100_NVL = Source("https://www.nvidia.com/en-us/data-center/h100/", "Technical Specifications, H100 NVL")


def _hopper(src: Source, form: str, fp32: float, tf32_sparse: float, b16_sparse: float,
            bandwidth: float, power: float, default_power: bool) -> CardSpecs:  # fmt: skip
    return CardSpecs(
        form,
        fp32=_s(fp32 * T, src),
        tf32=_s(tf32_sparse / 2 * T, src, _SPARSE),
        bf16=_s(b16_sparse / 2 * T, src, _SPARSE),
        fp16=_s(b16_sparse / 2 * T, src, _SPARSE),
        memory_bandwidth=_s(bandwidth * GB, src),
        pcie_gen=_s(5, src, "Interconnect: PCIe Gen5 128 GB/s, which is x16"),
        pcie_width=_s(16, src, "Interconnect: PCIe Gen5 128 GB/s, which is x16"),
        power_default_w=_s(power, src, "Max Thermal Design Power") if default_power else None,
        power_max_w=_s(power, src, "Max Thermal Design Power, configurable up to it"),
    )


# --- Ampere, Ada, Turing, Volta ----------------------------------------------------------------
_A100_WP = Source(
    "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf",
    "the table comparing NVIDIA data-center GPUs, A100 column (SXM4, 40 GB)",
)
_A100_DS = Source(
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    "A100 80GB SXM column",
)
_L40S = Source("https://www.nvidia.com/en-us/data-center/l40s/", "Specifications, L40S")
_A40 = Source(
    "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
    "Specifications",
)
_L4 = Source("https://www.nvidia.com/en-us/data-center/l4/", "Specifications, L4")
_T4 = Source(
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
    "Specifications",
)
_V100 = Source(
    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    "Specifications, V100 SXM2 column",
)
_ADA_WP = Source(
    "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
    "Appendix A, the table of GeForce RTX 4090 specifications",
)
_GA102_WP = Source(
    "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
    "Appendix A, the table of GeForce RTX 3090 specifications",
)
_4090_PAGE = Source(
    "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/", "Specs"
)
_3090_PAGE = Source(
    "https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3090-3090ti/", "Specs"
)
_X16 = "a PCIe Gen4 card with a x16 edge connector"
_RTX6000 = Source(
    "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/rtx-6000/proviz-print-rtx6000-datasheet-web-2504660.pdf",
    "Specifications",
)
_NO_TF32_BF16 = "no TF32 or BF16 tensor cores before Ampere: torch runs those matmuls without them"


def _a100(src: Source, bandwidth: float) -> CardSpecs:
    return CardSpecs(
        "SXM",
        fp32=_s(19.5 * T, src),
        tf32=_s(156 * T, src),
        bf16=_s(312 * T, src),
        fp16=_s(312 * T, src),
        memory_bandwidth=_s(bandwidth * GB, src),
        pcie_gen=_s(4, src, "PCIe Gen4 64 GB/s, which is x16"),
        pcie_width=_s(16, src, "PCIe Gen4 64 GB/s, which is x16"),
        power_default_w=_s(400, src, "Max TDP Power"),
        boost_clock_mhz=_s(1410, _A100_WP, "GPU Boost Clock") if src is _A100_WP else None,
    )


SPECS: dict[str, CardSpecs] = {
    "H200": _hopper(_H200, "SXM", 67, 989, 1979, 4800, 700, True),
    "H200 NVL": _hopper(_H200_NVL, "NVL", 60, 835, 1671, 4800, 600, True),
    "H100 80GB": _hopper(_H100, "SXM", 67, 989, 1979, 3350, 700, True),
    # "350-400W (configurable)": no single default to judge against
    "H100 NVL": _hopper(_H100_NVL, "NVL", 60, 835, 1671, 3900, 400, False),
    "A100 80GB": _a100(_A100_DS, 2039),
    "A100 40GB": _a100(_A100_WP, 1555),
    "L40S": CardSpecs(
        "PCIe",
        fp32=_s(91.6 * T, _L40S),
        tf32=_s(183 * T, _L40S, "dense: the table's first figure (the second is with sparsity)"),
        bf16=_s(362.05 * T, _L40S, "dense: the table's first figure"),
        fp16=_s(362.05 * T, _L40S, "dense: the table's first figure"),
        memory_bandwidth=_s(864 * GB, _L40S),
        pcie_gen=_s(4, _L40S, "Interconnect Interface: PCIe Gen4 x16"),
        pcie_width=_s(16, _L40S, "Interconnect Interface: PCIe Gen4 x16"),
        power_default_w=_s(350, _L40S, "Max Power Consumption"),
    ),
    "A40": CardSpecs(
        "PCIe",
        fp32=_s(37.4 * T, _A40, "Peak FP32 TFLOPS (non-Tensor)"),
        tf32=_s(74.8 * T, _A40, "dense: the first figure (the second is with sparsity)"),
        bf16=_s(149.7 * T, _A40, "Peak BF16 Tensor TFLOPS with FP32 Accumulate, dense"),
        fp16=_s(149.7 * T, _A40, "dense; as BF16 with FP32 accumulate, at the same rate"),
        memory_bandwidth=_s(696 * GB, _A40),
        pcie_gen=_s(4, _A40, "Interconnect interface: PCIe Gen4 64 GB/s, which is x16"),
        pcie_width=_s(16, _A40, "Interconnect interface: PCIe Gen4 64 GB/s, which is x16"),
        power_default_w=_s(300, _A40, "Max power consumption"),
    ),
    "L4": CardSpecs(
        "PCIe",
        fp32=_s(30.3 * T, _L4),
        tf32=_s(60 * T, _L4, "dense: half the table's 120, which is with sparsity"),
        bf16=_s(121 * T, _L4, "dense: half the table's 242, which is with sparsity"),
        fp16=_s(121 * T, _L4, "dense: half the table's 242, which is with sparsity"),
        memory_bandwidth=_s(300 * GB, _L4),
        pcie_gen=_s(4, _L4, "Interconnect: PCIe Gen4 x16 64 GB/s"),
        pcie_width=_s(16, _L4, "Interconnect: PCIe Gen4 x16 64 GB/s"),
        power_default_w=_s(72, _L4, "Max thermal design power"),
    ),
    "T4": CardSpecs(
        "PCIe",
        fp32=_s(8.1 * T, _T4, "Single-Precision"),
        fp16=_s(65 * T, _T4, "Mixed-Precision (FP16/FP32)"),
        memory_bandwidth=_s(320 * GB, _T4, "GPU Memory Bandwidth: 320+ GB/s"),
        pcie_gen=_s(3, _T4, "System Interface: x16 PCIe Gen3"),
        pcie_width=_s(16, _T4, "System Interface: x16 PCIe Gen3"),
        power_default_w=_s(70, _T4, "Power"),
        notes=(_NO_TF32_BF16,),
    ),
    "V100 32GB": CardSpecs(
        "SXM",
        fp32=_s(15.7 * T, _V100, "Single-Precision"),
        fp16=_s(125 * T, _V100, "Tensor Performance"),
        memory_bandwidth=_s(900 * GB, _V100),
        power_default_w=_s(300, _V100, "Max Power Consumption"),
        notes=(_NO_TF32_BF16,),
    ),
    "V100 16GB": CardSpecs(
        "SXM",
        fp32=_s(15.7 * T, _V100, "Single-Precision"),
        fp16=_s(125 * T, _V100, "Tensor Performance"),
        memory_bandwidth=_s(900 * GB, _V100),
        power_default_w=_s(300, _V100, "Max Power Consumption"),
        notes=(_NO_TF32_BF16,),
    ),
    "RTX 4090": CardSpecs(
        "PCIe",
        fp32=_s(82.6 * T, _ADA_WP, "Peak FP32 TFLOPS (non-Tensor)"),
        tf32=_s(82.6 * T, _ADA_WP, "Peak TF32 Tensor TFLOPS, dense"),
        bf16=_s(165.2 * T, _ADA_WP, "Peak BF16 Tensor TFLOPS with FP32 Accumulate, dense"),
        fp16=_s(165.2 * T, _ADA_WP, _FP32_ACC + ", dense"),
        memory_bandwidth=_s(1008 * GB, _ADA_WP, "Memory Bandwidth"),
        pcie_gen=_s(4, _4090_PAGE, _X16),
        pcie_width=_s(16, _4090_PAGE, _X16),
        power_default_w=_s(450, _ADA_WP, "Total Graphics Power (TGP)"),
        boost_clock_mhz=_s(2520, _ADA_WP, "GPU Boost Clock"),
        base_clock_mhz=_s(2235, _ADA_WP, "GPU Base Clock"),
    ),
    "RTX 3090": CardSpecs(
        "PCIe",
        fp32=_s(35.6 * T, _GA102_WP, "Peak FP32 TFLOPS (non-Tensor)"),
        tf32=_s(35.6 * T, _GA102_WP, "Peak TF32 Tensor TFLOPS, dense"),
        bf16=_s(71 * T, _GA102_WP, "Peak BF16 Tensor TFLOPS with FP32 Accumulate, dense"),
        fp16=_s(71 * T, _GA102_WP, _FP32_ACC + ", dense"),
        memory_bandwidth=_s(936 * GB, _GA102_WP, "Memory Bandwidth"),
        pcie_gen=_s(4, _3090_PAGE, _X16),
        pcie_width=_s(16, _3090_PAGE, _X16),
        power_default_w=_s(350, _GA102_WP, "Total Graphics Power (TGP)"),
        boost_clock_mhz=_s(1695, _GA102_WP, "GPU Boost Clock"),
        base_clock_mhz=_s(1395, _GA102_WP, "GPU Base Clock"),
    ),
    # The datasheet gives tensor throughput only as FP8 with sparsity: no dense BF16, FP16 or
    # TF32 figure to compare with.
    "RTX 6000 Ada": CardSpecs(
        "PCIe",
        fp32=_s(91.1 * T, _RTX6000, "Single-Precision Performance"),
        memory_bandwidth=_s(960 * GB, _RTX6000, "Memory Bandwidth"),
        pcie_gen=_s(4, _RTX6000, "Graphics Bus: PCIe 4.0 x16"),
        pcie_width=_s(16, _RTX6000, "Graphics Bus: PCIe 4.0 x16"),
        power_default_w=_s(300, _RTX6000, "Max Power Consumption"),
    ),
}


def specs_of(card: str) -> CardSpecs | None:
    """The specification of the card table's row ``card`` (its name), None without one."""
    return SPECS.get(card)


# PCIe per-lane rates, in GT/s, and their line codes: 8b/10b to Gen 2, 128b/130b from Gen 3
# to Gen 5; Gen 6's FLIT mode carries 242 of every 256 bytes as payload (PCI-SIG's PCI
# Express Base Specifications, revisions 1.0 to 6.0: https://pcisig.com/specifications).
PCIE_LANE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_PCIE_CODE = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


def pcie_bandwidth(gen: int, width: int) -> float:
    """A PCIe link's raw bandwidth in one direction, bytes/s: Gen 4 x16 is 31.5 GB/s. Copies
    reach 80-90% of it (packet headers); 0.0 for a generation not listed."""
    if gen not in PCIE_LANE_GTS:
        return 0.0
    return PCIE_LANE_GTS[gen] * 1e9 * _PCIE_CODE[gen] / 8 * width
