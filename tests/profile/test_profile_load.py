"""Loading every real trace, the tables' shapes, multi-rank, and bad input."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from profile_helpers import ALL_TRACES, TraceBuilder, trace_path

from gpumagic.profile import TraceError
from gpumagic.profile.analysis.breakdown import CATEGORIES
from gpumagic.profile.load import load_trace


@pytest.mark.parametrize("name", ALL_TRACES)
def test_every_trace_loads_and_breakdown_sums_to_100(load, name):
    r = load(name)
    s = r.summary
    assert s.steps >= 1
    assert s.step_time_us > 0
    assert list(r.breakdown.index) == list(CATEGORIES)
    assert list(r.breakdown.columns) == ["us", "percent"]
    assert r.breakdown["percent"].sum() == pytest.approx(100.0, abs=1e-6)
    # every instant once: the category times add up to the step time, step by step
    cats = [f"{c}_us" for c in CATEGORIES]
    assert (r.steps[cats].sum(axis=1) - r.steps["duration_us"]).abs().max() < 1e-3
    assert r.breakdown["us"].sum() == pytest.approx(s.step_time_us, rel=1e-9)
    assert s.wall_time_us >= s.profiled_span_us > 0
    for column in [
        "name",
        "calls",
        "host_self_us",
        "host_total_us",
        "device_self_us",
        "device_total_us",
    ]:
        assert column in r.ops.columns
    assert (r.ops["host_self_us"] <= r.ops["host_total_us"] + 1e-6).all()
    assert (r.ops["device_self_us"] <= r.ops["device_total_us"] + 1e-6).all()


def test_the_summary_is_a_typed_object_a_typo_cannot_read(load):
    import dataclasses

    from gpumagic.profile import ProfileSummary

    s = load("v100_training_5steps.json.gz").summary
    assert isinstance(s, ProfileSummary) and dataclasses.is_dataclass(s)
    with pytest.raises(AttributeError):
        s.step_time  # noqa: B018  (the field is step_time_us)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.steps = 0  # type: ignore[misc]
    fields = {f.name for f in dataclasses.fields(ProfileSummary)}
    assert {"steps", "step_time_us", "gpu_utilization_percent"} <= fields  # issue 3's three


def test_resnet_summary_numbers(load):
    r = load("resnet50_v100_num_workers_0.json.gz")
    s = r.summary
    assert s.steps == 6
    assert s.step_names == ["16", "17", "18", "19", "20", "21"]
    assert s.step_time_us == pytest.approx(154911.3, abs=0.1)
    assert s.gpu_utilization_percent == pytest.approx(63.607, abs=0.01)
    assert s.devices == ["Tesla V100-DGXS-32GB"]
    # 6 steps x (2 input copies) of pageable memory, as the trace records
    k = r.kernels
    assert list(k.columns[:5]) == ["name", "calls", "total_us", "mean_us", "max_us"]
    assert k["total_us"].is_monotonic_decreasing
    assert k["calls"].sum() == 8772  # every Kernel event of the trace
    assert k["mean_us"].iloc[0] == pytest.approx(k["total_us"].iloc[0] / k["calls"].iloc[0])
    assert 0 < k["occupancy_percent"].max() <= 100


def test_ops_device_time_comes_from_the_launching_operator(load):
    r = load("resnet50_v100_num_workers_0.json.gz")
    ops = r.ops.set_index("name")
    conv = ops.loc["aten::cudnn_convolution"]
    # the cudnn op launches the kernels itself; its wrappers only include them
    assert conv["device_self_us"] > 0
    assert conv["device_self_us"] == pytest.approx(conv["device_total_us"])
    assert ops.loc["aten::conv2d", "device_self_us"] == 0
    assert ops.loc["aten::conv2d", "device_total_us"] == pytest.approx(
        conv["device_total_us"], rel=1e-6
    )
    # all device time is attributed to some operator at most once at the self level
    gpu = r.primary.trace.gpu
    assert r.ops["device_self_us"].sum() <= float((gpu.end - gpu.ts).sum()) + 1e-3


def test_ops_by_shape_when_shapes_were_recorded(load):
    r = load("resnet50_v100_num_workers_0.json.gz")
    by_shape = r.ops_by_shape
    conv = by_shape[by_shape["name"] == "aten::cudnn_convolution"]
    assert len(conv) > 1  # different layers, different shapes
    assert conv["input_shapes"].str.startswith("[[").all()
    assert conv["calls"].sum() == r.ops.set_index("name").loc["aten::cudnn_convolution", "calls"]


def test_cpu_only_trace_gives_a_cpu_only_analysis(load):
    r = load("cpu_only.json.gz")
    s = r.summary
    assert s.cpu_only is True
    assert s.gpu_utilization_percent is None
    assert s.gpu_idle_us_per_step is None
    assert r.kernels.empty
    assert r.breakdown.loc[["Kernel", "Memcpy", "Memset", "Runtime"], "us"].sum() == 0
    # the run's gloo:all_reduce spans are Communication, as the TensorBoard plugin says (85.088%)
    assert r.breakdown.loc["Communication", "percent"] == pytest.approx(85.088, abs=0.01)
    assert r.breakdown.loc["CPU Exec", "percent"] == 0
    # GPU rules are silent; the report says there is no GPU
    assert not {f.rule for f in r.findings} & {
        "pageable_memcpy",
        "sync",
        "launch_bound",
        "tensor_cores",
        "low_utilization",
        "small_grid",
    }
    assert "CPU-only" in r._text()


def test_two_ranks_directory_gives_per_rank_rows_and_the_slowest(load):
    r = load_trace(trace_path("two_ranks"))
    assert r.ranks == [0, 1]
    pr = r.per_rank
    assert list(pr["rank"]) == [0, 1]
    assert pr.loc[0, "step_time_us"] == pytest.approx(615120.0, abs=0.5)
    assert pr.loc[1, "step_time_us"] == pytest.approx(619271.5, abs=0.5)
    assert r.slowest_rank == 1
    assert list(pr["slowest"]) == [False, True]
    assert r.summary.slowest_rank == 1
    assert r.summary.ranks == 2
    # the tables describe the slowest rank; any rank is reachable
    assert r.summary.step_time_us == pytest.approx(619271.5, abs=0.5)
    assert r.rank(0).summary.step_time_us == pytest.approx(615120.0, abs=0.5)
    text = r._text()
    assert "slowest: rank 1" in text
    assert "rank-0.json.gz" in text and "rank-1.json.gz" in text
    html = r._html()
    assert "Per rank" in html and "gm-hot" in html


def test_dataloader_steps_when_there_are_no_profiler_steps(tmp_path):
    # a notebook loop profiled without a schedule: no ProfilerStep, three batches
    events = []
    for i, t0 in enumerate((0.0, 1000.0, 2000.0)):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "pid": 1,
                "tid": 1,
                "ts": t0,
                "dur": 300.0,
                "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 400.0,
                "dur": 500.0,
                "name": f"aten::mm#{i}",
            }
        )
    path = tmp_path / "loop.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = load_trace(path)
    assert r.summary.steps_from == "DataLoader"
    assert r.summary.steps == 3
    assert list(r.steps["duration_us"]) == [1000.0, 1000.0, 900.0]
    assert r.breakdown.loc["DataLoader", "us"] == pytest.approx(300.0)
    assert r.breakdown.loc["CPU Exec", "us"] == pytest.approx(500.0)


def test_whole_trace_is_one_step_without_marks(load):
    r = load("a100_alexnet_syncs.json.gz")
    assert r.summary.steps_from == "trace"
    assert r.summary.steps == 1


def test_flat_host_ops_with_launches_inside_render(tmp_path):
    """No host op inside another (no step marks, no nesting) but launches inside the ops: the
    host self times once failed to add the runtime's float times to numpy's int zeros."""
    b = TraceBuilder()
    for i in range(2):
        t0 = 1000.0 + i * 5000
        b.op("aten::mm", t0 + 10, 40)
        b.launch("ampere_sgemm_128x64_nn", t0 + 15, t0 + 60, 500)
    r = load_trace(b.write(tmp_path / "flat.json"))
    assert r.summary.steps_from == "trace"
    ops = r.ops.set_index("name")
    assert ops.loc["aten::mm", "host_self_us"] == pytest.approx(2 * (40 - 5))
    assert "aten::mm" in r.to_text()


# --- bad input -------------------------------------------------------------------------------


def _bad(path: Path, fragment: str) -> None:
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert str(path) in message, message
    assert fragment in message, message
    assert isinstance(info.value, ValueError)


def test_missing_path(tmp_path):
    _bad(tmp_path / "nope.json.gz", "no such file")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.json"
    p.write_bytes(b"")
    _bad(p, "empty")


def test_empty_directory(tmp_path):
    d = tmp_path / "ranks"
    d.mkdir()
    (d / "notes.txt").write_text("not a trace")
    _bad(d, "no trace files")


def test_truncated_json(tmp_path):
    full = gzip.decompress(trace_path("cpu_only.json.gz").read_bytes())
    p = tmp_path / "cut.json"
    p.write_bytes(full[: len(full) // 2])
    _bad(p, "truncated")


def test_invalid_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"traceEvents": [ {"ph": "X", "ts": 1,, } ]}')
    _bad(p, "invalid JSON")


def test_json_that_is_not_a_trace(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"learning_rate": 0.1, "epochs": 3}')
    _bad(p, "not a Chrome trace")
    q = tmp_path / "numbers.json"
    q.write_text("[1, 2, 3]")
    _bad(q, "not a Chrome trace")
    s = tmp_path / "scalar.json"
    s.write_text("42")
    _bad(s, "not a Chrome trace")


def test_trace_without_events(tmp_path):
    p = tmp_path / "none.json"
    p.write_text('{"traceEvents": []}')
    _bad(p, "no events")
    q = tmp_path / "meta.json"
    q.write_text(
        '{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]}'
    )
    _bad(q, "no duration events")


def test_truncated_gzip(tmp_path):
    data = trace_path("cpu_only.json.gz").read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    _bad(p, "gzip stream is truncated")


def test_corrupt_gzip(tmp_path):
    data = bytearray(trace_path("cpu_only.json.gz").read_bytes())
    data[20:40] = b"\x00" * 20
    p = tmp_path / "corrupt.json.gz"
    p.write_bytes(bytes(data))
    _bad(p, "not a valid gzip file")


def test_directory_with_one_bad_rank_names_that_file(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank-0.json.gz").write_bytes(trace_path("two_ranks/rank-0.json.gz").read_bytes())
    (d / "rank-1.json").write_text('{"traceEvents": [')
    with pytest.raises(TraceError) as info:
        load_trace(d)
    assert "rank-1.json" in str(info.value)


def test_wrong_field_type_is_a_trace_error_not_a_crash(tmp_path):
    p = tmp_path / "odd.json"
    p.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "soon", "dur": 1}]}'
    )
    _bad(p, "ts")


def test_bare_array_trace_and_plain_json(tmp_path):
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::add",
            "pid": 1,
            "tid": 1,
            "ts": 10.0,
            "dur": 5.0,
        }
    ]
    p = tmp_path / "array.json"
    p.write_text(json.dumps(events))
    r = load_trace(p)
    assert r.summary.steps == 1
    assert r.ops.loc[0, "name"] == "aten::add"
    assert math.isclose(r.ops.loc[0, "host_self_us"], 5.0)


def test_not_a_number_values_and_bare_na_are_tolerated(tmp_path):
    # some Kineto builds wrote N/A (even unquoted, which is not JSON) for unknown numbers
    b = TraceBuilder()
    b.op("ProfilerStep#1", 0.0, 100.0, cat="user_annotation")
    b.launch("k1", 10.0, 20.0, 30.0, **{"blocks per SM": "N/A", "est. achieved occupancy %": None})
    b.launch("k2", 40.0, 50.0, 10.0, **{"blocks per SM": 2.0})
    text = json.dumps({"deviceProperties": b.props, "traceEvents": b.events})
    p = tmp_path / "na.json"
    p.write_text(text.replace('"blocks per SM": 2.0', '"blocks per SM": N/A'))
    r = load_trace(p)
    k = r.kernels.set_index("name")
    assert k.loc["k1", "total_us"] == 30.0 and k.loc["k2", "total_us"] == 10.0
    assert math.isnan(k.loc["k1", "blocks_per_sm"]) and math.isnan(k.loc["k2", "blocks_per_sm"])
    assert r.summary.gpu_utilization_percent == pytest.approx(40.0)


def test_launches_matched_by_flow_arrows_when_correlation_is_missing(tmp_path):
    b = TraceBuilder()
    b.op("ProfilerStep#1", 0.0, 100.0, cat="user_annotation")
    b.op("ProfilerStep#2", 100.0, 100.0, cat="user_annotation")
    b.launch("k1", 10.0, 150.0, 100.0)  # launched in step 1, runs past its end
    b.launch("k2", 110.0, 260.0, 20.0)
    for e in list(b.events):
        corr = e["args"].pop("correlation", None)
        if corr is not None and e["cat"] == "cuda_runtime":
            b.events.append(
                {
                    "ph": "s",
                    "cat": "ac2g",
                    "name": "ac2g",
                    "id": corr,
                    "pid": 1,
                    "tid": 1,
                    "ts": e["ts"],
                }
            )
        elif corr is not None:
            b.events.append(
                {
                    "ph": "f",
                    "cat": "ac2g",
                    "name": "ac2g",
                    "id": corr,
                    "pid": 0,
                    "tid": 7,
                    "ts": e["ts"],
                    "bp": "e",
                }
            )
    r = load_trace(b.write(tmp_path / "flows.json"))
    # step 1 is extended to the end of k1 (250), which its launch correlates through the arrows
    assert list(r.steps["end_us"]) == [250.0, 280.0]
    assert list(r.steps["device_events"]) == [1, 1]


def _rank_trace(path: Path, rank: int, loader_us: float, allreduce_us: float) -> None:
    """Two synchronised steps of 10 ms: a DataLoader fetch, compute, a gloo all-reduce."""
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": f"rank {rank}"}}]
    for i in range(2):
        t0 = 10_000.0 * i
        span = {"ph": "X", "pid": 1, "tid": 1, "cat": "user_annotation"}
        events.append({**span, "ts": t0, "dur": 10_000.0, "name": f"ProfilerStep#{i}"})
        events.append({**span, "ts": t0, "dur": loader_us, "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"})
        compute = 10_000.0 - loader_us - allreduce_us
        events.append({**span, "cat": "cpu_op", "ts": t0 + loader_us, "dur": compute, "name": "aten::mm"})
        events.append(
            {**span, "cat": "cpu_op", "ts": t0 + loader_us + compute, "dur": allreduce_us, "name": "gloo:all_reduce"}
        )
    path.write_text(json.dumps({"distributedInfo": {"rank": rank}, "traceEvents": events}))


def test_the_rank_others_wait_for_is_the_one_that_waits_least_in_collectives(tmp_path):
    # DDP: every rank's step is equally long (the all-reduce makes them wait for each
    # other); the straggler (rank 1, slow data) is the one that spends least time waiting
    _rank_trace(tmp_path / "rank0.json", 0, loader_us=500.0, allreduce_us=6_000.0)
    _rank_trace(tmp_path / "rank1.json", 1, loader_us=6_000.0, allreduce_us=500.0)
    r = load_trace(tmp_path)
    pr = r.per_rank
    assert list(pr["step_time_us"]) == [10_000.0, 10_000.0]
    assert list(pr["collective_us_per_step"]) == [6_000.0, 500.0]
    assert r.slowest_rank == 1
    assert list(pr["slowest"]) == [False, True]


@pytest.mark.parametrize(
    "values",
    [
        [(7, 7), (7, 9), (3, 9), (7, 7), (3, 1)],  # ints: coded in numpy
        [(7, "7"), (7, 7), (0, "stream 7"), (7, "7")],  # "7" and 7 are two threads
        [(1, 2**63), (1, 5), (1, 2**63)],  # past int64: coded as objects
        [(1, -3), (2, -3), (1, 0)],
    ],
)
def test_threads_are_numbered_in_the_order_they_first_appear(values):
    # decode codes (pid, tid) with numpy where both are int64s (issue 27); every event of a
    # thread gets one number, and numbers follow first appearance, as a dict numbers them
    from gpumagic.profile.trace.decode import _Complete, _thread_codes

    events = [_Complete(pid=p, tid=t) for p, t in values]
    pids, tids = ({}, {})
    for p, t in values:
        pids.setdefault(p, len(pids))
        tids.setdefault(t, len(tids))
    expected = [pids[p] * len(tids) + tids[t] for p, t in values]
    assert _thread_codes([events[:2], events[2:]]).tolist() == expected
