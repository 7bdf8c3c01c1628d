"""A dry run's prediction against the same cell run for real, on the CPU: five model families,
training with Adam and with SGD, and inference under ``torch.no_grad()``.

The measured peak is issue 16's tensor census of the real run (``real_run.py`` beside: the
engine ``%%memtrace`` reports with, exact bytes on the CPU; ``test_counts_with_census.py`` checks it against
``%%memtrace``'s own peak), the same engine the dry run counts with. The real runs are made
with oneDNN off, as the dry run without a GPU is: oneDNN's LSTM keeps a workspace torch's
fake kernel leaves out, and a GPU never runs it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memfit_models import FAMILIES, infer_cell, namespace, train_cell  # noqa: E402
from real_run import measure, prepare_source  # noqa: E402

from gpumagic.memory.fit.api import memfit  # noqa: E402
from gpumagic.memory.fit.dry_run import dry_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("onednn_off")  # tests/memfit/conftest.py


@pytest.fixture(autouse=True)
def _math_attention():
    # The transformer trains with dropout: the CPU runs attention's math path, and a dry run
    # without a GPU models CUDA's fused kernel instead (test_attention_kernels.py checks that
    # one). With only the math kernel switched on, both run the same attention here.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


def _check(cell: str, ns: dict) -> tuple[int, int, int]:
    exact = dry_run(prepare_source(cell), ns, round_to=1)
    assert exact.error is None, exact.error
    predicted = memfit(cell, ns)  # what %%memfit reports: CUDA's 512-byte blocks included
    assert predicted.error == "", predicted.error
    real = measure(prepare_source(cell), ns)
    return exact.accounting.peak_bytes, predicted.peak_bytes, real.peak_bytes


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_step_predicted_within_5_percent_of_the_measured_peak(family, optimizer):
    exact, predicted, real = _check(train_cell(family), namespace(family, optimizer))
    assert abs(predicted - real) <= 0.05 * real, (predicted, real)
    # Without the rounding the fake run counts the real run's bytes exactly.
    assert exact == real


@pytest.mark.parametrize("family", list(FAMILIES))
def test_inference_under_no_grad_predicted_within_5_percent(family):
    exact, predicted, real = _check(infer_cell(family), namespace(family))
    assert abs(predicted - real) <= 0.05 * real, (predicted, real)
    assert exact == real


def test_categories_at_the_peak_are_the_real_runs():
    ns = namespace("mlp", "adam", batch=8)
    cell = train_cell("mlp")
    fake = dry_run(prepare_source(cell), ns, round_to=1).accounting
    real = measure(prepare_source(cell), ns)
    assert fake.categories == real.categories
    assert fake.peak_statement == real.peak_statement == 4  # optimizer.step(): Adam's state appears
    params = sum(p.numel() * 4 for p in ns["model"].parameters())
    assert fake.categories["parameters"] == params
    assert fake.categories["gradients"] == params
    # Adam's two moments per parameter, and its step counts (one float each)
    assert fake.categories["optimizer_state"] == 2 * params + 4 * len(list(ns["model"].parameters()))
