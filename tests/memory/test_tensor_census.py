"""%%memtrace counts tensors, not pages (issue 16): exact bytes on the CPU, by category, over
the cell and at its peak, on real cells through IPython on real torch."""

from __future__ import annotations

import gc
import pickle

import pytest
from svg_images import svg_images

torch = pytest.importorskip("torch")

from gpumagic.memory.census.categories import COLUMNS, NAMES  # noqa: E402

MiB = 2**20


@pytest.fixture(autouse=True)
def _torch_in_namespace(ip):
    ip.user_ns["torch"] = torch
    ip.user_ns["nn"] = torch.nn


def rows(trace):
    return trace.lines.set_index("line")


def test_torch_empty_is_exactly_what_the_cpu_allocator_hands_out(ip, run):
    # What torch's CPU allocator reports for the same call, through the profiler's memory
    # reporting (the allocator tells the profiler of each allocation's size).
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.empty(1000, 1000)
    reported = [e.cpu_memory_usage for e in prof.events() if e.name == "aten::empty"]
    assert reported == [4_000_000]
    r = run("%%memtrace -q\ne = torch.empty(1000, 1000)\ndel e\n")
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert t.device.label == "cpu" and t.device.measure == "tensors"
    lines = rows(t)
    assert lines.loc[2, "delta_bytes"] == reported[0]
    assert lines.loc[2, "peak_bytes"] == reported[0]
    assert lines.loc[3, "delta_bytes"] == -reported[0]
    assert lines.loc[2, "inputs_bytes"] - lines.loc[3, "inputs_bytes"] == reported[0]


def test_a_tensor_freed_inside_a_statement_shows_in_its_peak_not_its_delta(ip, run):
    r = run("%%memtrace -q\nb = torch.ones(1000).mul(2).sum()\n")
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    line = rows(t).loc[2]
    # ones (4000 B) and its product (4000 B) alive together; the sum (4 B) is what stays
    assert line.peak_bytes == 8000
    assert line.delta_bytes == 4 and line.inputs_bytes >= 4
    assert line.temporaries_bytes == 0  # after the statement: nothing temporary is left
    peak = t.at_peak
    assert peak.line == 2 and peak.categories["temporaries"] == 8000


def _mlp_cell(batch: int, width: int, hidden: int) -> str:
    return (
        "%%memtrace -q\n"
        f"x = torch.randn({batch}, {width})\n"
        f"model = nn.Sequential(nn.Linear({width}, {hidden}), nn.ReLU(), nn.Linear({hidden}, {hidden}),"
        f" nn.ReLU(), nn.Linear({hidden}, 1))\n"
        "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "loss = model(x).sum()\n"
        "loss.backward()\n"
        "optimizer.step()\n"
        "optimizer.zero_grad(set_to_none=True)\n"
    )


def test_mlp_categories_parameters_activations_gradients_optimizer_state(ip, run):
    batch, width, hidden = 64, 128, 256
    r = run(_mlp_cell(batch, width, hidden))
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    lines = rows(t)
    model = ip.user_ns["model"]
    params = sum(p.nbytes for p in model.parameters())
    n_params = len(list(model.parameters()))
    # parameters from the constructor's row on
    assert lines.loc[3, "params_bytes"] == params
    # Adam's constructor makes no state; its first step makes exp_avg and exp_avg_sq (twice
    # the parameters) and a float32 step counter per parameter
    assert lines.loc[4, "optimizer_bytes"] == 0 and lines.loc[4, "delta_bytes"] == 0
    assert lines.loc[7, "optimizer_bytes"] == 2 * params + 4 * n_params
    # The forward pass keeps each ReLU's output for backward (the next Linear reads the same
    # tensor): two (batch, hidden) float32 tensors. The Linear outputs die at the ReLUs.
    activations = 2 * batch * hidden * 4
    assert lines.loc[5, "activations_bytes"] == activations
    assert lines.loc[6, "activations_bytes"] == 0  # backward() let them go
    assert lines.loc[6, "delta_bytes"] == params - activations  # ... and made the gradients
    assert lines.loc[6, "grads_bytes"] == params
    assert lines.loc[8, "grads_bytes"] == 0  # zero_grad(set_to_none=True)
    # the inputs: x, and the scalar loss from its row on
    assert lines.loc[2, "inputs_bytes"] == batch * width * 4
    assert lines.loc[5, "inputs_bytes"] == batch * width * 4 + 4
    # activations by module: the two ReLUs, named as the namespace names them
    forward_peak = t.peak_categories[[s.line for s in t.statements].index(5)]
    assert forward_peak is not None and forward_peak[NAMES.index("activations")] == activations


def test_categories_add_up_to_allocated_on_every_row(ip, run):
    r = run(_mlp_cell(16, 32, 64) + "for _ in range(3):\n    out = model(x)\n    del out\n")
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    lines = t.lines
    assert list(COLUMNS) == [c for c in lines.columns if c in COLUMNS]
    assert (lines[list(COLUMNS)].sum(axis=1) == lines["allocated_bytes"]).all()
    timeline = t.timeline
    totals = timeline[timeline.point == "after"].groupby("step")["bytes"].sum()
    allocated = {k: p[1] for k, p in enumerate(t.points)}
    assert all(totals[k] == allocated[k] for k in totals.index)


def test_looped_lines_read_per_hit_and_highest_hit(ip, run):
    r = run(
        "%%memtrace -q\n"
        "keep = []\n"
        "for i in range(3):\n"
        "    keep.append(torch.ones(1000))\n"  # +4000 B per hit
        "    tmp = torch.ones(100_000).sum()\n"  # a 400 KB temporary per hit
    )
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    line = rows(t).loc[4]
    assert line.hits == 3 and line.delta_bytes == 12_000  # summed over the hits
    assert line.delta_per_hit_bytes == 4000
    # the highest hit (the ones and their sum alive together), not a sum over hits
    assert rows(t).loc[5, "peak_bytes"] == 400_004
    assert rows(t).loc[5, "delta_bytes"] == 4  # the first hit's tmp; later ones replace it
    text = t._text()
    assert "Δ per hit" in text and "peak (highest hit)" in text


def test_at_peak_names_the_activations_by_module(ip, run):
    r = run(
        "%%memtrace -q\n"
        "net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 1))\n"
        "x = torch.randn(256, 64)\n"
        "loss = net(x).sum()\n"
    )
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    peak = t.at_peak
    assert peak is not None and peak.total == t.cell_peak and peak.line == 4
    assert sum(peak.categories.values()) == peak.total
    # ReLU keeps its output for backward; Tanh its output too: one (256, 512) tensor each
    assert peak.modules.get("net.1", 0) == 256 * 512 * 4
    assert peak.modules.get("net.3", 0) == 256 * 512 * 4
    assert peak.blocks(depth=1) == {"net": sum(peak.modules.values())}
    html = ip.user_ns["_memtrace"]._html()
    assert "Activations by module: net.1" in html or "Activations by module: net.3" in html
    assert 'class="gm-memchart"' in html  # an image: shared notebooks drop inline <svg>
    charts = [i.svg for i in svg_images(html) if i.attrs.get("class") == "gm-memchart"]
    assert len(charts) == 1
    chart = charts[0]
    assert chart.count("<line ") == 3  # a rule at each statement's start
    assert "<title>activations</title>" in chart and "peak " in chart


def test_timeline_is_long_form_by_category(ip, run):
    run("%%memtrace -q\na = torch.ones(1000)\nb = torch.ones(2000).sum()\ndel a\n")
    tl = ip.user_ns["_memtrace"].timeline
    assert list(tl.columns) == ["time_s", "step", "line", "source", "point", "category", "bytes"]
    assert set(tl.category) == set(NAMES)
    after = tl[tl.point == "after"].pivot(index="line", columns="category", values="bytes")
    assert after.loc[2, "inputs"] == 4000 and after.loc[4, "inputs"] == 4
    peaks = tl[tl.point == "peak"]
    assert set(peaks.line) == {3}  # only line 3 rose above where it began and ended
    assert peaks[peaks.category == "temporaries"].bytes.iloc[0] == 8000


def test_tensors_from_before_the_cell_are_freed_in_it(ip, run):
    # an evaluation left without no_grad: preds holds the graph, and the graph its activations
    run(
        "net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))\n"
        "preds = net(torch.randn(128, 32))\n"
    )
    r = run("%%memtrace -q\ndel preds\ngc.collect()\n".replace("gc.collect()", "import gc; gc.collect()"))
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    # preds (128 x 10), and what its graph keeps for backward: the first Linear's input
    # (128 x 32) and the ReLU's output (128 x 256), found through preds.grad_fn and freed
    # with it
    held = 128 * 10 * 4 + 128 * 32 * 4 + 128 * 256 * 4
    assert t.initial >= held
    assert rows(t).loc[2, "delta_bytes"] == -held


def test_cell_behaves_as_without_the_magic(ip, run):
    """Exceptions, dtype promotion, autograd's in-place check, torch.func and a cell's own
    dispatch mode are unchanged under the census."""
    cell = (
        "a = torch.randn(3, requires_grad=True)\n"
        "y = a.exp(); y.add_(1)\n"
        "try:\n"
        "    y.sum().backward()\n"
        "    inplace = 'no error'\n"
        "except RuntimeError as e:\n"
        "    inplace = str(e)[:60]\n"
        "promoted = [(torch.ones(2, dtype=torch.int64) + 1.5).dtype, (torch.ones(2, dtype=torch.float16) * torch.ones(2)).dtype]\n"
        "grad = torch.func.grad(lambda v: v.sin().sum())(torch.ones(3))\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "class Count(TorchDispatchMode):\n"
        "    n = 0\n"
        "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
        "        Count.n += 1\n"
        "        return func(*args, **(kwargs or {}))\n"
        "with Count():\n"
        "    torch.ones(4).mul(2)\n"
        "counted = Count.n\n"
    )
    plain = run(cell)
    assert plain.result.success
    expected = {k: ip.user_ns[k] for k in ("inplace", "promoted", "counted")}
    expected_grad = ip.user_ns["grad"].clone()
    traced = run("%%memtrace -q\n" + cell)
    assert traced.result.success, traced.result.error_in_exec
    assert "variables needed for gradient computation" in expected["inplace"]
    for k, v in expected.items():
        assert ip.user_ns[k] == v, k
    assert torch.equal(ip.user_ns["grad"], expected_grad)


def test_an_op_error_propagates_unchanged_with_the_cells_traceback(ip, run):
    plain = run("a, b = torch.ones(3, 4), torch.ones(5, 6)\nc = a @ b\n")
    traced = run("%%memtrace\na, b = torch.ones(3, 4), torch.ones(5, 6)\nc = a @ b\n")
    for r in (plain, traced):
        assert isinstance(r.result.error_in_exec, RuntimeError)
        assert "cannot be multiplied (3x4 and 5x6)" in str(r.result.error_in_exec)
    shown = traced.plain_stdout
    assert "c = a @ b" in shown
    assert "__torch_dispatch__" not in shown and "gpumagic/memory" not in shown
    assert "torch/_ops.py" not in shown


def test_torch_compile_still_compiles_and_the_note_says_so(ip, run):
    pytest.importorskip("torch._dynamo")
    r = run(
        "f = torch.compile(lambda v: (v.sin() * 2).cos(), backend='eager')\n"
        "v = torch.randn(100)\n"
        "ref = f(v)\n"
        "from torch._dynamo.utils import counters\n"
        "frames_before = counters['frames']['total']\n"
    )
    assert r.result.success, r.result.error_in_exec
    from torch._dynamo.utils import counters

    try:
        r = run("%%memtrace -q\nout = f(v)\n")
        frames = counters["frames"]["total"]
    finally:
        # compiled code must not outlive the test: %%gpuprofile keeps its module hooks off
        # while any is in use (tests/profile/test_magic_lines_modules.py)
        torch._dynamo.reset()
        counters.clear()
    assert r.result.success, r.result.error_in_exec
    assert frames == ip.user_ns["frames_before"]  # no recompile, no fallback
    assert torch.equal(ip.user_ns["out"], ip.user_ns["ref"])
    assert any("torch.compile" in n for n in ip.user_ns["_memtrace"].notes)


def test_a_namespace_object_whose_class_raises_breaks_nothing(ip, run):
    ip.run_cell(
        "class Lazy:\n"
        "    @property\n"
        "    def __class__(self):\n"
        "        raise RuntimeError('settings not configured')\n"
        "lazy = Lazy()\n"
    )
    r = run("%%memtrace -q\nx = torch.ones(100)\ny = x * 2\n")
    assert r.result.success, r.result.error_in_exec
    assert rows(ip.user_ns["_memtrace"]).loc[3, "delta_bytes"] == 400


def test_no_tensors_option_traces_the_rss_as_before(ip, run):
    r = run("%%memtrace -q --no-tensors\nx = torch.ones(2**24)\n")
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    assert t.device.pages and t.device.label == "host RSS" and not t.has_categories
    assert t.at_peak is None and t.timeline.empty
    with pytest.raises(ValueError, match="without the tensor census"):
        t.export_memory_viz("x.pickle")


def test_no_tensors_walks_no_model_either(ip, run):
    """``--no-tensors`` is what its help says: the allocator's counters or the host's RSS
    alone. No categories, and no walk over the namespace's models for an owners' split
    (params, grads, optimizer, other) in their place: nothing of the user's model is called."""
    r = run(
        "%%memtrace -q --no-tensors\n"
        "calls = []\n"
        "class Spy(torch.nn.Linear):\n"
        "    def parameters(self, recurse=True):\n"
        "        calls.append('parameters')\n"
        "        return super().parameters(recurse)\n"
        "net = Spy(64, 64)\n"
        "calls.clear()\n"
        "opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"
        "net(torch.ones(2, 64)).sum().backward()\n"
    )
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert ip.user_ns["calls"] == []
    owners = {"params_bytes", "grads_bytes", "optimizer_bytes", "other_bytes"}
    assert not owners & set(t.lines.columns) and not t.has_categories
    text = t._repr_mimebundle_()["text/plain"]
    assert "by owner" not in text and "params" not in text


def test_export_for_pytorchs_memory_visualiser(ip, run, tmp_path):
    from torch.cuda import _memory_viz

    run("keep = torch.ones(256)\n")
    r = run(_mlp_cell(8, 16, 32))
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    path = t.export_memory_viz(tmp_path / "cell.pickle")
    snapshot = pickle.loads(path.read_bytes())
    trace = snapshot["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert {e["category"] for e in allocs} >= {"parameters", "activations", "gradients", "optimizer state"}
    assert sum(e["size"] for e in allocs) - sum(
        e["size"] for e in trace if e["action"] == "free_completed" and e["addr"] in {a["addr"] for a in allocs}
    ) == t.final - t.initial
    # torch's own readers of the format accept it
    assert "TOTAL MEM" in _memory_viz.trace(snapshot)
    assert "total_allocated" in _memory_viz.segsum(snapshot)
    assert any(b["size"] == 256 * 4 for s in snapshot["segments"] for b in s["blocks"])  # keep
    html = t.export_memory_viz(tmp_path / "cell.html")
    assert "MemoryViz.js" in html.read_text()


def test_out_of_memory_report_names_the_activations(ip, run):
    r = run(
        "%%memtrace -q\n"
        "net = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU())\n"
        "def step():\n"
        "    h = net(torch.randn(512, 64))\n"
        "    return torch.empty(2**45, dtype=torch.uint8) + h.sum()\n"
        "step()\n"
    )
    assert isinstance(r.result.error_in_exec, RuntimeError)
    t = ip.user_ns["_memtrace"]
    oom = t.oom
    assert oom is not None and oom.categories is not None
    activations = oom.categories[NAMES.index("activations")]
    # kept for backward: the two ReLU outputs (h is the second), and the first Linear's input
    assert activations == 2 * 512 * 1024 * 4 + 512 * 64 * 4
    assert dict(oom.activations) == {
        "net.1": 512 * 1024 * 4,
        "net.3": 512 * 1024 * 4,
        "outside any module": 512 * 64 * 4,
    }
    # the release of the failed call's frames is measured in tensors: every activation and h
    assert oom.released == activations
    gc.collect()
    assert "Tensors at the failure" in t._text()


def test_demo_shows_optimizer_state_at_the_first_step_not_the_constructor(tmp_path):
    from IPython.core.interactiveshell import InteractiveShell

    from gpumagic.__main__ import demo

    assert demo(tmp_path) == 0
    t = InteractiveShell.instance().user_ns["_memtrace"]
    lines = rows(t)
    adam = next(ln for ln, src in zip(t.lines.line, t.lines.source) if "Adam(" in src)
    step = next(ln for ln, src in zip(t.lines.line, t.lines.source) if src.startswith("optimizer.step"))
    assert lines.loc[adam, "optimizer_bytes"] == 0 and lines.loc[adam, "delta_bytes"] == 0
    assert lines.loc[step, "optimizer_bytes"] >= 2 * lines.loc[step, "params_bytes"]
    # the highest peak is the forward or the backward line
    top = t.lines.sort_values("peak_bytes").iloc[-1]
    assert "backward" in top.source or "model(x)" in top.source


def test_out_of_memory_inside_a_module_releases_its_activations(ip, run):
    """The census learns which module made a tensor from the stack, not from global module
    hooks: with any global hook, Module.__call__ keeps its arguments in a closure that the
    error's traceback holds, and the failed forward's activations would stay allocated."""
    run(
        "import weakref\n"
        "refs = []\n"
        "class Boom(nn.Module):\n"
        "    def forward(self, x):\n"
        "        refs.append(weakref.ref(x))\n"
        "        return torch.empty(2**45, dtype=torch.uint8)\n"
        "model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), Boom())\n"
    )
    r = run("%%memtrace -q\nlogits = model(torch.randn(64, 256))\n")
    assert isinstance(r.result.error_in_exec, RuntimeError)
    gc.collect()
    assert ip.user_ns["refs"][0]() is None, "the GELU's output outlived the failed call"
    t = ip.user_ns["_memtrace"]
    # the input, the Linear's output (kept by GELU) and the GELU's output (Boom's x)
    assert t.oom.released == 64 * 256 * 4 + 2 * 64 * 1024 * 4
    assert t.net_change == 0
    assert dict(t.oom.activations)["model.0"] == 64 * 1024 * 4


def test_the_census_runs_unchanged_on_fake_tensors():
    """The engine a dry run (%%memfit) builds on: the same step on FakeTensorMode's tensors
    gives the same bytes, peaks and categories as on real ones, allocating nothing."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from gpumagic.memory.census.tracker import TensorTracker, on_cpu

    def step(census):
        torch.manual_seed(0)
        ns = {"model": torch.nn.Sequential(
            torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )}  # fmt: skip
        ns["opt"] = torch.optim.Adam(ns["model"].parameters())
        census.namespace = ns
        census.settle(0)
        ns["x"] = torch.randn(64, 128)
        ns["loss"] = ns["model"](ns["x"]).sum()
        settled = [census.settle(1)]
        ns["loss"].backward()
        settled.append(census.settle(2))
        ns["opt"].step()
        settled.append(census.settle(3))
        return settled

    real = TensorTracker({}, on_cpu)
    real.start()
    try:
        expected = step(real)
    finally:
        real.close()
    with FakeTensorMode():
        fake = TensorTracker({}, on_cpu, tensor_type=FakeTensor)
        fake.start()
        try:
            got = step(fake)
        finally:
            fake.close()
    assert [s.peak for s in got] == [s.peak for s in expected]
    assert [s.after for s in got] == [s.after for s in expected]
    assert [s.at_peak for s in got] == [s.at_peak for s in expected]
    # the ReLU's output kept for backward; x and loss are named
    assert expected[0].after[NAMES.index("activations")] == 64 * 256 * 4
    assert expected[0].after[NAMES.index("inputs")] == 64 * 128 * 4 + 4
    assert expected[2].after[NAMES.index("optimizer state")] > 0
