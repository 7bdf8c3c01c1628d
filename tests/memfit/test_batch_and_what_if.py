"""``%%memfit``'s batch fit against a plain bisection by dry runs, and each what-if's
predicted saving against the saving measured by running the changed cell for real."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memfit_models import ResNet, namespace, train_cell  # noqa: E402
from real_run import measure, prepare_source  # noqa: E402

from gpumagic.memory.fit.api import memfit  # noqa: E402
from gpumagic.memory.fit.dry_run import dry_run  # noqa: E402
from gpumagic.memory.fit.headroom import FRAGMENTATION  # noqa: E402

MiB = 2**20


pytestmark = pytest.mark.usefixtures("onednn_off")  # tests/memfit/conftest.py


def _bisect_largest(fits, hi: int) -> int:
    """The largest v in [0, hi) with fits(v), by plain bisection (fits(hi) is False)."""
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize(("family", "memory"), [("mlp", "1.2GiB"), ("cnn_batchnorm", "2.1GiB")])
def test_largest_batch_equals_a_bisection_by_dry_runs(family, memory):
    ns = namespace(family, "adam")
    cell = train_cell(family)
    fit = memfit(cell, ns, memory=memory, batch=("B", [8, 16, 32]))
    assert fit.max_batch is not None and fit.max_batch > 32, fit.batches
    # The same criterion, searched by halving: the dry run's peak plus the headroom's top,
    # fragmentation taken as the same share of the peak as in the cell's own run.
    fixed = sum(line.high for line in fit.headroom if line.what != FRAGMENTATION)
    ratio = sum(line.high for line in fit.headroom if line.what == FRAGMENTATION) / fit.peak_bytes
    budget = fit.target.capacity
    prepared = prepare_source(cell)
    runs = []

    def fits(v: int) -> bool:
        if v == 0:
            return True
        peak = dry_run(prepared, ns, overrides={"B": v}).accounting.peak_bytes
        runs.append(v)
        return peak + int(peak * ratio) + fixed <= budget

    hi = 64
    while fits(hi):
        hi *= 2
    assert _bisect_largest(fits, hi) == fit.max_batch
    # The fit's line got there in far fewer dry runs than the bisection
    assert len(fit.batches) - 3 < len(runs)


def _saving(base_ns, changed_ns, base_cell, changed_cell=None, autocast=None) -> int:
    base = measure(prepare_source(base_cell), base_ns).peak_bytes
    changed = measure(prepare_source(changed_cell or base_cell), changed_ns, autocast=autocast).peak_bytes
    return base - changed


def _predicted(fit, fix: str) -> int:
    row = fit.what_if.set_index("fix").loc[fix]
    assert row["saving_bytes"] is not None, row["changed"]
    return int(row["saving_bytes"])


def _within_10_percent(predicted: int, measured: int) -> None:
    assert measured > 0, "the fix saves nothing here: the test would not test it"
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)


def test_mixed_precision_saving_matches_the_measured_one():
    cell = train_cell("resnet")
    fit = memfit(cell, namespace("resnet"), what_if="amp")
    _within_10_percent(_predicted(fit, "amp"), _saving(namespace("resnet"), namespace("resnet"), cell, autocast=torch.float16))


def test_checkpointing_saving_matches_a_hand_checkpointed_model():
    cell = train_cell("resnet")
    fit = memfit(cell, namespace("resnet"), what_if="checkpoint")
    assert "checkpointed model.blocks.0, model.blocks.1, model.blocks.2 " in fit.what_if.set_index("fix").loc["checkpoint", "changed"]
    checkpointed = namespace("resnet")
    torch.manual_seed(0)
    checkpointed["model"] = ResNet(checkpointed=True)
    checkpointed["optimizer"] = torch.optim.Adam(checkpointed["model"].parameters(), lr=1e-3)
    _within_10_percent(_predicted(fit, "checkpoint"), _saving(namespace("resnet"), checkpointed, cell))


@pytest.mark.parametrize("fix", ["sgd", "adafactor"])
def test_an_optimizer_with_less_state_saves_what_it_measures(fix):
    # A wide MLP at batch 4: the peak is Adam's first step, where its state appears.
    cell = train_cell("mlp")
    fit = memfit(cell, namespace("mlp", batch=4), what_if=fix)
    other = namespace("mlp", batch=4)
    params = other["model"].parameters()
    other["optimizer"] = (
        torch.optim.SGD(params, lr=1e-3, momentum=0.9) if fix == "sgd" else torch.optim.Adafactor(params, lr=1e-3)
    )
    _within_10_percent(_predicted(fit, fix), _saving(namespace("mlp", batch=4), other, cell))


def test_an_optimizer_swapped_in_the_steady_state_is_given_its_own_state():
    # After a step Adam holds two tensors per parameter; SGD with momentum would hold one.
    # The saving of the swap is one set, not all of Adam's state; at batch 4096 the peak is in
    # the forward/backward, before the step, where a fresh SGD would have made no momentum yet.
    cell = train_cell("mlp")

    def after_a_step(kind: str) -> dict:
        ns = namespace("mlp", batch=4096)
        if kind == "sgd":
            ns["optimizer"] = torch.optim.SGD(ns["model"].parameters(), lr=1e-3, momentum=0.9)
        measure(prepare_source(cell), ns)  # one real step: the optimizer holds its state
        return ns

    fit = memfit(cell, after_a_step("adam"), what_if="sgd")
    assert "state as after a step" in fit.what_if.set_index("fix").loc["sgd", "changed"]
    _within_10_percent(_predicted(fit, "sgd"), _saving(after_a_step("adam"), after_a_step("sgd"), cell))


def test_set_to_none_saving_matches_the_measured_one():
    # Gradients left allocated (zeroed) by the last step stay through the next forward unless
    # zero_grad sets them to None: at batch 4096 the forward/backward is the peak.
    cell = "optimizer.zero_grad(set_to_none=False)\n" + train_cell("mlp").replace("optimizer.zero_grad()\n", "")

    def warmed() -> dict:
        ns = namespace("mlp", batch=4096)
        measure(prepare_source(cell), ns)
        ns["optimizer"].zero_grad(set_to_none=False)
        return ns

    fit = memfit(cell, warmed(), what_if="set_to_none")
    assert fit.what_if.set_index("fix").loc["set_to_none", "changed"] == (
        "model.zero_grad(set_to_none=True); optimizer.zero_grad(set_to_none=True)"
    )
    fixed = cell.replace("set_to_none=False", "set_to_none=True")
    measured = measure(prepare_source(cell), warmed()).peak_bytes - measure(prepare_source(fixed), warmed()).peak_bytes
    _within_10_percent(_predicted(fit, "set_to_none"), measured)


def test_smaller_batch_saving_matches_the_measured_one():
    cell = train_cell("cnn_batchnorm")
    fit = memfit(cell, namespace("cnn_batchnorm", batch=64), batch=None, what_if="batch")
    assert fit.what_if.set_index("fix").loc["batch", "changed"] == "B = 32 (was 64)"
    _within_10_percent(
        _predicted(fit, "batch"),
        _saving(namespace("cnn_batchnorm", batch=64), namespace("cnn_batchnorm", batch=32), cell),
    )


def test_each_what_if_says_what_it_changed_and_what_it_saved_by_category():
    fit = memfit(train_cell("resnet"), namespace("resnet"), what_if="all")
    table = fit.what_if
    assert list(table["fix"]) == ["amp", "checkpoint", "sgd", "adafactor", "set_to_none", "batch"]
    amp = table.set_index("fix").loc["amp"]
    assert amp["changed"] == "the cell under torch.autocast(dtype=float16)"
    by_category = sum(amp[f"{c}_saving"] for c in fit.categories)
    assert by_category == amp["saving_bytes"]
    assert "Adam replaced by SGD(momentum=0.9)" in table.set_index("fix").loc["sgd", "changed"]
