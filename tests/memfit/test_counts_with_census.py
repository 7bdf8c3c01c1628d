"""``%%memfit`` counts with issue 16's tensor census, the engine ``%%memtrace`` reports with:
the measured exact peak a prediction is checked against is ``%%memtrace``'s own, the fake
run's rows by module and category are the real run's, a trainer's model is counted as if
named, and without a GPU only the tensors a GPU run would hold on CUDA count."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memfit_models import namespace, train_cell  # noqa: E402
from real_run import measure, prepare_source  # noqa: E402

from gpumagic.memory.census.categories import KEYS, NAMES  # noqa: E402
from gpumagic.memory.fit.dry_run import ALL, dry_run  # noqa: E402

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")


pytestmark = pytest.mark.usefixtures("onednn_off")  # tests/memfit/conftest.py


@pytest.mark.parametrize("family", ["cnn_batchnorm", "transformer"])
def test_the_measured_peak_is_what_memtrace_reports(ip, run, family):
    cell = train_cell(family)
    ip.user_ns.update(namespace(family, "adam"))
    r = run("%%memtrace -q\n" + cell)
    assert r.result.success, r.result.error_in_exec
    trace = ip.user_ns["_memtrace"]
    measured = measure(prepare_source(cell), namespace(family, "adam"))
    # what the cell added at its peak, over what it was given (the shell's namespace holds
    # more than the cell's, its output history for one)
    assert measured.peak_bytes - measured.start_bytes == trace.cell_peak - trace.initial
    peak = trace.at_peak
    assert peak is not None
    assert peak.source == prepare_source(cell).statements[measured.peak_statement].source
    for key, name in zip(KEYS, NAMES):
        if key in ("parameters", "gradients", "optimizer_state", "activations"):
            assert measured.categories[key] == peak.categories[name], key


def test_the_dry_runs_rows_by_module_are_the_real_runs():
    cell = "x = torch.randn(B, 3, 32, 32)\nloss = model(x).sum()\n"
    fake = dry_run(prepare_source(cell), namespace("resnet"), round_to=1).accounting
    real = measure(prepare_source(cell), namespace("resnet"))
    assert fake.modules == real.modules and fake.peak_bytes == real.peak_bytes
    rows = {(m, c): b for m, c, b in fake.modules}
    model = namespace("resnet")["model"]
    stem = sum(p.numel() * 4 for p in model.stem.parameters())
    assert rows[("model.stem", "parameters")] == stem
    # the stem's output, kept for backward by the first block's convolution
    assert rows[("model.stem", "activations")] == 32 * 16 * 32 * 32 * 4
    assert sum(b for (_, c), b in rows.items() if c == "activations") == fake.categories["activations"]


def test_a_model_held_by_an_object_is_counted_as_if_named():
    class Trainer:
        def __init__(self, ns: dict) -> None:
            self.model, self.optimizer = ns["model"], ns["optimizer"]

    cell = train_cell("mlp")
    named = dry_run(prepare_source(cell), namespace("mlp")).accounting
    held = namespace("mlp")
    held["trainer"] = Trainer(held)
    held["batches"] = [torch.randn(8, 256) for _ in range(100)]  # more than the census's scan reads
    for name in ("model", "optimizer"):
        del held[name]
    cell = cell.replace("model(", "trainer.model(").replace("optimizer.", "trainer.optimizer.")
    cell = "batches\n" + cell
    got = dry_run(prepare_source(cell), held).accounting
    given = 100 * 8 * 256 * 4
    assert got.peak_bytes == named.peak_bytes + given
    assert got.categories == {**named.categories, "inputs": named.categories["inputs"] + given}
    assert {m for m, _, _ in got.modules} >= {"trainer.model.0", "trainer.model.2", "trainer.model.4"}


CUDA_MODEL = """\
class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(256, 256)

    def forward(self, x):
        mask = torch.ones(x.shape[0], 256, device=x.device)  # the device read off x: the fake's CPU
        return self.lin(x * mask)
"""


@no_gpu
def test_without_a_gpu_only_what_a_gpu_run_puts_on_cuda_counts():
    ns = {"torch": torch, "nn": torch.nn}
    exec(CUDA_MODEL, ns)
    torch.manual_seed(0)
    ns["model"] = ns["Masked"]()
    ns["optimizer"] = torch.optim.Adam(ns["model"].parameters())
    step = (
        "x = torch.randn(64, 256, device=device)\n"
        "loss = model(x).sum()\n"
        "loss.backward()\n"
        "optimizer.step()\n"
        "kept = loss.detach().cpu()\n"
    )
    on_cuda = dry_run(prepare_source("model.to('cuda')\ndevice = 'cuda'\n" + step), ns)
    anywhere = dry_run(prepare_source("device = 'cpu'\n" + step), ns)
    assert on_cuda.error is None and anywhere.error is None
    assert (on_cuda.counted, anywhere.counted) == ("cuda", ALL)
    cuda, host = on_cuda.accounting, anywhere.accounting
    weight, bias = 256 * 256 * 4, 1024  # each a multiple of CUDA's 512-byte blocks
    assert cuda.categories["parameters"] == host.categories["parameters"] == weight + bias
    # Adam's step counts stay on the host in a GPU run: only their moments count
    assert cuda.categories["optimizer_state"] == 2 * (weight + bias)
    assert host.categories["optimizer_state"] == 2 * (weight + bias) + 2 * 512
    # the mask made with x's device is counted on CUDA once it meets CUDA tensors
    assert on_cuda.relabelled >= 1
    assert cuda.peak_bytes == host.peak_bytes - 2 * 512
    assert "No GPU here" in " ".join(_notes(on_cuda)) and "No tensor of the cell goes to CUDA" in " ".join(_notes(anywhere))


def _notes(run) -> list[str]:
    from gpumagic.memory.fit.notes import dry_run_notes

    return dry_run_notes(run, prepare_source("x = 1\n"))
