"""Per-line and per-module attribution from traces (issue 10).

The CUDA cases are traces built here from a few events (no shared trace was recorded by
%%gpuprofile); the with_stack case is a real trace recorded by torch on this CPU; the
shared real traces check that a trace from elsewhere gets no lines, and says why.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
from profile_helpers import ALL_TRACES, TraceBuilder, trace_path

from gpumagic.profile.load import load_trace
from gpumagic.profile.trace.spans import CodeLabels, ModuleLabel, StatementLabel, copy_with_labels

LABELS = CodeLabels(
    [
        StatementLabel(0, 2, 0, "out = model(x)"),
        StatementLabel(1, 3, 0, "x = host_x.cuda()"),
        StatementLabel(2, 4, 0, "loss.backward()"),
    ],
    [ModuleLabel(0, "model", "Net"), ModuleLabel(1, "model.fc", "Linear")],
)


def _write(b: TraceBuilder, path: Path, labels: CodeLabels | None = LABELS) -> Path:
    doc = {"schemaVersion": 1, "deviceProperties": b.props, "traceEvents": b.events}
    if labels is not None:
        doc["gpumagicCode"] = json.loads(labels.to_json())
    path.write_text(json.dumps(doc))
    return path


def _cell(ranges: bool = True) -> TraceBuilder:
    """Three statements: a forward pass in model.fc (an fp32 matmul on a CUDA-core kernel),
    a pageable copy, and a backward pass whose kernels autograd's thread (tid 2) launches."""
    b = TraceBuilder()
    if ranges:
        b.op("gpumagic.line#0 L2", 0.0, 1000.0)
        b.op("gpumagic.line#1 L3", 1000.0, 1000.0, cat="user_annotation")  # record_function's kind
        b.op("gpumagic.line#2 L4", 2000.0, 3000.0)
        b.op("gpumagic.module#0", 10.0, 900.0)
        b.op("gpumagic.module#1", 50.0, 800.0)
    b.op("aten::linear", 60.0, 700.0)
    b.op("aten::addmm", 100.0, 500.0, **{"Sequence number": 7, "Fwd thread id": 0})
    b.launch("volta_sgemm_128x64_nn", 150.0, gpu_ts=200.0, gpu_dur=600.0)
    b.op("aten::copy_", 1100.0, 300.0)
    b.launch("Memcpy HtoD (Pageable -> Device)", 1150.0, 1200.0, 80.0, cat="gpu_memcpy")
    # backward on autograd's device thread, inside line 4's range in time
    node = "autograd::engine::evaluate_function: AddmmBackward0"
    b.op(node, 2500.0, 1000.0, tid=2, **{"Sequence number": 7, "Fwd thread id": 1})
    b.op("aten::mm", 2600.0, 700.0, tid=2)
    b.launch("volta_sgemm_64x64_nt", 2700.0, gpu_ts=3000.0, gpu_dur=400.0, tid=2)
    # launched after the last statement: charged to no line
    b.launch("void at::native::vectorized_elementwise_kernel<4>", 6000.0, 6100.0, 50.0)
    return b


@pytest.fixture
def cell(tmp_path):
    return load_trace(_write(_cell(), tmp_path / "cell.json"))


def test_device_time_goes_to_the_line_whose_range_holds_the_launch(cell):
    lines = cell.lines.set_index("line")
    assert list(lines.index) == [2, 3, 4]
    assert list(lines["source"]) == ["out = model(x)", "x = host_x.cuda()", "loss.backward()"]
    assert list(lines["hits"]) == [1, 1, 1]
    assert list(lines["host_us"]) == [1000.0, 1000.0, 3000.0]
    assert list(lines["device_us"]) == [600.0, 80.0, 400.0]  # tid 2's kernel is line 4's
    total = 600 + 80 + 400 + 50
    assert lines.loc[2, "device_percent"] == pytest.approx(100 * 600 / total)
    assert lines.loc[2, "top_kernel"] == "volta_sgemm_128x64_nn"
    assert lines.loc[4, "top_kernel"] == "volta_sgemm_64x64_nt"
    assert lines.loc[3, "top_kernel"] == ""  # a copy, no kernel
    assert lines.loc[2, "top_op"] == "aten::addmm"  # the op that launched the GPU work
    assert lines.loc[4, "top_op"] == "aten::mm"


def test_ranges_leave_breakdown_tables_and_diagnosis_as_without_them(cell, tmp_path):
    bare = load_trace(_write(_cell(ranges=False), tmp_path / "bare.json", labels=None))
    assert bare.lines.empty and bare.modules.empty and bare.lines_note
    assert cell.lines_note == ""
    assert bare.breakdown.equals(cell.breakdown)
    assert bare.ops.equals(cell.ops)
    assert bare.summary == dataclasses.replace(cell.summary, source=bare.summary.source)
    assert [(f.rule, f.saving_us) for f in bare.findings] == [
        (f.rule, f.saving_us) for f in cell.findings
    ]
    assert all(f.line is None and f.module == "" for f in bare.findings)


def test_findings_name_their_line_and_module(cell):
    found = {f.rule: f for f in cell.findings}
    copy = found["pageable_memcpy"]
    assert (copy.line, copy.source) == (3, "x = host_x.cuda()")
    tc = found["tensor_cores"]
    assert tc.line == 2 and tc.source == "out = model(x)"
    # the fp32 matmuls sit in model.fc: its forward's kernel, and its backward's through the link
    assert tc.module == "model.fc"
    assert "line 3 · `x = host_x.cuda()`" in cell.to_text()
    assert "module <code>model.fc</code>" in cell._repr_mimebundle_()["text/html"]


def test_modules_forward_and_backward_across_threads(cell):
    m = cell.modules.set_index("module")
    assert list(m.index) == ["model", "model.fc"]
    assert list(m["type"]) == ["Net", "Linear"]
    assert list(m["depth"]) == [0, 1] and m.loc["model.fc", "parent"] == "model"
    assert m.loc["model.fc", "forward_host_us"] == 800.0
    assert m.loc["model.fc", "forward_device_us"] == 600.0
    # the backward node (tid 2) shares Sequence number 7 with aten::addmm inside model.fc
    assert m.loc["model.fc", "backward_host_us"] == 1000.0
    assert m.loc["model.fc", "backward_device_us"] == 400.0
    assert m.loc["model", "backward_device_us"] == 400.0  # inclusive of its children
    assert m.loc["model", "forward_host_us"] == 900.0


def test_module_called_inside_itself_is_counted_once(tmp_path):
    b = TraceBuilder()
    b.op("gpumagic.line#0 L2", 0.0, 1000.0)
    b.op("gpumagic.module#0", 10.0, 900.0)
    b.op("gpumagic.module#0", 100.0, 500.0)  # recursion: the same instance again
    labels = CodeLabels([StatementLabel(0, 2, 0, "y = f(x)")], [ModuleLabel(0, "f", "Rec")])
    m = load_trace(_write(b, tmp_path / "rec.json", labels)).modules
    assert int(m["calls"].iloc[0]) == 2
    assert float(m["forward_host_us"].iloc[0]) == 900.0


def test_labels_are_optional_lines_keep_their_numbers(tmp_path):
    r = load_trace(_write(_cell(), tmp_path / "nolabels.json", labels=None))
    assert list(r.lines["line"]) == [2, 3, 4]
    assert list(r.lines["source"]) == ["", "", ""]
    assert list(r.modules["module"]) == ["gpumagic.module#0", "gpumagic.module#1"]


def test_copy_with_labels_streams_them_into_a_trace(tmp_path):
    b = _cell()
    raw = json.dumps({"schemaVersion": 1, "traceEvents": b.events}).encode()
    out = io.BytesIO()
    copy_with_labels(io.BytesIO(b"  " + raw), out, LABELS.to_json())
    path = tmp_path / "labelled.json.gz"
    path.write_bytes(gzip.compress(out.getvalue()))
    r = load_trace(path)
    assert list(r.lines["source"]) == [s.source for s in LABELS.statements]
    # an array-form trace has no place for them: copied as it is
    arr = io.BytesIO()
    copy_with_labels(io.BytesIO(json.dumps(b.events).encode()), arr, LABELS.to_json())
    assert json.loads(arr.getvalue()) == b.events
    assert CodeLabels.from_json(b"{not json") is None


def test_with_stack_trace_fills_modules_from_its_nn_module_frames(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(64, 4))
    )
    x = torch.randn(16, 32)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
    path = tmp_path / "stack.json"
    prof.export_chrome_trace(str(path))
    r = load_trace(path)
    m = r.modules.set_index("module")
    assert list(m.index) == [
        "Sequential_0",
        "Sequential_0.Linear_0",
        "Sequential_0.ReLU_0",
        "Sequential_0.Sequential_1",
        "Sequential_0.Sequential_1.Linear_1",
    ]
    assert list(m["type"]) == ["Sequential", "Linear", "ReLU", "Sequential", "Linear"]
    assert (m["calls"] == 2).all()
    assert (m["forward_host_us"] > 0).all()
    for name in ("Sequential_0.Linear_0", "Sequential_0.Sequential_1.Linear_1"):
        assert m.loc[name, "backward_host_us"] > 0, name
    assert (
        m.loc["Sequential_0", "backward_host_us"]
        >= m.loc["Sequential_0.Linear_0", "backward_host_us"]
    )
    # python_function frames are not operators
    assert not [n for n in r.ops["name"] if n.startswith("nn.Module")]
    assert r.lines.empty and "no statement ranges" in r.lines_note
    assert "Type_N" in r.to_text()


@pytest.mark.parametrize("name", ALL_TRACES)
def test_traces_from_elsewhere_have_no_lines_and_say_why(name, load):
    r = load(name)
    assert r.lines.empty and list(r.lines.columns)[:3] == ["line", "source", "hits"]
    assert r.modules.empty  # none of the shared traces was recorded with_stack=True
    assert r.lines_note.startswith("No per-line times")
    assert r.lines_note in r.to_text()
    assert all(f.line is None for f in r.findings)


def test_argmax_per_group_picks_the_heaviest_item():
    from gpumagic.profile.analysis.lines import argmax_per_group

    group = np.array([0, 0, 0, 2, 2])
    item = np.array([5, 1, 5, 3, 4])
    weight = np.array([1.0, 1.5, 1.0, 0.0, 0.0])
    assert list(argmax_per_group(group, item, weight, 3)) == [5, -1, -1]


def test_a_real_trace_in_the_registry_is_unchanged_by_the_split(load):
    # the split runs on every decode: the shared traces' events are all still there
    r = load("v100_training_5steps.json.gz")
    assert r.summary.events > 40_000
    assert trace_path("v100_training_5steps.json.gz").exists()


def test_compare_pairs_lines_by_source_when_a_fix_moved_them(tmp_path):
    from gpumagic.profile.compare import compare

    def run(sources: list[str], name: str, slow: float) -> Path:
        b = TraceBuilder()
        t = 0.0
        for i, _src in enumerate(sources):
            dur = slow if sources[i] == "y = g()" else 100.0
            b.op(f"gpumagic.line#{i} L{i + 2}", t, dur)
            t += dur
        labels = CodeLabels([StatementLabel(i, i + 2, 0, s) for i, s in enumerate(sources)], [])
        return _write(b, tmp_path / name, labels)

    before = run(["x = f()", "y = g()"], "a.json", 1000.0)
    after = run(["z = 0", "x = f()", "y = g()"], "b.json", 400.0)
    c = compare(before, after)
    lines = c.lines.set_index("source")
    assert list(lines.index) == ["z = 0", "x = f()", "y = g()"]
    assert np.isnan(lines.loc["z = 0", "a_line"])
    assert (lines.loc["x = f()", "a_line"], lines.loc["x = f()", "b_line"]) == (2, 3)
    assert lines.loc["y = g()", "delta_host_us"] == -600.0
    text = c._text()
    assert "2 (new)" in text and "4 (was 3)" in text


def test_sync_optimizer_and_launch_bound_name_their_lines(tmp_path):
    b = TraceBuilder()
    b.op("gpumagic.line#0 L2", 0.0, 3000.0)
    t = 10.0
    for _ in range(6):  # a kernel, then the host waits for it: .item() each time
        b.op("aten::_local_scalar_dense", t, 400.0)
        b.launch("void reduce_kernel<512>", t + 10, t + 20, 100.0)
        b.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaStreamSynchronize",
                "pid": 1,
                "tid": 1,
                "ts": t + 30,
                "dur": 100.0,
                "args": {"correlation": 10_000 + int(t)},
            }
        )
        t += 450.0
    b.op("gpumagic.line#1 L3", 3000.0, 5000.0)
    b.op("Optimizer.step#SGD.step", 3100.0, 4000.0, cat="user_annotation")
    t = 3110.0
    for _ in range(40):  # one op and one tiny kernel per parameter
        b.op("aten::add_", t, 80.0)
        b.launch("void at::native::vectorized_elementwise_kernel<4>", t + 20, t + 40, 3.0)
        t += 95.0
    labels = CodeLabels(
        [
            StatementLabel(0, 2, 0, "value = loss.item()"),
            StatementLabel(1, 3, 0, "optimizer.step()"),
        ],
        [],
    )
    r = load_trace(_write(b, tmp_path / "sync_opt.json", labels))
    found = {f.rule: f for f in r.findings}
    assert (found["sync"].line, found["sync"].source) == (2, "value = loss.item()")
    assert (found["optimizer"].line, found["optimizer"].source) == (3, "optimizer.step()")
    assert found["launch_bound"].line == 3  # the line that launched the short kernels
    assert all(f.module == "" for f in r.findings)  # no module spans in this trace


def test_communication_finding_names_the_line_that_launched_the_collectives(tmp_path):
    # DDP's bucketed all-reduce: NCCL kernels launched from autograd's thread while
    # loss.backward() runs; nothing computes beside them, so communication is exposed
    b = TraceBuilder()
    b.op("gpumagic.line#0 L2", 0.0, 1000.0)
    b.op("gpumagic.line#1 L3", 1000.0, 1000.0)
    b.op("gpumagic.line#2 L4", 2000.0, 3000.0)
    b.launch("volta_sgemm_128x64_nn", 100.0, gpu_ts=200.0, gpu_dur=600.0)
    b.launch("Memcpy HtoD (Pageable -> Device)", 1150.0, 1200.0, 80.0, cat="gpu_memcpy")
    b.launch("volta_sgemm_64x64_nt", 2100.0, gpu_ts=2200.0, gpu_dur=300.0, tid=2)
    b.launch(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        2600.0, gpu_ts=2700.0, gpu_dur=1800.0, tid=2,
    )
    p = load_trace(_write(b, tmp_path / "ddp.json"))
    assert p.breakdown.loc["Communication", "percent"] > 10
    f = {f.rule: f for f in p.findings}["communication"]
    assert (f.line, f.source) == (4, "loss.backward()")
    lines = p.lines.set_index("line")
    assert lines.loc[4, "device_us"] == pytest.approx(300.0 + 1800.0)
