"""NVIDIA DCGM's field names, as dcgm-exporter publishes them: what the job view reads
through Prometheus and what ``serve_metrics`` writes, so a column means one thing.

dcgm-exporter (``etc/default-counters.csv``) publishes one gauge or counter per DCGM field,
named after it (``DCGM_FI_DEV_GPU_UTIL``), with the labels ``gpu`` (the index on its node),
``UUID``, ``device`` (``nvidia0``), ``modelName``, ``pci_bus_id``, ``Hostname`` (renamed
``hostname`` in dcgm-exporter #655, 2026) and, from the label-type fields,
``DCGM_FI_DRIVER_VERSION``; Prometheus adds ``instance`` and ``job``, and on Kubernetes the
exporter adds ``pod``, ``namespace`` and ``container``.

A field DCGM could not read is not left out: it is published as one of DCGM's *blank*
values (``DCGM_INT64_BLANK`` = 0x7ffffffffffffff0 and the codes just above it for "not
found", "not supported", "no permission"; ``DCGM_FP64_BLANK`` = 2**47; the 32-bit ones at
0x7ffffff0), which Prometheus stores as ordinary numbers: 9.2e18 °C for a memory
temperature the board lacks (dcgm-exporter's README shows one). :func:`is_blank` tells
them apart, and the job view drops them and says which field was blank.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumagic.device_kinds import CUDA
from gpumagic.monitor.metrics import Metric

# dcgmvalue.h: the smallest blank of each width (the codes up to +15 are the others)
INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0  # 2**47


@dataclass(frozen=True)
class Field(Metric):
    """One DCGM field as the job view reads it: a column of the job's samples, named (in the
    frames and the CSV alike) by the Prometheus metric, DCGM's field name."""

    required: bool = False  # the view needs it: a note names it when Prometheus has none
    small: bool = True  # its real values stay far below 2**31 (the 32-bit blanks apply)
    help: str = ""

    @property
    def name(self) -> str:
        return self.key


def _field(name: str, unit: str, required: bool, small: bool = True, help: str = "") -> Field:
    # unit: "%", "MiB", "W", "°C", "mJ", "ratio" (0-1), "code"
    return Field(name, name, unit, CUDA, required=required, small=small, help=help)


UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
XID = "DCGM_FI_DEV_XID_ERRORS"

JOB_FIELDS: tuple[Field, ...] = (
    _field(UTIL, "%", True, help="GPU utilization (in %)."),
    _field(FB_USED, "MiB", True, help="Framebuffer memory used (in MiB)."),
    _field(FB_FREE, "MiB", True, help="Framebuffer memory free (in MiB)."),
    _field(POWER, "W", True, help="Power draw (in W)."),
    _field(TEMP, "°C", True, help="GPU temperature (in C)."),
    # mJ since the driver loaded: a 700 W GPU passes 2**31 mJ in under an hour
    _field(ENERGY, "mJ", True, small=False, help="Total energy consumption since boot (in mJ)."),
    # profiling fields: Volta and newer data-centre GPUs, and only if the exporter's CSV has them
    _field(
        SM_ACTIVE, "ratio", False, help="The ratio of cycles an SM has at least 1 warp assigned."
    ),
    _field(TENSOR_ACTIVE, "ratio", False, help="Ratio of cycles the tensor (HMMA) pipe is active."),
    _field(XID, "code", False, help="Value of the last XID error encountered."),
)
FIELD_INDEX: dict[str, int] = {f.name: i for i, f in enumerate(JOB_FIELDS)}
REQUIRED = tuple(f.name for f in JOB_FIELDS if f.required)

# The node a series comes from: dcgm-exporter's label (either spelling), else the scrape
# target Prometheus added.
HOST_LABELS = ("Hostname", "hostname", "instance")
# Labels kept per GPU (the rest of a series' labels are scrape plumbing).
GPU_LABELS = (
    "UUID",
    "uuid",
    "modelName",
    "device",
    "pci_bus_id",
    "DCGM_FI_DRIVER_VERSION",
    "instance",
    "job",
    "namespace",
    "pod",
    "container",
)


def is_blank(value: float, field: Field) -> bool:
    """A DCGM blank ("no value", "not supported", ...) published as a number."""
    if value != value:  # NaN
        return True
    if value >= FP64_BLANK:  # the 64-bit integer blanks are larger still
        return True
    return field.small and INT32_BLANK <= value < INT32_BLANK + 16
