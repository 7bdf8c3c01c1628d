"""What the rules judge: each card's readings, specification and measurements, and the host's.

Plain data, filled by :mod:`gpumagic.environment.check.run` and read by
:mod:`gpumagic.environment.check.findings`; nothing here reads the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpumagic.card_specs import CardSpecs
from gpumagic.environment.check.measurements import LoadSample, Measurement
from gpumagic.environment.check.readings import CardReading
from gpumagic.environment.checks import Finding


@dataclass
class CardCheck:
    """One card: what NVML read (``reading``), the card table's row (``spec_name``) and its
    specification (``specs``; ``no_specs`` says why there is none), what was measured on it,
    and what NVML read while a matmul (``load``) and a pinned copy (``link_load``) ran."""

    reading: CardReading
    cuda_index: int | None = None
    spec_name: str | None = None
    specs: CardSpecs | None = None
    no_specs: str = ""
    measurements: list[Measurement] = field(default_factory=list)
    load: LoadSample | None = None
    link_load: LoadSample | None = None

    @property
    def label(self) -> str:
        """``cuda:0`` where CUDA numbers it, else NVML's (nvidia-smi's) number."""
        if self.cuda_index is not None:
            return f"cuda:{self.cuda_index}"
        return f"GPU {self.reading.nvml_index}"

    def measured(self, key: str) -> Measurement | None:
        return next((m for m in self.measurements if m.key == key), None)


@dataclass
class HostFacts:
    """The process and its torch: the build, whether CUDA works, the threads torch uses
    against the CPUs this process may use, ``%gpuenv``'s findings and the host's figures."""

    torch_version: str | None
    torch_build: str
    cuda_available: bool
    driver_present: bool
    driver_version: str | None
    torch_threads: int | None
    usable_cpus: int
    affinity: int | None
    flags: dict[str, bool | str | None] = field(default_factory=dict)
    env_findings: list[Finding] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    nvml_reason: str | None = None

    def measured(self, key: str) -> Measurement | None:
        return next((m for m in self.measurements if m.key == key), None)
