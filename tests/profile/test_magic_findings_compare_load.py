"""%%gpuprofile through a real IPython shell on the CPU: findings, steps, errors, compare, load."""

from __future__ import annotations

import gzip
import json

import pytest
from cell_outputs import run_showing

torch = pytest.importorskip("torch")

LOADER_SETUP = """\
import time, torch, gpumagic
from torch.utils.data import DataLoader, Dataset

class SlowData(Dataset):
    # a slow __getitem__ (I/O-like: it sleeps, so worker processes overlap it even on 2 cores)
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.randn(3, 32, 32), i % 10

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""

# Each step also waits 40 ms, standing in for the GPU's share of a real step: a fixed time
# whatever the load on the test machine, so one process (32 ms of loading per batch) stalls
# the step and four workers (a batch every 8 ms between them; sleeping workers need no core)
# keep up. On a loaded machine the workers also wait for a CPU to build and send each
# batch: with 15 ms steps they fell behind (49.9% against 75.1% one run), 40 ms leave them
# room, while one process still waits for every batch.
TRAIN = """\
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.04)
    gpumagic.step()
"""


@pytest.fixture
def setup(ip, run):
    # One intra-op thread: on a loaded machine torch's thread pool waits for descheduled
    # threads, and the tiny model's ops then took 45 ms a step (7 ms per log_softmax),
    # enough to hide the loader's share; sleeping loaders are what these tests measure.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    r = run(LOADER_SETUP)
    assert r.result.success, r.stdout
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def show(ip, run):
    """show(cell) -> Outputs: the cell's display() bundles and its Out[] bundle."""
    return lambda cell: run_showing(ip, run, cell)


# torch suggests at most os.cpu_count() workers; these sleep, so four need no core each
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes:UserWarning")
def test_single_process_dataloader_is_diagnosed_and_workers_fix_it(ip, run, show, setup):
    r = run("%%gpuprofile -n slow -q\nloader = DataLoader(SlowData(), batch_size=8, num_workers=0)\n" + TRAIN)
    assert r.result.success, r.stdout
    slow = ip.user_ns["_gpuprofile"]
    # 64 / 8 batches, each closed by gpumagic.step(); the first (setup) is left out
    assert slow.summary.steps == 7 and slow.summary.first_step_left_out is True
    assert slow.summary.steps_from == "ProfilerStep"
    rules = {f.rule: f for f in slow.findings}
    assert "dataloader" in rules
    assert "num_workers=0" in rules["dataloader"].message
    slow_share = slow.breakdown.loc["DataLoader", "percent"]
    assert slow_share > 25
    assert abs(slow.breakdown["percent"].sum() - 100) < 0.01

    r = run(
        "%%gpuprofile -n fast -q\n"
        "loader = DataLoader(SlowData(), batch_size=8, num_workers=4, persistent_workers=True)\n"
        "next(iter(loader))\n"  # start the workers before the steps we compare
        + TRAIN
    )
    assert r.result.success, r.stdout
    fast = ip.user_ns["_gpuprofile"]
    fast_share = fast.breakdown.loc["DataLoader", "percent"]
    print(f"DataLoader share: num_workers=0 {slow_share:.1f}%, num_workers=4 {fast_share:.1f}%")
    assert fast_share < slow_share / 2

    r = show("%gpuprofile --compare slow fast")
    assert r.result.success, r.stdout
    html = r.html()
    assert "DataLoader" in html and "gpumagic" in html
    comparison = ip.user_ns["_gpuprofile_compare"]
    assert "DataLoader" in comparison.headline


def test_cell_without_step_marks_is_one_step_and_keeps_its_value(ip, run):
    r = run("%%gpuprofile -q\nimport torch\na = torch.randn(64, 64)\nb = a @ a\nb.shape[0] * 2\n")
    assert r.result.success, r.stdout
    assert r.result.result == 128  # the cell's value, as without the magic
    assert ip.user_ns["b"].shape == (64, 64)
    p = ip.user_ns["_gpuprofile"]
    assert p.summary.steps == 1 and p.summary.steps_from == "trace"
    assert p.summary.cpu_only is True
    assert "aten::mm" in set(p.ops["name"])


def test_dataloader_batches_are_steps_without_marks(ip, run, setup):
    r = run(
        "%%gpuprofile -q\nloader = DataLoader(SlowData(), batch_size=16, num_workers=0)\n"
        "for x, y in loader:\n    model(x).sum().backward()\n"
    )
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    assert p.summary.steps_from == "DataLoader"
    assert p.summary.steps >= 4


def test_exception_shows_partial_profile_stops_profiler_and_propagates_once(ip, run):
    r = run("%%gpuprofile\nimport torch\nx = torch.randn(32, 32) @ torch.randn(32, 32)\nraise ValueError('halfway')\n")
    assert isinstance(r.result.error_in_exec, ValueError)
    assert r.plain_stdout.count("ValueError: halfway") == 1
    assert "ValueError: halfway" in r.html()  # the note on top of the partial profile
    assert ip.user_ns["x"].shape == (32, 32)
    assert "aten::mm" in set(ip.user_ns["_gpuprofile"].ops["name"])
    assert not torch.autograd.profiler._is_profiler_enabled
    from gpumagic.profile.record.recorder import current

    assert current() is None
    r = run("%%gpuprofile -q\ny = 1\n")  # the next profile starts fine
    assert r.result.success


def test_schedule_trace_export_and_load(ip, run, show, tmp_path):
    out = tmp_path / "cell.json.gz"
    r = run(
        f"%%gpuprofile -q --wait 1 --warmup 1 --active 2 --trace {out}\n"
        "import torch, gpumagic\n"
        "for i in range(6):\n    torch.randn(64, 64) @ torch.randn(64, 64)\n    gpumagic.step()\n"
    )
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    assert p.summary.steps == 2
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    assert any(e.get("name", "").startswith("ProfilerStep") for e in events)
    r = show(f"%gpuprofile --load {out}")
    assert r.result.success, r.stdout
    assert r.value is ip.user_ns["_gpuprofile"] and r.value.summary.steps == 2
    assert "gpumagic" in r.html()


MATMUL = "import torch\nx = torch.randn(64, 64) @ torch.randn(64, 64)\n"


@pytest.fixture
def two_runs(run, tmp_path):
    """Runs kept as "a" and "b"; a's trace written to tmp_path/a.json.gz."""
    for name in ("a", "b"):
        r = run(f"%%gpuprofile -q -n {name} --trace {tmp_path / name}.json.gz\n" + MATMUL)
        assert r.result.success, r.stdout
    return tmp_path


def test_compare_returns_the_comparison_shown_once_as_out(ip, show, two_runs):
    from gpumagic.profile.compare import Comparison

    r = show("%gpuprofile --compare a b")
    assert r.result.success, r.stdout
    comparison = ip.user_ns["_gpuprofile_compare"]
    assert isinstance(comparison, Comparison) and r.value is comparison
    assert ip.user_ns["Out"][r.result.execution_count] is comparison
    assert (comparison.a.name, comparison.b.name) == ("a", "b")
    assert r.displayed == []  # shown once, as Out[], not display()ed as well
    assert r.reports("profile-compare") == r.out and len(r.out) == 1

    r = show("cmp = %gpuprofile --compare a b -q -o")  # -o: returned although --quiet
    assert r.result.success and r.bundles == [] and r.value is None
    assert ip.user_ns["cmp"] is ip.user_ns["_gpuprofile_compare"]

    # a trailing ";" (a comment may follow) or --quiet: nothing shown, the result still kept
    for silenced in ("%gpuprofile --compare a b ;", "%gpuprofile --compare a b;  # later", "%gpuprofile -q --compare a b"):
        before = ip.user_ns["_gpuprofile_compare"]
        r = show(silenced)
        assert r.result.success, r.stdout
        assert r.bundles == [] and r.value is None, silenced
        assert ip.user_ns["_gpuprofile_compare"] is not before, silenced


def test_a_profiled_cell_shows_its_rows_wherever_it_shows(ip, show):
    # one choice of rows: --rows N holds for the report under the cell, for the result
    # shown again later (text and HTML alike), and for its to_text()/to_html()
    r = show("%%gpuprofile --rows 2\n" + MATMUL + "y = torch.ones(8).cumsum(0).sum()\n")
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    assert len(p.ops) > 2 and p.display_rows == 2
    (shown,) = r.reports("profile")
    assert shown == p._repr_mimebundle_()
    assert f"top 2 of {len(p.ops)}" in shown["text/html"] and f"top 2 of {len(p.ops)}" in shown["text/plain"]
    assert p.to_text() == shown["text/plain"] and p.to_html() == shown["text/html"]
    assert f"top 4 of {len(p.ops)}" in p.to_text(rows=4)  # an explicit count still wins


def test_load_returns_the_result_shown_once_with_its_rows(ip, show, two_runs):
    from gpumagic.profile.result import ProfileResult

    path = two_runs / "a.json.gz"
    r = show(f"%gpuprofile --load {path} --rows 2")
    assert r.result.success, r.stdout
    loaded = ip.user_ns["_gpuprofile"]
    assert isinstance(loaded, ProfileResult) and r.value is loaded
    assert loaded.source == str(path) and "aten::mm" in set(loaded.ops["name"])
    assert r.displayed == [] and r.reports("profile") == r.out and len(r.out) == 1
    assert len(loaded.ops) > 2
    assert f"top 2 of {len(loaded.ops)}" in r.out[0]["text/html"]  # --rows holds in Out[]
    assert loaded._repr_mimebundle_() == r.out[0]  # and whenever it shows again

    r = show(f"p = %gpuprofile --load {path}")
    assert r.result.success and r.bundles == []
    assert ip.user_ns["p"] is ip.user_ns["_gpuprofile"] and ip.user_ns["p"] is not loaded

    for silenced in (f"%gpuprofile --load {path} ;", f"%gpuprofile --load {path} -q"):
        before = ip.user_ns["_gpuprofile"]
        r = show(silenced)
        assert r.result.success, r.stdout
        assert r.bundles == [] and r.value is None, silenced
        assert ip.user_ns["_gpuprofile"] is not before, silenced
    r = show(f"kept = %gpuprofile --load {path} -q -o")
    assert r.result.success and r.bundles == [] and ip.user_ns["kept"] is ip.user_ns["_gpuprofile"]


def test_cell_magic_value_and_semicolon_unchanged(show):
    r = show("%%gpuprofile -q\n" + MATMUL + "x.shape[0]\n")
    assert r.value == 64 and [b["text/plain"] for b in r.out] == ["64"]
    r = show("%%gpuprofile -q\n" + MATMUL + "x.shape[0];\n")
    assert r.result.success and r.value is None and r.bundles == []


def test_line_forms_show_once_in_a_kernel(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    trace = tmp_path / "a.json.gz"
    cells = [
        "%load_ext gpumagic",
        f"%%gpuprofile -q -n a --trace {trace}\n" + MATMUL,
        "%%gpuprofile -q -n b\n" + MATMUL,
        "%gpuprofile --compare a b",
        "%gpuprofile --compare a b ;",
        f"%gpuprofile --load {trace}",
        f"p = %gpuprofile --load {trace}",
        "print(type(p).__name__)",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    compared, silenced, loaded, assigned, kept = (c.outputs for c in nb.cells[3:])
    for outputs, css in ((compared, "gpumagic-profile-compare"), (loaded, "gpumagic-profile")):
        assert [o.output_type for o in outputs] == ["execute_result"]
        assert f'<div class="gpumagic {css}">' in outputs[0]["data"]["text/html"]
    assert silenced == [] and assigned == []
    assert kept[0]["text"].strip() == "ProfileResult"


def test_schedule_that_never_records_says_why(ip, run):
    r = run("%%gpuprofile --wait 5 --active 1\nimport gpumagic\ngpumagic.step()\n")
    assert r.result.success
    assert "needs at least 6 gpumagic.step() calls" in r.bundles[0]["text/plain"]


def test_step_outside_a_profile_is_a_no_op():
    import gpumagic

    assert gpumagic.step() is None


@pytest.mark.parametrize(
    "line, expected",
    [
        ("%gpuprofile --compare nope nada", "no run named 'nope'"),
        ("%gpuprofile", "give --compare A B or --load PATH"),
        ("%gpuprofile --load /nonexistent/trace.json", "/nonexistent/trace.json"),
        ("%gpuprofile --rows 0 --load x", "--rows must be at least 1"),
        ("%%gpuprofile --bogus\nx = 1\n", "unrecognized arguments"),
        ("%%gpuprofile --load x\nx = 1\n", "line magics"),
    ],
)
def test_bad_input_is_a_usage_error(run, line, expected):
    from IPython.core.error import UsageError

    r = run(line)
    assert isinstance(r.result.error_in_exec, UsageError), r.stdout
    assert expected in str(r.result.error_in_exec)


def test_load_bad_trace_names_the_file(run, tmp_path):
    from IPython.core.error import UsageError

    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    r = run(f"%gpuprofile --load {bad}")
    assert isinstance(r.result.error_in_exec, UsageError)
    assert str(bad) in str(r.result.error_in_exec)


def test_options_expand_notebook_variables(ip, run):
    ip.user_ns["ACTIVE"] = 2
    r = run("%%gpuprofile -q --wait 0 --warmup 1 --active {ACTIVE}\nimport gpumagic\nfor i in range(4):\n    gpumagic.step()\n")
    assert r.result.success, r.stdout
    assert ip.user_ns["_gpuprofile"].summary.steps == 2
