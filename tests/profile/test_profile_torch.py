"""A real torch.profiler run on the CPU, analysed the way %%gpuprofile analyses a cell."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule  # noqa: E402

from gpumagic.profile.load import from_profiler, load_trace  # noqa: E402


def _train(prof_kwargs: dict, batches: int = 4, mark_steps: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(
        torch.randn(8 * batches, 32), torch.randint(0, 4, (8 * batches,))
    )
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, **prof_kwargs) as prof:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            if mark_steps:
                prof.step()
    return prof


def test_profiler_steps_from_a_scheduled_run(tmp_path):
    # with a schedule torch records ProfilerStep#N spans, one per prof.step()
    prof = _train({"schedule": schedule(wait=0, warmup=1, active=10)})
    r = from_profiler(prof, keep=tmp_path / "run.json.gz")
    s = r.summary
    assert s.steps_from == "ProfilerStep"
    assert s.steps == 4  # warmup step 0 is not recorded; 1-3 and the loop's exit
    assert s.cpu_only is True
    assert (tmp_path / "run.json.gz").stat().st_size > 0
    ops = r.ops.set_index("name")
    assert ops.loc["aten::addmm", "calls"] == 6  # 2 linear layers x 3 recorded training steps
    assert (ops["device_total_us"] == 0).all()
    by_shape = r.ops_by_shape
    assert (by_shape.loc[by_shape["name"] == "aten::addmm", "input_shapes"] != "").all()
    # zero_grad(set_to_none=False) zeroes 4 gradients inside Optimizer.zero_grad
    z = {f.rule: f for f in r.findings}["zero_grad"]
    assert z.evidence["zero_calls_per_step"] == pytest.approx(4 * 3 / 4)


def test_without_a_schedule_dataloader_batches_are_the_steps():
    r = from_profiler(_train({}, mark_steps=False))
    assert r.source == "torch.profiler"
    assert r.summary.steps_from == "DataLoader"
    assert r.summary.steps == 5  # 4 batches and the __next__ that ends the loop
    assert r.breakdown["percent"].sum() == pytest.approx(100.0)


def test_a_cell_without_step_calls_can_ignore_its_one_step_mark(tmp_path):
    # "record everything" writes one ProfilerStep#0 over the whole cell when step() is
    # never called; the recorder then asks the analysis to ignore it
    prof = _train({"schedule": lambda step: ProfilerAction.RECORD}, mark_steps=False)
    marked = from_profiler(prof, keep=tmp_path / "cell.json")
    assert marked.summary.steps_from == "ProfilerStep" and marked.summary.steps == 1
    r = load_trace(tmp_path / "cell.json", step_marks=False)
    assert r.summary.steps_from == "DataLoader"
    assert r.summary.steps == 5
