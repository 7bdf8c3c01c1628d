"""``MemFit``: what ``%%memfit`` predicts, as data (DataFrames and plain values) with a
report (``_repr_mimebundle_``: :mod:`gpumagic.render.memfit`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumagic.memory.fit.accounting import FIT_KEYS
from gpumagic.memory.fit.batch import BatchFit
from gpumagic.memory.fit.headroom import HeadroomLine
from gpumagic.render.html import Rendered

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.memory.fit.sharding.fit import ShardFit
    from gpumagic.render.sections import Report


@dataclass
class Target:
    """The memory the prediction is held against: a card of the table, this machine's GPU,
    or a size given."""

    name: str
    capacity: int
    uncertainty: int = 0
    source: str = ""
    how: str = ""
    capability: int | None = None
    capability_minor: int | None = None


@dataclass
class WhatIf:
    fix: str
    changed: str  # what the dry run changed, in words ("" and ``unavailable`` set: not run)
    peak_bytes: int | None
    saving_bytes: int | None
    categories: dict[str, int] = field(default_factory=dict)  # category -> bytes at its peak
    unavailable: str = ""
    error: str = ""


@dataclass(repr=False, eq=False)
class MemFit(Rendered):
    """What a dry run predicts for the CUDA peak of a cell.

    ``peak_bytes``: the predicted peak of the tensors' memory on the GPU (CUDA's 512-byte
    rounding included, headroom not); ``categories``: category -> bytes alive at that peak;
    ``peak_line`` / ``peak_source``: the statement running then (the magic's line is 1);
    ``fits``: True, False, or None within the headroom's uncertainty (None also when no
    target was given); ``headroom``: the lines added to the peak, each with its range and
    source; ``max_batch``: with ``--batch``, the largest batch confirmed to fit;
    ``notes``: the approximations made.
    """

    peak_bytes: int
    categories: dict[str, int]
    module_rows: list[tuple[str, str, int]]
    peak_line: int | None
    peak_source: str
    target: Target | None
    headroom: list[HeadroomLine]
    fits: bool | None
    need: tuple[int, int, int]  # peak plus headroom: figure, low, high
    notes: list[str] = field(default_factory=list)
    batch: BatchFit | None = None
    what_ifs: list[WhatIf] = field(default_factory=list)
    on_gpu: bool = False
    seconds: float = 0.0
    error: str = ""  # the dry run stopped: "line 4: ..."
    error_line: int | None = None
    start_bytes: int = 0
    end_bytes: int = 0
    verdicts: list[tuple[str, int, bool | None]] = field(default_factory=list)  # (gpu, capacity, fits)
    shard: ShardFit | None = None  # --gpus N --shard MODES

    @property
    def shards(self) -> pd.DataFrame:
        """With ``--gpus N --shard``: one row per mode (the busiest rank's peak, its parts, the
        verdict, the smallest card and the smallest N); empty without."""
        from gpumagic.memory.fit.sharding.fit import shard_table

        return shard_table(self.shard)

    # -- data -------------------------------------------------------------------------------
    @property
    def modules(self) -> pd.DataFrame:
        """module, category, bytes alive at the peak ("" for tensors no module owns)."""
        import pandas as pd

        return pd.DataFrame(self.module_rows, columns=["module", "category", "bytes"])

    @property
    def max_batch(self) -> int | None:
        return self.batch.largest if self.batch is not None else None

    @property
    def what_if(self) -> pd.DataFrame:
        """fix, changed, peak_bytes, saving_bytes and, per category, ``<category>_saving``."""
        import pandas as pd

        rows: list[dict[str, Any]] = []
        for w in self.what_ifs:
            row: dict[str, Any] = {
                "fix": w.fix,
                "changed": w.changed or w.unavailable or w.error,
                "peak_bytes": w.peak_bytes,
                "saving_bytes": w.saving_bytes,
            }
            for c in FIT_KEYS:
                row[f"{c}_saving"] = (
                    self.categories.get(c, 0) - w.categories.get(c, 0) if w.peak_bytes is not None else None
                )
            rows.append(row)
        columns = ["fix", "changed", "peak_bytes", "saving_bytes", *(f"{c}_saving" for c in FIT_KEYS)]
        return pd.DataFrame(rows, columns=columns)

    @property
    def batches(self) -> pd.DataFrame:
        """batch, peak_bytes, need_bytes, fits: every dry run ``--batch`` made."""
        import pandas as pd

        points = self.batch.points if self.batch is not None else []
        return pd.DataFrame(
            [(p.value, p.peak, p.need, p.fits) for p in points],
            columns=["batch", "peak_bytes", "need_bytes", "fits"],
        )

    def _report(self) -> Report:
        from gpumagic.render.memfit import memfit_report

        return memfit_report(self)
