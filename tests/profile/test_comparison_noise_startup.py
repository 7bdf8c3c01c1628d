"""Numbers a learner can trust (issue 18): comparisons with their noise, one set of steps
for every table, the start-up phase of a trace without step marks, advice that fits the
machine.

The intervals are checked on samples with a known answer (and on real traces compared with
themselves); the steps, lines and modules on traces built here, where every count is known.
"""

from __future__ import annotations

import numpy as np
import pytest
from profile_helpers import TraceBuilder

import gpumagic
from gpumagic.profile.analysis import noise
from gpumagic.profile.analysis.startup import find_startup
from gpumagic.profile.compare import compare
from gpumagic.profile.load import load_trace
from gpumagic.profile.rules.base import Facts
from gpumagic.profile.rules.input_pipeline import advise_dataloader, detect_dataloader
from gpumagic.profile.trace.spans import CodeLabels, StatementLabel

# --- the statistics -----------------------------------------------------------------------


def test_a_shift_well_beyond_the_noise_is_called_and_its_interval_holds_it():
    rng = np.random.default_rng(3)
    a = rng.normal(10.0, 0.5, 40)
    b = rng.normal(13.0, 0.5, 40)  # 30% slower
    d = noise.difference(a, b)
    assert d.verdict == "slower"
    lo, hi = d.interval_percent
    assert lo < 30 < hi and lo > noise.MARGIN_PERCENT
    assert d.interval[0] < 3.0 < d.interval[1]
    assert noise.difference(b, a).verdict == "faster"


def test_samples_of_one_distribution_show_no_difference():
    rng = np.random.default_rng(4)
    calls = [
        noise.difference(rng.lognormal(0, 0.3, 30), rng.lognormal(0, 0.3, 30)).verdict
        for _ in range(40)
    ]
    assert calls.count("no difference") >= 38


def test_the_shift_is_steady_where_a_median_jumps_between_two_modes():
    # a busy machine: each step took 10 or 14 ms (the process waited a time slice or not),
    # about half and half; a median of such steps lands on either mode
    rng = np.random.default_rng(5)
    a = np.where(rng.random(41) < 0.5, 10.0, 14.0)
    b = np.where(rng.random(41) < 0.5, 10.0, 14.0)
    d = noise.difference(a, b)
    assert d.verdict == "no difference"
    assert abs(d.estimate) <= 2.0  # the medians may differ by 4 ms; the shift stays small


def test_run_to_run_noise_widens_the_interval_when_runs_are_kept_apart():
    rng = np.random.default_rng(6)
    # three runs a side, each shifted as a whole by up to +-10%: steps alone cannot see it
    a = [rng.normal(10.0 * s, 0.2, 20) for s in (0.9, 1.0, 1.1)]
    b = [rng.normal(10.0 * s, 0.2, 20) for s in (1.1, 0.95, 1.0)]
    hierarchical = noise.difference(a, b)
    flat = noise.difference(np.concatenate(a), np.concatenate(b))
    width = lambda d: d.interval[1] - d.interval[0]  # noqa: E731
    assert width(hierarchical) > 1.5 * width(flat)
    assert hierarchical.samples == ((3, 60), (3, 60))


def test_too_few_steps_give_no_interval_and_no_verdict():
    d = noise.difference([10.0, 11.0], [20.0, 21.0])
    assert d.interval is None and d.interval_percent is None
    assert d.verdict == "no difference" and "fewer than 3 steps" in d.reason


def test_the_same_samples_give_the_same_interval():
    rng = np.random.default_rng(7)
    a, b = rng.normal(5, 1, 25), rng.normal(5.5, 1, 25)
    assert noise.difference(a, b) == noise.difference(a, b)


def test_many_steps_stay_cheap():
    rng = np.random.default_rng(8)
    a, b = rng.normal(5, 1, 3000), rng.normal(5.2, 1, 3000)
    d = noise.difference(a, b)  # pairs beyond MAX_PAIRS are drawn at random
    assert d.interval[0] < 0.2 < d.interval[1]


# A million steps a side, as a user may pass any two arrays to gpumagic.difference: the
# peak RSS it adds and the time it takes, measured in a child so that neither this process's
# earlier peak nor a MemoryError hides anything.
MILLION = """
import json, resource, sys, time
import numpy as np
import gpumagic

rng = np.random.default_rng(11)
a = rng.normal(100.0, 10.0, 10**6)
out = []
for b, statistic in ((a + 1.0, "shift"), (a + 5.0, "shift"), (a + 5.0, "mean")):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    d = gpumagic.difference(a, b, statistic)
    seconds = time.perf_counter() - t0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    out.append(dict(seconds=seconds, grown_mib=grown / 1024, verdict=d.verdict,
                    estimate=d.estimate, interval=d.interval, notes=list(d.notes)))
print(json.dumps(out))
"""


def test_a_million_steps_a_side_stay_bounded_in_memory_and_time():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", MILLION],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    same, slower, mean = json.loads(done.stdout)
    for d in (same, slower, mean):
        # about 2 s and 40 MiB here; generous for a loaded machine
        assert d["seconds"] < 60 and d["grown_mib"] < 300, d
        assert d["notes"] == [
            "the interval comes from 10,000 of the 1,000,000 samples of a and 10,000 of the "
            "1,000,000 samples of b, drawn at random (each run in proportion) to bound the work "
            "at 10,000 values a side; an interval from fewer samples is wider, so the verdict "
            "errs toward no difference. The estimate uses every sample."
        ]
    # +1% lies within the margin; +5% beyond it, and the interval holds it
    assert same["verdict"] == "no difference" and same["estimate"] == pytest.approx(1.0, abs=0.1)
    assert same["interval"][0] < 1.0 < same["interval"][1]
    for d in (slower, mean):
        assert d["verdict"] == "slower", d
        assert d["interval"][0] < 5.0 < d["interval"][1], d
        assert d["interval"][1] - d["interval"][0] < 2.0, d  # thinned, still tight


def test_a_thinned_side_keeps_its_runs_and_their_noise():
    rng = np.random.default_rng(12)
    # three runs a side of 10^5 steps, each run shifted as a whole by up to +-10%
    a = [rng.normal(10.0 * s, 0.2, 10**5) for s in (0.9, 1.0, 1.1)]
    b = [rng.normal(10.0 * s, 0.2, 10**5) for s in (1.1, 0.95, 1.0)]
    hierarchical = noise.difference(a, b)
    flat = noise.difference(np.concatenate(a), np.concatenate(b))
    width = lambda d: d.interval[1] - d.interval[0]  # noqa: E731
    assert width(hierarchical) > 1.5 * width(flat)
    assert hierarchical.samples == ((3, 300_000), (3, 300_000))  # what was given
    assert "9,999 of the 300,000 samples of a" in hierarchical.notes[0]
    runs, kept = noise.thinned(a, rng)
    assert [len(r) for r in runs] == [3333] * 3 and kept == "9,999 of the 300,000"
    # a side within the bound is left whole, and says nothing
    whole = [a[0][:5000], a[1][:5000]]
    assert noise.thinned(whole, rng) == (whole, "")
    assert noise.difference(a[0][:500], b[0][:500]).notes == ()


# --- comparisons of real and built traces ---------------------------------------------------


def test_a_trace_compared_with_itself_shows_no_difference(load):
    r = load("v100_training_5steps.json.gz")
    c = compare(r, r)
    assert c.verdict == "no difference"
    lo, hi = c.interval
    assert lo <= 0 <= hi
    assert (c.breakdown["verdict"] == "no difference").all()
    assert set(c.findings["status"]) == {"still present"}
    assert c.headline.startswith("no difference beyond the noise: median step time")


def _steps_trace(path, durations_ms, kernel_ms=1.0, loader_ms=0.0):
    """ProfilerStep-marked steps of the given lengths, each a kernel (and a DataLoader wait)."""
    b = TraceBuilder()
    t = 0.0
    for i, d in enumerate(durations_ms):
        b.op(f"ProfilerStep#{i}", t, d * 1000, cat="user_annotation")
        if loader_ms:
            b.op(
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                t + 10,
                loader_ms * 1000,
                cat="user_annotation",
            )
        start = t + 20 + loader_ms * 1000
        b.op("aten::mm", start, 50.0)
        b.launch("volta_sgemm_128x64_nn", start + 10, start + 30, kernel_ms * 1000)
        t += d * 1000
    return load_trace(b.write(path))


def test_a_slower_run_is_called_slower_with_its_interval_in_the_report(tmp_path):
    rng = np.random.default_rng(9)
    a = _steps_trace(tmp_path / "a.json", rng.normal(10, 0.3, 30))
    b = _steps_trace(tmp_path / "b.json", rng.normal(13, 0.3, 30))
    c = gpumagic.compare(a, b, names=("a", "b"))
    assert c.verdict == "slower"
    assert c.interval[0] > 20 and c.interval[1] < 40
    t = c.table
    assert t.loc["step_time_median_us", "verdict"] == "slower"
    assert t.loc["step_time_median_us", "delta_low"] > 0
    text = c._text()
    assert c.headline in text and "slower: median step time" in c.headline
    # a relative change is never shown without its interval
    for line in text.splitlines():
        if line.startswith(("median step time", "mean step time")):
            assert "95% CI" in line, line
    assert "Samples: a 1 run, 30 steps; b 1 run, 30 steps" in text


def test_categories_and_findings_follow_the_verdict(tmp_path):
    rng = np.random.default_rng(10)
    # a: 6 ms of every 10 ms step waits for the DataLoader; b: it does not
    a = _steps_trace(tmp_path / "a.json", rng.normal(10, 0.2, 20), loader_ms=6.0)
    b = _steps_trace(tmp_path / "b.json", rng.normal(4, 0.2, 20))
    c = compare(a, b)
    assert c.breakdown.loc["DataLoader", "verdict"] == "less"
    assert c.breakdown.loc["Memset", "verdict"] == "no difference"
    status = c.findings.set_index("rule")["status"]
    assert status["dataloader"] == "fixed"
    # the same loader wait, measured twice: the finding is still there, nothing was fixed
    same = compare(a, _steps_trace(tmp_path / "a2.json", rng.normal(10, 0.2, 20), loader_ms=6.0))
    assert same.breakdown.loc["DataLoader", "verdict"] == "no difference"
    assert same.findings.set_index("rule")["status"]["dataloader"] == "still present"


def test_a_finding_whose_cost_is_below_the_noise_is_not_called_fixed(tmp_path):
    rng = np.random.default_rng(11)
    a = _steps_trace(tmp_path / "a.json", rng.normal(10, 2.0, 20))
    b = _steps_trace(tmp_path / "b.json", rng.normal(10, 2.0, 20))
    c = compare(a, b)
    # pretend a rule without a breakdown category found a 10 µs cost in a only
    assert c.noise_us > 10.0
    assert not c._beyond_noise("zero_grad", 10.0, "down")
    assert c._beyond_noise("zero_grad", 10 * c.noise_us, "down")


# --- one set of steps ----------------------------------------------------------------------


def _cell_with_setup_step(path):
    """A %%gpuprofile-like trace: 3 marked steps, the first 10x the others (setup); each step
    runs statement 1 (line 3) once and launches one kernel; statement 0 (line 2) runs before
    the loop."""
    b = TraceBuilder()
    b.op("gpumagic.line#0 L2", 0.0, 500.0)
    t = 1000.0
    for i, d in enumerate((10_000.0, 1_000.0, 1_000.0)):
        b.op(f"ProfilerStep#{i}", t, d, cat="user_annotation")
        b.op("gpumagic.line#1 L3", t + 10, d - 100)
        b.op("gpumagic.module#0", t + 20, d - 200)
        b.op("aten::mm", t + 30, d - 300)
        b.launch("volta_sgemm_128x64_nn", t + 40, t + 50, 100.0)
        t += d
    labels = CodeLabels(
        [StatementLabel(0, 2, 0, "x = setup()"), StatementLabel(1, 3, 1, "y = model(x)")], []
    )
    from gpumagic.profile.trace.spans import ModuleLabel

    labels.modules = [ModuleLabel(0, "model", "Linear")]
    doc_path = b.write(path)
    return load_trace(doc_path, skip_first=True, labels=labels)


def test_lines_modules_ops_and_kernels_count_the_steps_the_statistics_count(tmp_path):
    r = _cell_with_setup_step(tmp_path / "cell.json")
    s = r.summary
    assert s.steps == 2 and s.first_step_left_out
    lines = r.lines.set_index("line")
    # the setup step's hit and the code before the loop are out, as in the step statistics
    assert list(lines.index) == [3]
    assert lines.loc[3, "hits"] == 2
    assert lines.loc[3, "host_us"] == pytest.approx(2 * 900.0)
    assert lines.loc[3, "device_us"] == pytest.approx(200.0)
    assert r.modules.set_index("module").loc["model", "calls"] == 2
    assert r.ops.set_index("name").loc["aten::mm", "calls"] == 2
    assert r.kernels.set_index("name").loc["volta_sgemm_128x64_nn", "calls"] == 2
    # per line, no more time than a whole step per hit
    assert lines.loc[3, "host_us"] / lines.loc[3, "hits"] <= s.step_time_max_us


def test_keep_first_puts_the_setup_step_back_everywhere(tmp_path):
    r = _cell_with_setup_step(tmp_path / "cell.json")
    kept = load_trace(tmp_path / "cell.json", labels=r.primary.trace.code.labels)
    assert kept.summary.steps == 3
    assert kept.lines.set_index("line").loc[3, "hits"] == 3
    assert kept.ops.set_index("name").loc["aten::mm", "calls"] == 3


# --- traces without step marks ---------------------------------------------------------------


def test_a_trace_without_step_marks_names_its_start_up_and_leaves_it_out(load):
    r = load("a100_alexnet_syncs.json.gz")
    s = r.summary
    assert s.steps_from == "trace" and s.startup_left_out
    # the first CUDA call of the process blocks ~30 s creating the context
    assert "cudaDeviceGetStreamPriorityRange" in s.startup
    assert s.startup_us > 40e6
    assert s.step_time_us < 0.1 * s.wall_time_us
    text = r.to_text()
    assert "no step marks" in text and "start-up: 42.2 s, left out" in text
    # no finding promises to save the start-up
    assert all(f.saving_us < s.step_time_us for f in r.findings)
    whole = load("a100_alexnet_syncs.json.gz", keep_startup=True)
    assert whole.summary.step_time_us == pytest.approx(s.wall_time_us, rel=1e-3)
    assert whole.summary.startup_us == s.startup_us and not whole.summary.startup_left_out


def test_a_trace_that_is_slow_throughout_has_no_start_up_in_its_launches(load):
    # CUPTI's counter replay makes every launch take ~50-150 ms: that is how this trace runs
    st = load("a100_cupti_counters.json.gz").primary.steps
    assert st.startup is not None
    assert not [e for e in st.startup.events if e.name == "cudaLaunchKernel"]
    assert {e.kind for e in st.startup.events} <= {
        "CUDA context",
        "stream and event creation",
        "first call",
    }


def test_marked_traces_and_built_ones_without_slow_calls_have_no_start_up(load, tmp_path):
    assert load("v100_training_5steps.json.gz").summary.startup == ""
    b = TraceBuilder()
    b.op("aten::mm", 0.0, 100.0)
    b.launch("k", 10.0, 20.0, 30.0)
    assert find_startup(load_trace(b.write(tmp_path / "t.json")).primary.trace) is None


def test_a_slow_first_call_is_start_up_and_a_slow_only_call_is_not(tmp_path):
    b = TraceBuilder()
    b.op("aten::cudnn_convolution", 0.0, 400_000.0)  # first call: handles, autotuning
    for i in range(5):
        b.op("aten::cudnn_convolution", 500_000.0 + i * 2000, 1000.0)
    b.op("aten::once", 600_000.0, 300_000.0)  # one call: nothing to compare it with
    su = find_startup(load_trace(b.write(tmp_path / "t.json")).primary.trace)
    assert su is not None and [e.name for e in su.events] == ["aten::cudnn_convolution"]
    assert su.events[0].kind == "first call" and su.end == pytest.approx(400_000.0)


# --- advice that fits the machine ------------------------------------------------------------


@pytest.mark.parametrize(("cpus", "workers"), [(2, 1), (4, 3), (64, 8)])
def test_the_dataloader_fix_uses_the_cpus_this_process_may_use(load, cpus, workers):
    from gpumagic.profile.rules.base import Context

    r = load("resnet50_v100_num_workers_0.json.gz")
    e = detect_dataloader(Context(r.primary, None))
    advice = advise_dataloader(e, Facts(cpus=cpus))
    assert f"num_workers={workers}," in advice.snippet
    assert f"{cpus} CPUs" in advice.snippet and f"{workers} for this machine" in advice.fix
    one = advise_dataloader(e, Facts(cpus=1))
    assert "num_workers=0" in one.snippet and "one CPU" in one.fix


def test_the_live_diagnosis_knows_this_machine():
    import os

    facts = Facts.here(None)
    assert facts.cpus == len(os.sched_getaffinity(0))
    assert facts.torch_version is not None and facts.torch_version >= (2, 1)


def test_snippets_follow_the_gpu_and_the_installed_torch():
    assert Facts(torch_version=(2, 2)).grad_scaler() == "torch.cuda.amp.GradScaler()"
    assert Facts(torch_version=(2, 5)).grad_scaler() == "torch.amp.GradScaler('cuda')"
    assert Facts(compute_capability=(7, 0)).bf16 is False
    assert Facts(compute_capability=(9, 0)).bf16 is True


def test_lines_marked_with_a_comment_still_pair_with_the_run_before(tmp_path):
    def run(sources, name):
        b = TraceBuilder()
        for i, _ in enumerate(sources):
            b.op(f"gpumagic.line#{i} L{i + 2}", i * 100.0, 100.0)
        labels = CodeLabels([StatementLabel(i, i + 2, 0, s) for i, s in enumerate(sources)], [])
        return load_trace(b.write(tmp_path / name), labels=labels)

    before = run(["x = f()", "y = x.to(device)"], "a.json")
    after = run(["x = f()", "y = x.to(device, non_blocking=True)  # <- new", "z = 1"], "b.json")
    again = run(["x = f()  # the same call", "y = x.to(device)"], "c.json")
    lines = compare(before, again).lines
    assert list(lines["a_line"]) == [2, 3] and list(lines["b_line"]) == [2, 3]
    assert lines.loc[0, "source"] == "x = f()  # the same call"  # the later run's text
    paired = compare(before, after).lines.set_index("source")
    assert paired.loc["x = f()", "a_line"] == 2  # a changed line does not pair, a kept one does
    assert np.isnan(paired.loc["y = x.to(device, non_blocking=True)  # <- new", "a_line"])


def test_analyze_says_the_trace_has_no_step_marks_and_names_its_start_up(capsys):
    from profile_helpers import trace_path

    from gpumagic.profile.cli import main

    path = str(trace_path("a100_alexnet_syncs.json.gz"))
    assert main(["analyze", path, "--rows", "2"]) == 0
    out = capsys.readouterr().out
    assert "no step marks" in out
    assert "start-up: 42.2 s, left out of every figure below" in out
    assert "cudaDeviceGetStreamPriorityRange" in out
    assert "saves ~42" not in out  # no finding promises the start-up as a saving
    assert main(["analyze", path, "--rows", "2", "--keep-startup"]) == 0
    kept = capsys.readouterr().out
    assert "start-up: 42.2 s, counted in the step" in kept and "step time: 43.4 s" in kept
