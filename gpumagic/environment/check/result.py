"""``GpuCheck``: what ``%gpucheck`` and ``gpumagic.gpucheck()`` return."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumagic.environment.check.facts import CardCheck, HostFacts
from gpumagic.environment.check.findings import CheckFinding
from gpumagic.environment.check.measurements import Measurement
from gpumagic.render.html import Rendered

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.render.sections import Report


@dataclass(repr=False)
class GpuCheck(Rendered):
    """Each card judged against its defaults and specification, the host's figures, and the
    findings, ranked. ``unchecked``: what could not be checked, and why. ``when``: the
    check's time (``time.time()``); ``seconds``: how long it took."""

    cards: list[CardCheck]
    host: HostFacts
    findings: list[CheckFinding]
    unchecked: list[str] = field(default_factory=list)
    measured: bool = True
    when: float = 0.0
    seconds: float = 0.0

    @property
    def measurements(self) -> pd.DataFrame:
        """Every figure, one row each: device, figure, value and unit, the specification's
        value and source, their ratio, what was timed."""
        import pandas as pd

        rows = [_row(m) for c in self.cards for m in c.measurements]
        rows += [_row(m) for m in self.host.measurements]
        columns = ["device", "key", "figure", "value", "unit", "spec", "ratio", "source", "size", "calls"]
        return pd.DataFrame(rows, columns=columns)

    @property
    def codes(self) -> list[str]:
        """The findings' codes, in rank order."""
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``json.dumps`` takes it as is): what ``%gpuenv --save`` keeps."""
        return {
            "when": self.when,
            "seconds": self.seconds,
            "measured": self.measured,
            "cards": [_card_dict(c) for c in self.cards],
            "host": {
                **{k: v for k, v in dataclasses.asdict(self.host).items() if k not in ("env_findings", "measurements")},
                "measurements": [_measurement_dict(m) for m in self.host.measurements],
            },
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "unchecked": list(self.unchecked),
        }

    def _report(self) -> Report:
        from gpumagic.render.gpucheck import gpucheck_report

        return gpucheck_report(self)


def _row(m: Measurement) -> dict[str, Any]:
    return {
        "device": m.device, "key": m.key, "figure": m.name, "value": m.value, "unit": m.unit,
        "spec": m.spec, "ratio": m.ratio, "source": m.spec_source, "size": m.size, "calls": m.calls,
    }  # fmt: skip


def _measurement_dict(m: Measurement) -> dict[str, Any]:
    return {**dataclasses.asdict(m), "name": m.name, "unit": m.unit, "ratio": m.ratio}


def _card_dict(c: CardCheck) -> dict[str, Any]:
    return {
        "label": c.label,
        "cuda_index": c.cuda_index,
        "spec_name": c.spec_name,
        "spec_form": c.specs.form if c.specs else None,
        "no_specs": c.no_specs,
        "reading": dataclasses.asdict(c.reading),
        "measurements": [_measurement_dict(m) for m in c.measurements],
        "load": dataclasses.asdict(c.load) if c.load else None,
        "link_load": dataclasses.asdict(c.link_load) if c.link_load else None,
    }
