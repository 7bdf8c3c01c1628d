"""%%gpuprofile's recording and ending (issue 9), through a real IPython shell and real torch
on the CPU: torch flags read one by one (the new TF32 API), failures after the cell ran kept
apart from the cell's outcome, a CUDA run whose trace holds no GPU events, the first marked
step, autocast read from the trace.

Where only a GPU shows the behaviour, torch is patched in the narrowest place (what the
profiler says it supports, whether Kineto reports a stop, a stop() that raises) and the real
profiler does the rest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

MATMUL = "import torch, gpumagic\nx = torch.randn(64, 64) @ torch.randn(64, 64)\n"
# The first step's setup is a sleep far longer than a step's matmul can take even on a loaded
# machine (where a step may wait tens of ms for a CPU): the tests tell the steps apart by it.
SETUP_US = 300_000
STEPS = (
    "import time, torch, gpumagic\n"
    "for i in range(4):\n"
    "    if i == 0:\n"
    f"        time.sleep({SETUP_US / 1e6})  # first-call setup\n"
    "    torch.randn(64, 64) @ torch.randn(64, 64)\n"
    "    gpumagic.step()\n"
)


def _own_notes(p):
    """The report's notes but the one an earlier test's torch.compile leaves for the rest of
    the process (no module hooks while compiled code exists)."""
    return [n for n in p.notes if not n.startswith("No per-module times")]


@pytest.fixture
def live_views(monkeypatch):
    """Every LiveView %%gpuprofile makes, drawing (GPUMAGIC_LIVE=display) as in a kernel."""
    from gpumagic.render import live

    made = []

    class Spy(live.LiveView):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setenv("GPUMAGIC_LIVE", "display")
    monkeypatch.setattr(live, "LiveView", Spy)
    return made


def _finished(view) -> bool:
    return not view.running and view._handle is None


@pytest.fixture
def private_tmp(monkeypatch, tmp_path):
    """The recorder's temporary folders go under tmp_path (other runs share /tmp)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _profile_dirs(root) -> list:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("gpumagic-profile-"))


def _profiler_off() -> bool:
    return (
        not torch.autograd._profiler_enabled() and not torch.autograd.profiler._is_profiler_enabled
    )


# --- the new TF32 API, and failures after the cell ran ----------------------------------------


@pytest.fixture
def new_tf32_api():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    yield
    matmul.fp32_precision = before


def test_cell_with_fp32_precision_tf32_is_profiled(ip, run, new_tf32_api):
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.backends.cuda.matmul.allow_tf32  # noqa: B018  (what broke the magic)
    r = run("%%gpuprofile -q\n" + MATMUL + "x.shape[0]\n")
    assert r.result.success, r.result.error_in_exec
    assert r.result.result == 64
    p = ip.user_ns["_gpuprofile"]
    assert "aten::mm" in set(p.ops["name"])
    assert p.live.matmul_fp32_precision == "tf32" and p.live.tf32_matmul is True
    assert p.live.matmul_allow_tf32 is None  # the legacy getter raised; read on its own
    assert p.live.conv_fp32_precision is not None
    assert p.live.cudnn_benchmark is not None  # the other flags are still read


def test_failed_capture_keeps_the_profile_ends_the_live_view_and_raises_the_cells_error(
    ip, run, live_views, monkeypatch
):
    from gpumagic.profile.record import session as live

    def broken(namespace, autocast_enabled=None):
        raise RuntimeError("flag read failed")

    monkeypatch.setattr(live, "capture_live_state", broken)
    r = run("%%gpuprofile\n" + MATMUL + "raise ValueError('the cell failed')\n")
    assert isinstance(r.result.error_in_exec, ValueError)
    assert str(r.result.error_in_exec) == "the cell failed"
    assert r.plain_stdout.count("ValueError: the cell failed") == 1
    p = ip.user_ns["_gpuprofile"]  # kept, diagnosed from the trace alone
    assert p.live is None and "aten::mm" in set(p.ops["name"])
    html = r.html()
    assert "the session&#x27;s settings could not be read (RuntimeError: flag read failed)" in html
    assert "ValueError: the cell failed" in html
    assert len(live_views) == 1 and _finished(live_views[0])


def test_failed_analysis_is_a_note_the_trace_is_kept_and_the_value_returned(
    ip, run, live_views, monkeypatch, private_tmp
):
    from gpumagic.profile import load

    real = load.load_trace

    def broken(*a, **kw):
        raise RuntimeError("decoder bug")

    monkeypatch.setattr(load, "load_trace", broken)
    ip.user_ns.pop("_gpuprofile", None)
    r = run("%%gpuprofile\n" + MATMUL + "x.shape[0]\n")
    assert r.result.success and r.result.result == 64
    assert "_gpuprofile" not in ip.user_ns
    text = "".join(b.get("text/plain", "") for b in r.bundles)
    assert (
        "%%gpuprofile: the analysis failed (RuntimeError: decoder bug); the trace is kept at "
        in text
    )
    kept = text.split("the trace is kept at ", 1)[1].split(" (", 1)[0]
    assert os.path.exists(kept) and os.path.dirname(kept) == str(private_tmp)
    assert "aten::mm" in set(real(kept).ops["name"])  # a trace the user can load once fixed
    assert _profile_dirs(private_tmp) == []
    assert len(live_views) == 1 and _finished(live_views[0])


def test_failed_diagnosis_keeps_the_partial_result(ip, run, monkeypatch, private_tmp):
    from gpumagic.profile import result

    def broken(analysis, live=None):
        raise ZeroDivisionError("rule bug")

    monkeypatch.setattr(result, "diagnose", broken)
    r = run("%%gpuprofile --trace " + str(private_tmp / "t.json.gz") + "\n" + MATMUL)
    assert r.result.success
    p = ip.user_ns["_gpuprofile"]
    assert "aten::mm" in set(p.ops["name"])  # what does not need the rules is there
    text = "".join(b.get("text/plain", "") for b in r.bundles)
    assert "the analysis failed (ZeroDivisionError: rule bug)" in text
    assert f"the trace is kept at {private_tmp / 't.json.gz'}" in text  # --trace, not a copy
    assert "the partial result is in _gpuprofile" in text


# --- a CUDA recording whose trace holds no GPU events -----------------------------------------


def test_cuda_recordable_needs_kineto_cuda_and_a_gpu(monkeypatch):
    from torch.profiler import ProfilerActivity

    from gpumagic.profile.record.recorder import cuda_recordable

    assert cuda_recordable(torch) is (
        ProfilerActivity.CUDA in torch.profiler.supported_activities() and torch.cuda.is_available()
    )
    both = {ProfilerActivity.CPU, ProfilerActivity.CUDA}
    for activities, available, expected in (
        (both, True, True),
        (both, False, False),
        ({ProfilerActivity.CPU}, True, False),  # a build without Kineto's GPU support
    ):
        monkeypatch.setattr(torch.profiler, "supported_activities", lambda a=activities: a)
        monkeypatch.setattr(torch.cuda, "is_available", lambda v=available: v)
        assert cuda_recordable(torch) is expected


# torch, asked for CUDA activity without a GPU, says it disables it: the situation modelled
_NO_CUDA_WARNING = "ignore:CUDA is not available, disabling CUDA profiling:UserWarning"


@pytest.fixture
def cuda_believed(monkeypatch):
    """The recorder believes CUDA was recorded (and used by the cell); torch, finding no GPU,
    records none: what a busy CUPTI or a build without Kineto's GPU support leaves."""
    from gpumagic.profile.record import recorder as record

    monkeypatch.setattr(record, "cuda_recordable", lambda torch: True)
    monkeypatch.setattr(record, "_cuda_used", lambda at_start: True)
    return record


@pytest.mark.filterwarnings(_NO_CUDA_WARNING)
def test_cuda_recorded_but_no_gpu_events_says_so(ip, run, cuda_believed):
    r = run("%%gpuprofile\n" + MATMUL)
    assert r.result.success, r.result.error_in_exec
    p = ip.user_ns["_gpuprofile"]
    assert p.summary.cpu_only is True
    # exactly one note about the missing GPU events (an earlier test's torch.compile adds a
    # note of its own about module hooks to every later profile of this process)
    (note,) = [n for n in p.notes if "GPU events" in n]
    assert note.startswith("CUDA activity was recorded, yet the trace holds no GPU events")
    assert "CUPTI may be busy or unavailable" in note and "lacks Kineto's GPU support" in note
    assert "note: CUDA activity was recorded" in p.to_text()
    assert "gm-record-note" in r.html() and "CUPTI may be busy" in r.html()


@pytest.mark.filterwarnings(_NO_CUDA_WARNING)
def test_cpu_only_cell_on_a_cuda_machine_gets_no_note(ip, run, cuda_believed, monkeypatch):
    # no CUDA allocation during the cell (or CUDA never initialised): it ran on the CPU
    monkeypatch.setattr(cuda_believed, "_cuda_used", lambda at_start: False)
    r = run("%%gpuprofile -q\n" + MATMUL)
    assert r.result.success
    assert _own_notes(ip.user_ns["_gpuprofile"]) == []


def test_the_cell_used_the_gpu_when_cuda_memory_moved(monkeypatch):
    from gpumagic.profile.record import recorder as record

    stats = {"allocation": {"all": {"allocated": 7, "peak": 3}}, "allocated_bytes": {"all": {}}}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert record._cuda_allocations() is None  # never reads (or initialises) CUDA before init
    assert record._cuda_used(None) is False
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda: stats)
    start = record._cuda_allocations()
    assert record._cuda_used(None) is True  # CUDA was initialised during the cell
    assert record._cuda_used(start) is False  # nothing allocated: a CPU cell
    stats["allocation"]["all"]["allocated"] = 8
    assert record._cuda_used(start) is True


def test_kineto_log_level_is_not_left_for_the_kernel_and_its_children(ip, run, monkeypatch):
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    r = run("%%gpuprofile -q\n" + MATMUL)
    assert r.result.success
    assert "KINETO_LOG_LEVEL" not in os.environ
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('KINETO_LOG_LEVEL'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "None"
    monkeypatch.setenv("KINETO_LOG_LEVEL", "3")  # the user's own choice stays
    assert run("%%gpuprofile -q\n" + MATMUL).result.success
    assert os.environ["KINETO_LOG_LEVEL"] == "3"


# --- the first marked step: first-call setup --------------------------------------------------


def test_first_marked_step_left_out_by_default_and_keep_first_keeps_it(ip, run):
    r = run("%%gpuprofile\n" + STEPS)
    assert r.result.success, r.result.error_in_exec
    p = ip.user_ns["_gpuprofile"]
    s = p.summary
    assert s.steps == 3 and s.first_step_left_out is True
    assert s.step_names == ["1", "2", "3"]
    assert s.step_time_max_us < SETUP_US / 2  # the setup is not in any step
    assert (
        "steps: 3 of 4 (ProfilerStep 1-3; the first (setup) left out, --keep-first keeps it)"
        in (r.bundles[0]["text/plain"])
    )
    assert _own_notes(p) == []  # every marked step is in the trace

    r = run("%%gpuprofile -q --keep-first\n" + STEPS)
    assert r.result.success
    s = ip.user_ns["_gpuprofile"].summary
    assert s.steps == 4 and s.first_step_left_out is False
    assert s.step_names == ["0", "1", "2", "3"]
    assert s.step_time_max_us >= SETUP_US


def test_an_only_marked_step_is_kept(ip, run):
    r = run("%%gpuprofile -q\n" + MATMUL + "gpumagic.step()\n")
    assert r.result.success
    s = ip.user_ns["_gpuprofile"].summary
    assert s.steps == 1 and s.first_step_left_out is False


def test_schedule_keeps_its_own_window(ip, run):
    r = run("%%gpuprofile -q --wait 1 --warmup 1 --active 2\n" + STEPS)
    assert r.result.success
    s = ip.user_ns["_gpuprofile"].summary
    assert s.steps == 2 and s.first_step_left_out is False


def test_device_collection_stopped_early_is_noted(ip, run, monkeypatch):
    """Kineto reports a stop after the third mark; torch's own profiler then writes the trace
    so far (RECORD -> DEVICE_STOPPED) and records nothing more."""
    from gpumagic.profile.record import recorder as record

    real_step = record.Recorder.step

    def step(self):
        if self.steps == 2:
            monkeypatch.setattr(torch.autograd, "_is_kineto_stopped", lambda: True)
            self._prof.use_device = "cuda"  # a device profiler: only those react to the stop
        real_step(self)

    monkeypatch.setattr(record.Recorder, "step", step)
    cell = (
        "import torch, gpumagic\n"
        "for i in range(6):\n    torch.randn(64, 64) @ torch.randn(64, 64)\n    gpumagic.step()\n"
    )
    with pytest.warns(UserWarning, match="stopped early at step 3"):
        r = run("%%gpuprofile -q\n" + cell)
    assert r.result.success, r.result.error_in_exec
    p = ip.user_ns["_gpuprofile"]
    assert p.summary.steps == 2  # ProfilerStep 0-2 in the trace, the first left out
    assert any(
        n.startswith("The profiler stopped collecting device activity early, at step 3 of the 6")
        for n in p.notes
    ), p.notes
    assert "--wait/--warmup/--active" in _own_notes(p)[-1]


# --- torch's stop() failing, as after a sticky CUDA error -------------------------------------


def test_profiler_stop_failing_leaves_nothing_running_and_raises_the_cells_error(
    ip, run, live_views, monkeypatch, private_tmp
):
    from gpumagic.profile.record.recorder import current

    def stop(self):  # as after a sticky CUDA error: torch.cuda.synchronize() raises first
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.profiler.profile, "stop", stop)
    r = run(
        "%%gpuprofile\n"
        + MATMUL
        + "raise RuntimeError('CUDA error: device-side assert triggered')\n"
    )
    err = r.result.error_in_exec
    assert isinstance(err, RuntimeError) and "device-side assert" in str(err)  # the cell's own
    assert _profiler_off()  # disabled although stop() never got there
    assert current() is None
    assert _profile_dirs(private_tmp) == []
    assert len(live_views) == 1 and _finished(live_views[0])
    text = "".join(b.get("text/plain", "") for b in r.bundles)
    assert "the profiler failed to stop (RuntimeError: CUDA error: an illegal memory access" in text
    assert "The cell failed (RuntimeError: CUDA error: device-side assert triggered)" in text

    monkeypatch.undo()  # the next profile starts and stops fine
    r = run("%%gpuprofile -q\n" + MATMUL)
    assert r.result.success and "aten::mm" in set(ip.user_ns["_gpuprofile"].ops["name"])
    assert _profiler_off()


def test_a_cell_that_ran_keeps_its_value_when_stop_fails(ip, run, monkeypatch):
    def stop(self):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(torch.profiler.profile, "stop", stop)
    r = run("%%gpuprofile\n" + MATMUL + "x.shape[0]\n")
    # the cell itself did not fail: its value stands, the failure is reported, not raised
    assert r.result.success and r.result.result == 64
    assert "the profiler failed to stop" in "".join(b.get("text/plain", "") for b in r.bundles)
    assert _profiler_off()


# --- autocast read from the trace -------------------------------------------------------------


def _autocast_ops(p) -> set[str]:
    from gpumagic.profile.analysis.precision import autocast_matmuls

    host = p.primary.trace.host
    return {host.name.at(i) for i in np.flatnonzero(autocast_matmuls(p.primary))}


def test_autocast_is_read_from_the_trace_not_the_cell_text(ip, run):
    r = run(
        "%%gpuprofile -q\n"
        "import torch\n"
        "a = torch.randn(64, 64)\n"
        "# autocast would make this faster\n"
        "with torch.autocast('cpu', enabled=False):\n"
        "    b = a @ a\n"
    )
    assert r.result.success
    p = ip.user_ns["_gpuprofile"]
    assert p.live.autocast_enabled is None  # nothing taken from the text
    assert _autocast_ops(p) == set()

    r = run(
        "%%gpuprofile -q\n"
        "import torch\n"
        "a = torch.randn(64, 64)\n"
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    b = a @ a\n"
    )
    assert r.result.success
    assert ip.user_ns["b"].dtype == torch.bfloat16  # it did run under autocast
    assert {"aten::matmul", "aten::mm"} <= _autocast_ops(ip.user_ns["_gpuprofile"])
