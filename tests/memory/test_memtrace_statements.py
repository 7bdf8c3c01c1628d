"""%%memtrace on real torch on the CPU: deltas, peaks, loops, the host OOM path."""

from __future__ import annotations

import ctypes
import gc

import pytest
from svg_images import inline_svg

MiB = 2**20

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", autouse=True)
def _torch_code_paged_in():
    """Run the large-tensor kernels these tests measure once, untraced.

    RSS counts the pages of the process's mapped files too: the first large ``zeros``,
    ``ones``, ``mul`` or ``sum`` in a process pages in about 7 MiB of libtorch_cpu's code
    (``RssFile`` in /proc/self/status; its ``RssAnon`` grows by the tensor's 64 MiB). Which
    test was the first to run them used to decide which one saw +71 MiB for a 64 MiB tensor
    (the "flaky" 74.5 MB); the tests measure tensors, so the code is paged in before them.
    """
    x = torch.zeros(2**24)
    y = (x * 2).sum()
    z = torch.ones(2**24) + 1
    del x, y, z


@pytest.fixture(autouse=True)
def _torch_in_namespace(ip):
    ip.user_ns["torch"] = torch


class _MallInfo2(ctypes.Structure):
    _fields_ = [  # glibc's struct mallinfo2 (2.33+), all size_t
        (name, ctypes.c_size_t)
        for name in [
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        ]
    ]


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.mallinfo2.restype = _MallInfo2
        return libc
    except (OSError, AttributeError):  # not glibc (or older than 2.33): nothing to plug
        return None


_PLUG = 4 * MiB


@pytest.fixture(autouse=True)
def _large_tensors_get_fresh_pages():
    """Large tensors get pages of their own, whatever ran before: the RSS these tests read
    then moves by each tensor's size.

    glibc serves a large block from a free run of its heap when one fits (its bins are
    searched before it maps anything), and a free run's pages stay resident: after other
    tests, the main heap held 695 MiB free in 1.4 GiB, and a 64 MiB tensor read +0 B, or its
    freed temporary and ``del a`` -0 B, depending on which tests ran before. Every free run
    of 4 MiB or more is taken here, untouched (so it costs no RSS), until the test ends;
    ``malloc_trim`` hands back the pages of what free space is left.
    """
    libc = _glibc()
    plugs = []
    if libc is not None:
        free = libc.mallinfo2().fordblks
        while free >= _PLUG and len(plugs) < 100_000:
            p = libc.malloc(_PLUG)
            now = libc.mallinfo2().fordblks
            mapped = p and ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value & 2
            if not p or mapped or now >= free:  # mapped anew, or the heap grew: no run left
                if p:
                    libc.free(p)
                break
            plugs.append(p)
            free = now
        libc.malloc_trim(0)
    yield
    for p in plugs:
        libc.free(p)


def row(trace, line):
    rows = trace.lines[trace.lines["line"] == line]
    assert len(rows) == 1, trace.lines
    return rows.iloc[0]


@pytest.mark.parametrize("census", [True, False], ids=["tensors", "rss"])
def test_known_allocation_delta_peak_and_release(ip, run, census):
    r = run(
        f"%%memtrace -q {'' if census else '--no-tensors'}\n"
        "import torch\n"
        "a = torch.zeros(16 * 2**20, dtype=torch.float32)\n"  # 64 MiB, pages touched
        "b = (a * 2).sum()\n"  # a 64 MiB temporary, freed before the line ends
        "del a\n"
    )
    assert r.result.success, r.stdout
    t = ip.user_ns["_memtrace"]
    assert t.device.kind == "host"
    alloc = row(t, 3)
    assert 62 * MiB <= alloc.delta_bytes <= 70 * MiB
    temp = row(t, 4)
    assert temp.peak_bytes >= 60 * MiB, "the temporary must show in the peak"
    assert abs(temp.delta_bytes) < 8 * MiB, "but not in the delta"
    release = row(t, 5)
    assert -70 * MiB <= release.delta_bytes <= -60 * MiB
    if census:
        # the device columns are the CPU's tensors, exactly; the host columns its RSS pages
        assert t.device.label == "cpu" and not t.device.pages
        assert alloc.delta_bytes == 64 * MiB and release.delta_bytes == -64 * MiB
        assert temp.peak_bytes == 64 * MiB + 4  # the temporary, and the scalar sum
        assert 62 * MiB <= alloc.host_delta_bytes <= 70 * MiB
    else:
        # host columns equal the device columns when the device is the host's RSS
        assert t.device.pages
        assert alloc.host_delta_bytes == alloc.delta_bytes
    assert set(t.lines.columns) >= {
        "line", "source", "hits", "delta_bytes", "peak_bytes", "allocated_bytes",
        "reserved_bytes", "host_delta_bytes", "host_peak_bytes",
    }


def test_loop_rows_have_hit_counts(ip, run):
    r = run(
        "%%memtrace -q\n"
        "total = 0\n"
        "for i in range(5):\n"
        "    total += i\n"
        "    if i % 2:\n"
        "        total -= 1\n"
        "    elif i == 4:\n"
        "        total += 100\n"
        "n = 0\n"
        "while n < 3:\n"
        "    n += 1\n"
        "with open(__import__('os').devnull) as f:\n"
        "    f.read()\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    caught = True\n"
        "finally:\n"
        "    done = True\n"
    )
    assert r.result.success, r.stdout
    assert ip.user_ns["total"] == 0 + 1 + 2 + 3 + 4 - 2 + 100
    t = ip.user_ns["_memtrace"]
    hits = dict(zip(t.lines["line"], t.lines["hits"]))
    assert hits[3] == 6  # for header: 5 iterations + the final next()
    assert hits[4] == 5
    assert hits[5] == 5  # if test
    assert hits[6] == 2  # odd i
    assert hits[7] == 3  # elif test, even i
    assert hits[8] == 1
    assert hits[10] == 4  # while test: 3 true + 1 false
    assert hits[11] == 3
    assert hits[12] == 1 and hits[13] == 1  # with header and its body
    assert hits[15] == 1 and hits[17] == 1 and hits[19] == 1  # try body, except body, finally body
    depth = dict(zip(t.lines["line"], t.lines["depth"]))
    assert depth[3] == 0 and depth[4] == 1 and depth[6] == 2 and depth[7] == 1
    src = dict(zip(t.lines["line"], t.lines["source"]))
    assert src[3] == "for i in range(5):"
    assert src[7] == "elif i == 4:"


def test_statements_on_one_line_and_multiline_statement(ip, run):
    r = run("%%memtrace -q\na = 1; b = 2\nc = [\n    a,\n    b,\n]\n")
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    assert list(t.lines["line"]) == [2, 2, 3]
    assert t.lines.iloc[2]["source"].startswith("c = [")


def test_result_storage_and_quiet(ip, run):
    r = run("%%memtrace -q\nx = 1\n")
    assert r.outputs == []  # --quiet displays nothing
    first = ip.user_ns["_memtrace"]
    r = run("%%memtrace\ny = 2\n")
    assert ip.user_ns["_memtrace"] is not first
    (bundle,) = r.bundles
    assert "text/plain" in bundle and "text/html" in bundle
    assert 'class="gpumagic gpumagic-memtrace"' in bundle["text/html"]
    assert "y = 2" in bundle["text/plain"]


def test_line_magic_traces_one_statement(ip, run):
    r = run("%memtrace -q big = torch.ones(2**24)")
    assert r.result.success, r.stdout
    t = ip.user_ns["_memtrace"]
    assert list(t.lines["line"]) == [1]
    assert 63 * MiB <= t.lines.iloc[0]["delta_bytes"] <= 66 * MiB
    assert ip.user_ns["big"].numel() == 2**24
    r = run("%memtrace 6 * 7")
    assert r.result.result == 42


def test_html_escapes_source_and_highlights_heaviest(ip, run):
    # 64 MiB in pages of its own (see _large_tensors_get_fresh_pages): the RSS shows it
    r = run("%%memtrace\ns = '<b>not bold</b>'\nbuf = torch.ones(2**24)\n")
    html = r.html()
    assert "<b>not bold</b>" not in html
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html
    assert 'class="gm-hot"' in html  # the 64 MiB line


def test_breakdown_params_grads_optimizer(ip, run):
    r = run(
        "%%memtrace -q\n"
        "from torch import nn\n"
        "model = nn.Linear(1024, 1024)\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "loss = model(torch.randn(8, 1024)).sum()\n"
        "loss.backward()\n"
        "opt.step()\n"
    )
    assert r.result.success, r.stdout
    t = ip.user_ns["_memtrace"]
    param_bytes = sum(p.numel() * p.element_size() for p in ip.user_ns["model"].parameters())
    lines = t.lines.set_index("line")
    assert lines.loc[3, "params_bytes"] == param_bytes
    assert lines.loc[3, "grads_bytes"] == 0
    assert lines.loc[6, "grads_bytes"] == param_bytes
    assert lines.loc[6, "optimizer_bytes"] == 0
    # Adam keeps exp_avg and exp_avg_sq per parameter (plus a scalar step each)
    assert 2 * param_bytes <= lines.loc[7, "optimizer_bytes"] <= 2 * param_bytes + 64


def test_host_out_of_memory_for_real(ip, run):
    r = run(
        "%%memtrace\n"
        "from torch import nn\n"
        "net = nn.Linear(256, 256)\n"
        "net(torch.randn(4, 256)).sum().backward()\n"
        "keep = torch.ones(2**21)\n"
        "huge = torch.empty(2**45, dtype=torch.uint8)\n"
        "after = 1\n"
    )
    err = r.result.error_in_exec
    assert isinstance(err, RuntimeError) and "can't allocate memory" in str(err)
    assert "after" not in ip.user_ns
    assert r.plain_stdout.count("DefaultCPUAllocator: can't allocate memory") == 1  # raised once
    t = ip.user_ns["_memtrace"]
    failed = t.lines[t.lines["failed"]]
    assert list(failed["line"]) == [6]
    oom = t.oom
    assert oom is not None and oom.requested == 2**45
    assert oom.free is not None and oom.free > 0
    names = {h.name: h.role for h in oom.holders}
    assert names["keep"] == "tensor"
    assert names["net.weight"] == "parameter"
    assert names["net.weight.grad"] == "gradient"
    html = r.html()
    assert "32.0 TiB" in html and "net.weight.grad" in html and "gm-error" in html
    assert any("batch size" in a for a in oom.advice)
    # the kernel keeps working
    r = run("%%memtrace -q\nok = torch.ones(4).sum().item()\n")
    assert r.result.success and ip.user_ns["ok"] == 4.0


def test_oom_frames_are_reported_then_released(ip, run):
    r = run(
        "%%memtrace -q\n"
        "import weakref\n"
        "refs = []\n"
        "def step():\n"
        "    activations = torch.ones(2**24)\n"  # 64 MiB held by the failing call's frame
        "    refs.append(weakref.ref(activations))\n"
        "    return torch.empty(2**45, dtype=torch.uint8)\n"
        "step()\n"
    )
    assert isinstance(r.result.error_in_exec, RuntimeError)
    gc.collect()
    assert ip.user_ns["refs"][0]() is None, "the failed frame still holds its tensors"
    t = ip.user_ns["_memtrace"]
    held = {h.name: h for h in t.oom.holders}
    assert held["step(): activations"].role == "in the failing call"
    assert held["step(): activations"].nbytes == 64 * MiB
    # the release is measured, and the cell's net change is read after it
    assert t.oom.released is not None and t.oom.released >= 60 * MiB
    assert t.net_change < 8 * MiB
    assert any("failing call itself held" in a for a in t.oom.advice)


def test_a_report_that_runs_out_of_memory_itself_still_releases_and_raises_once(ip, run, monkeypatch):
    from gpumagic.memory.trace.oom import postmortem

    def exhausted(*args, **kwargs):
        raise MemoryError("no room left to build the report")

    monkeypatch.setattr(postmortem, "named_tensors", exhausted)
    r = run(
        "%%memtrace\n"
        "import weakref\n"
        "refs = []\n"
        "def step():\n"
        "    activations = torch.ones(2**20)\n"
        "    refs.append(weakref.ref(activations))\n"
        "    return torch.empty(2**45, dtype=torch.uint8)\n"
        "step()\n"
    )
    err = r.result.error_in_exec
    assert isinstance(err, RuntimeError) and "can't allocate memory" in str(err)  # the cell's own error
    assert r.plain_stdout.count("can't allocate memory") == 1
    gc.collect()
    assert ip.user_ns["refs"][0]() is None
    t = ip.user_ns["_memtrace"]
    assert t.oom is not None and t.oom.holders == [] and t.oom.requested == 2**45


def test_other_errors_keep_frames_for_debugging(ip, run):
    r = run(
        "%%memtrace -q\n"
        "import weakref\n"
        "refs = []\n"
        "def step():\n"
        "    activations = torch.ones(16)\n"
        "    refs.append(weakref.ref(activations))\n"
        "    raise ValueError('not an oom')\n"
        "step()\n"
    )
    assert isinstance(r.result.error_in_exec, ValueError)
    assert ip.user_ns["refs"][0]() is not None  # %debug can still see the locals


def test_memory_error_gets_a_report(ip, run):
    r = run("%%memtrace -q\nx = 1\nraise MemoryError()\n")
    assert isinstance(r.result.error_in_exec, MemoryError)
    t = ip.user_ns["_memtrace"]
    assert t.oom is not None and t.oom.requested is None
    assert t.error_index >= 0 and t.lines.iloc[-1]["failed"]


def test_failing_cell_shows_partial_table(ip, run):
    r = run("%%memtrace\na = torch.ones(2**20)\nb = 1 / 0\nc = 3\n")
    assert isinstance(r.result.error_in_exec, ZeroDivisionError)
    (bundle,) = r.bundles  # the report, shown before the traceback
    assert "failed at line 3" in bundle["text/html"]
    t = ip.user_ns["_memtrace"]
    assert list(t.lines["line"]) == [2, 3]


def test_plot_draws_memory_over_statements(ip, run):
    import matplotlib

    matplotlib.use("Agg")
    # 64 MiB in pages of its own (see _large_tensors_get_fresh_pages): RSS follows it exactly
    run("%%memtrace -q\nx = torch.ones(2**24)\ndel x\n")
    ax = ip.user_ns["_memtrace"].plot()
    assert len(ax.lines) >= 2
    ys = ax.lines[0].get_ydata()
    assert max(ys) - min(ys) >= 60  # MiB


def test_many_iterations_keep_the_timeline_bounded(ip, run):
    r = run("%%memtrace -q\nfor i in range(20000):\n    x = i * 2\n")
    assert r.result.success
    t = ip.user_ns["_memtrace"]
    assert dict(zip(t.lines["line"], t.lines["hits"]))[3] == 20000
    assert len(t.points) <= 4097  # the tracer's points (MemTrace.timeline is their DataFrame)
    assert len(t.timeline) <= 2 * 7 * len(t.points)


def test_live_view_html_from_probe_data(ip):
    from gpumagic.cell import ShellCompiler, prepare
    from gpumagic.memory.trace.run import MemtraceRun
    from gpumagic.render.memtrace import memtrace_live_html

    prepared = prepare(ShellCompiler(ip), "x = torch.ones(2**24)\ny = 1\n", "%%memtrace", instrument=True)
    run = MemtraceRun(prepared.statements, ip.user_ns)
    try:
        probe = run.start()
        probe.enter(0)
        ip.user_ns["x_live"] = torch.ones(2**24)
        probe.enter(1)  # statement 1 (line 3) is running now
        html = memtrace_live_html(run.status())
        run.stop()
        run.finish(None)
    finally:
        run.close()
    assert 'class="gpumagic gpumagic-memtrace-live"' in html
    assert "running line 3 (hit 1)" in html
    assert "<svg" in inline_svg(html) and "<polyline" in inline_svg(html)


def test_sampled_peak_fallback_sees_a_transient_allocation():
    import time

    from gpumagic.memory.trace.readers import HostMemory

    exact, sampled = HostMemory(), HostMemory(force_sampled=True)
    try:
        assert exact.method == "clear_refs" and sampled.method == "sampled"
        assert "sampled" in sampled.why
        start = sampled.read().current
        exact.reset_peak()
        sampled.reset_peak()
        tmp = torch.ones(2**24)  # 64 MiB, held long enough for the 1 ms sampler
        time.sleep(0.05)
        del tmp
        time.sleep(0.01)
        for reader in (exact, sampled):
            reading = reader.read()
            assert reading.peak - start >= 60 * MiB, reader.method
            assert reading.current - start < 8 * MiB
    finally:
        exact.close()
        sampled.close()


# -- the CUDA paths on the CPU, through tests/cuda_double.py: CUDA never initialised, the OOM
# -- report following the error, host time and --sync, the allocator's backend, cheap reads


@pytest.fixture
def fake_cuda(monkeypatch, ip):
    from cuda_double import FakeCuda

    fake = FakeCuda(monkeypatch)
    ip.user_ns["fake"] = fake
    return fake


def test_memtrace_never_initialises_cuda(ip, run, fake_cuda):
    for cell in (
        "%%memtrace -q\nx = 1\ny = [x] * 3\n",
        "%%memtrace -q --device cuda\nx = 2\n",
        "%%memtrace -q --device cuda:0 --sync\nx = 3\n",
        "%memtrace -q x = 4",
    ):
        r = run(cell)
        assert r.result.success, (cell, r.result.error_in_exec)
        t = ip.user_ns["_memtrace"]
        assert t.device.kind == "cuda" and t.device.label == "cuda:0", cell  # CUDA is tracked...
        assert fake_cuda.init_attempts == [], cell  # ...without initialising it
    assert not fake_cuda.initialized
    # A cell that initialises CUDA itself gets the device's name at the end, and its bytes.
    r = run("%%memtrace -q\nfake.allocate(64 * 2**20)\nz = 1\n")
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert t.device.label == "cuda:0 (Fake H200)"
    assert row(t, 2).delta_bytes == 64 * MiB and row(t, 3).delta_bytes == 0


def test_probe_reads_the_nested_stats_not_the_flattened_ones(ip, run, fake_cuda):
    fake_cuda.allocate(0)  # CUDA in use before the cell
    r = run(
        "%%memtrace -q\n"
        "fake.allocate(32 * 2**20)\n"
        "for i in range(3):\n"
        "    fake.allocate(2**20)\n"
    )
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert row(t, 2).delta_bytes == 32 * MiB
    assert row(t, 4).delta_bytes == 3 * MiB and row(t, 4).hits == 3
    assert row(t, 4).reserved_bytes == 35 * MiB
    # one nested read per boundary (and one at the start), no flattened memory_stats() at all
    assert fake_cuda.calls["memory_stats"] == 0
    # (reads: one when the device is chosen, one at the start, one per statement, one at the end)
    assert fake_cuda.calls["memory_stats_as_nested_dict"] == 3 + int(t.lines["hits"].sum())


def test_time_on_cuda_is_host_time_and_says_so(ip, run, fake_cuda):
    fake_cuda.allocate(0)
    r = run("%%memtrace\na = 1\nb = 2\n")
    t = ip.user_ns["_memtrace"]
    assert t.time_label == "host time" and not t.synced
    html, text = r.html(), r.bundles[0]["text/plain"]
    assert '">host time</th>' in html
    assert "Host time: CUDA kernels run asynchronously" in html
    assert "host time" in text and "%%memtrace --sync" in text
    assert fake_cuda.calls["synchronize"] == 0  # no sync unless asked


def test_sync_charges_each_statement_its_gpu_work_and_states_the_cost(ip, run, fake_cuda):
    fake_cuda.allocate(0)
    fake_cuda.sync_seconds = 0.02  # each wait: the GPU work the statement queued
    r = run("%%memtrace --sync\na = 1\nb = 2\n")
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert t.synced and t.time_label == "time (synced)"
    # a wait at the start, at each of the two statements' ends: 3 boundaries
    assert fake_cuda.calls["synchronize"] == 3 and t.sync_count == 3
    assert t.sync_ns >= 3 * 20_000_000
    assert (t.lines["time_us"] >= 20_000).all()  # each statement's time includes its wait
    html = r.html()
    assert '">time (synced)</th>' in html
    assert "--sync: the device was synchronised at 3 statement boundaries" in html
    assert "The waits took" in html and "up to that much longer" in html


def test_sync_waits_for_nothing_before_cuda_is_initialised(ip, run, fake_cuda):
    r = run("%%memtrace -q --sync\na = 1\nfake.allocate(2**20)\nb = 2\n")
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert fake_cuda.init_attempts == []
    assert t.sync_count == 2  # the two boundaries after the cell initialised CUDA


def test_a_failing_sync_never_becomes_the_cells_error(ip, run, fake_cuda):
    fake_cuda.allocate(0)
    fake_cuda.sync_error = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    r = run("%%memtrace\na = 1\nb = 2\n")
    assert r.result.success, r.result.error_in_exec  # the cell's own behaviour is unchanged
    t = ip.user_ns["_memtrace"]
    assert fake_cuda.calls["synchronize"] == 0  # --sync was not asked for
    r = run("%%memtrace --sync\na = 1\nb = 2\n")
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert fake_cuda.calls["synchronize"] == 1  # tried once, then stopped
    assert any("--sync stopped" in n and "illegal memory access" in n for n in t.notes)
    assert "--sync stopped" in r.html()


def test_sync_on_the_host_is_accepted_and_says_it_has_no_effect(ip, run):
    r = run("%%memtrace --sync --device host\nx = 1\n")
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    assert not t.synced and t.time_label == "time"
    assert any("--sync has no effect" in n for n in t.notes)
    assert "--sync has no effect" in r.html()


def test_host_oom_on_a_gpu_machine_is_a_host_report(ip, run, fake_cuda):
    fake_cuda.allocate(512 * 2**20)  # CUDA in use: %%memtrace tracks cuda:0
    r = run(
        "%%memtrace\n"
        "keep = torch.ones(2**21)\n"
        "huge = torch.empty(2**45, dtype=torch.uint8)\n"
    )
    err = r.result.error_in_exec
    assert isinstance(err, RuntimeError) and "DefaultCPUAllocator" in str(err)
    t = ip.user_ns["_memtrace"]
    assert t.device.kind == "cuda"
    oom = t.oom
    assert oom is not None and oom.device == "host"
    assert oom.requested == 2**45 and oom.total is not None and oom.total < 140 * 2**30
    assert "keep" in {h.name for h in oom.holders}  # the CPU tensors, not the GPU's
    assert "Out of memory on host" in r.html() and "Out of memory on cuda" not in r.html()
    assert fake_cuda.calls["mem_get_info"] == 0


@pytest.mark.parametrize(
    "raise_it",
    [
        "torch.AcceleratorError('CUDA error: out of memory\\nCUDA kernel errors might be "
        "asynchronously reported at some other API call')",
        "RuntimeError('CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`')",
        "RuntimeError('cuDNN error: CUDNN_STATUS_ALLOC_FAILED')",
        "RuntimeError('cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE')",
        "RuntimeError('cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED')",
    ],
)
def test_cuda_oom_errors_outside_the_allocator_get_the_report_and_release(
    ip, run, fake_cuda, raise_it
):
    fake_cuda.allocate(3 * 2**30)
    r = run(
        "%%memtrace -q\n"
        "import weakref\n"
        "refs = []\n"
        "def step():\n"
        "    activations = torch.ones(2**20)\n"
        "    refs.append(weakref.ref(activations))\n"
        f"    raise {raise_it}\n"
        "step()\n"
    )
    assert isinstance(r.result.error_in_exec, RuntimeError)
    t = ip.user_ns["_memtrace"]
    assert t.oom is not None, raise_it
    assert t.oom.device == "cuda:0 (Fake H200)"
    assert t.oom.allocated == 3 * 2**30 and t.oom.free == 2 * 2**30
    assert t.oom.requested is None and "does not say" in t.oom.requested_note
    gc.collect()
    assert ip.user_ns["refs"][0]() is None, "the failed call's frames still hold its tensors"


def test_accelerator_oom_while_tracing_the_host_is_still_an_oom(ip, run):
    r = run(
        "%%memtrace -q --device host\n"
        "import weakref\n"
        "refs = []\n"
        "def step():\n"
        "    activations = torch.ones(2**20)\n"
        "    refs.append(weakref.ref(activations))\n"
        "    raise torch.AcceleratorError('CUDA error: out of memory')\n"
        "step()\n"
    )
    assert isinstance(r.result.error_in_exec, torch.AcceleratorError)
    t = ip.user_ns["_memtrace"]
    assert t.oom is not None and t.oom.device == "cuda"  # CUDA's memory ran out, not the host's
    gc.collect()
    assert ip.user_ns["refs"][0]() is None


def test_cuda_that_fails_to_initialise_falls_back_to_host(ip, run, fake_cuda, monkeypatch):
    def broken() -> int:
        raise RuntimeError("CUDA driver initialization failed, you might not have a CUDA gpu.")

    fake_cuda.initialized = True
    monkeypatch.setattr(torch.cuda, "current_device", broken)
    r = run("%%memtrace -q\nx = 41 + 1\n")
    assert r.result.success, r.result.error_in_exec  # the cell runs
    assert ip.user_ns["x"] == 42
    t = ip.user_ns["_memtrace"]
    assert t.device.kind == "host"
    assert "CUDA is available but unusable (RuntimeError: CUDA driver initialization failed" in t.device.why
    r = run("%%memtrace -q --device cuda\nx = 1\n")  # asked for by name: a usage error that says why
    assert "unusable" in str(r.result.error_in_exec) and "usage: %%memtrace" in str(r.result.error_in_exec)


def test_cuda_malloc_async_backend_caveat(ip, run, fake_cuda, monkeypatch):
    from gpumagic.memory.trace.readers import allocator_backend_note

    fake_cuda.allocate(0)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False,backend:cudaMallocAsync")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    r = run("%%memtrace\nx = 1\n")
    assert "allocator backend is cudaMallocAsync" in r.html()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    r = run("%%memtrace\nx = 1\n")
    assert "cudaMallocAsync" not in r.html()
    # PYTORCH_ALLOC_CONF wins over PYTORCH_CUDA_ALLOC_CONF when both are set, as in torch
    assert allocator_backend_note({"PYTORCH_ALLOC_CONF": "backend:native",
                                   "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}) == ""
    assert allocator_backend_note({"PYTORCH_ALLOC_CONF": "backend: cudaMallocAsync"}) != ""


def test_the_device_filter_reads_tensor_fields_not_device_objects():
    from types import SimpleNamespace

    from gpumagic.memory.trace.device import tensor_filter as device_filter

    class NoDeviceObject(SimpleNamespace):
        @property
        def device(self):  # a torch.device built per tensor: too slow on the probe path
            raise AssertionError("t.device was built")

    on_cuda1 = NoDeviceObject(is_cuda=True, is_cpu=False, get_device=lambda: 1)
    assert device_filter("cuda", 1)(on_cuda1) and not device_filter("cuda", 0)(on_cuda1)
    assert not device_filter("host")(on_cuda1)
    cpu = torch.ones(2)
    assert device_filter("host")(cpu) and not device_filter("cuda", 0)(cpu)
