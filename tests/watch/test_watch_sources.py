"""A source plugs into the one watcher by implementing ``monitor/source.py``'s protocol.

``Levels`` is a source of this test's own (a stand-in for the next reading or the next
place GPUs are watched from): a layout with one column and two labels, rows that grow, a
mark on the row of each cell that ran, an alert, idleness and energy for the meter. The
watcher, its result, its CSV and its live frame take it as they take NVML's or Prometheus's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import Watcher
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.cost import Metered
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.metrics import Metric
from gpumagic.monitor.snapshot import Label, Layout, Snapshot
from gpumagic.monitor.source import Recent, SourceBase
from gpumagic.monitor.watcher import machine_sources
from gpumagic.render.watch_views import LiveFrame

LEVEL = Metric("level", "level [%]", "%", CUDA)


def _cells(snap: Snapshot) -> pd.DataFrame:
    return pd.DataFrame(
        {"source": [c.source for c in snap.cells], "peak_level": [c.peak_utilization for c in snap.cells]}
    )


TOY = Layout(
    view="levels",  # no view is written for it: the frame shows its rows' latest values
    metrics=(LEVEL,),
    labels=(Label("rig", "rig", lambda d: d.host), Label("slot", "slot", lambda d: d.node_index)),
    time_column="time",
    per_value=True,
    interval_s=0.5,
    price_per_gpu=True,
    cells=_cells,
)


class Levels(SourceBase):
    layout = TOY
    origin = "the test's rig"

    def __init__(self) -> None:
        self.levels: dict[str, float] = {"a": 10.0}

    @property
    def devices(self) -> tuple[WatchedDevice, ...]:
        return tuple(WatchedDevice(CUDA, "toy", host="rig", node_index=k) for k in self.levels)

    def read(self, t: float) -> np.ndarray:
        if math.isinf(self.levels.get("a", 0.0)):
            raise OSError("the rig did not answer")
        return np.array([[v] for v in self.levels.values()], dtype=float)

    def fold(self, cell: CellRecord, rows: np.ndarray) -> None:
        top = float(np.nanmax(rows[:, 0]))
        cell.peak_utilization = top if math.isnan(cell.peak_utilization) else max(cell.peak_utilization, top)

    def alerts(self, recent: Recent, running: CellRecord | None) -> list[Alert]:
        times, values = recent(None)
        hot = [d for d, v in zip(self.devices, values[-1, :, 0]) if v > 90]
        return [Alert("hot", d.key, f"{d.label} above 90%", float(times[-1])) for d in hot]

    def meter(self, rows: np.ndarray) -> Metered:
        return Metered(idle=bool(np.nanmax(rows) < 5), energy_mj=np.full(len(rows), 1000.0))


def test_a_source_of_its_own_fills_the_frames_log_alerts_and_bill(tmp_path: Path) -> None:
    assert Watcher([Levels()]).interval == 0.5  # the layout's default
    source = Levels()
    log = tmp_path / "levels.csv"
    # started (its first sample), but the thread's next one is 10 s away: the test takes them
    w = Watcher([source], interval=10.0, log=log, price=3.6, cells=False).start()
    assert w.origin == "the test's rig"
    source.levels["b"] = 95.0  # a second device appears: a new row, the samples so far kept
    w.sample_now()
    source.levels["a"] = 50.0
    w.sample_now()
    assert [d.label for d in w.gpus] == ["rig GPU a", "rig GPU b"]
    assert {(a.kind, a.device) for a in w.status().alerts} == {("hot", "rig GPU b")}

    result = w.stop()
    samples = result.samples
    assert list(samples.columns) == ["time", "rig", "slot", "level"]
    assert len(samples) == 2 * 4  # both rows in every sample, the last one taken at the stop
    levels = samples.groupby("slot")["level"].apply(list).to_dict()
    assert levels["a"] == [10.0, 10.0, 50.0, 50.0]
    assert math.isnan(levels["b"][0]) and levels["b"][1:] == [95.0, 95.0, 95.0]
    series = result.series
    assert list(series.columns) == ["time", "metric", "rig", "slot", "value"]
    assert len(series) == 7 and set(series["metric"]) == {"level"}
    # the CSV is the series, as the layout says (one row per value)
    logged = pd.read_csv(log, dtype={"slot": str})
    assert list(logged.columns) == ["time", "metric", "rig", "slot", "value"]
    assert sorted(logged["value"]) == sorted(series["value"])
    seen = {a.key: n for a, _, n in result.alerts}
    assert seen == {("hot", "rig GPU b"): 3}
    # the meter: 1000 mJ per device per interval; the price is per GPU-hour, 2 GPUs now
    cost = result.cost
    assert cost is not None and cost.units == 2
    assert cost.device_energy_mj.tolist() == [4000.0, 3000.0]
    assert cost.total_usd == pytest.approx(3.6 * 2 * cost.metered_s / 3600)
    assert cost.metered_s == pytest.approx(w.stopped_at - w.started)
    with pytest.raises(AttributeError, match="stragglers"):
        _ = result.stragglers  # a job's frame: this layout offers none
    # no view is written for this layout: its rows' latest values, by its own names
    text = str(result)
    assert "rig GPU b above 90%" in text  # its alert on top
    table = text[text.index("slot") :].splitlines()
    assert table[2].split() == ["rig", "a", "50", "%"] and table[3].split() == ["rig", "b", "95", "%"]


def test_a_source_marks_the_row_of_the_cell_that_ran() -> None:
    source = Levels()
    w = Watcher([source], cells=False)
    w.sample_now()
    w.marks.open("train()", 3)
    source.levels["a"] = 70.0
    w.sample_now()
    source.levels["a"] = 20.0
    w.sample_now()
    w.marks.close(3, True)
    w.sample_now()  # the closing sample: the cell's last moments
    cells = w.result().cells
    assert cells.to_dict("records") == [{"source": "train()", "peak_level": 70.0}]


def test_a_failing_read_costs_one_sample(tmp_path: Path) -> None:
    source = Levels()
    w = Watcher([source], cells=False)
    w.sample_now()
    source.levels["a"] = math.inf
    w.sample_now()
    source.levels["a"] = 30.0
    w.sample_now()
    assert w.sample_errors == 1 and w.seq == 2
    assert any("rig did not answer" in n for n in w.notes())
    html = LiveFrame(w)()
    assert "rig" in html and "30 %" in html


def test_sources_of_two_layouts_cannot_share_a_watcher(fake_nvml: Any) -> None:
    fake_nvml([])
    with pytest.raises(ValueError, match="one layout"):
        Watcher([*machine_sources(), Levels()])
