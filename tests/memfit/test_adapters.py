"""Adapters and frozen weights (issue 26, item 5): a LoRA cell, by hand and with ``peft``, is
predicted as the real step measures it, and ``--what-if lora:RANK`` on a model that trains
everything predicts what peft's adapters of that rank would need."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from hf_models import STEP, fresh, math_attention, setup  # noqa: E402
from real_run import measure, prepare_source  # noqa: E402

PEFT = "import peft\nmodel = peft.get_peft_model(model, peft.LoraConfig(r={rank}, target_modules='all-linear'))\n"


@pytest.fixture(autouse=True)
def _kernels():
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    with math_attention():
        yield
    torch._C._set_mkldnn_enabled(was)


def _memfit(ip, run, setup_code: str, line: str, cell: str = STEP):
    r = run(setup_code)
    assert r.result.success, r.result.error_in_exec
    r = run(f"%%memfit --memory 4GiB -q {line}\n" + cell)
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert fit.error == "", fit.error
    return fit


BY_HAND = """\
import torch
from torch import nn
torch.manual_seed(0)

class LoRALinear(nn.Module):
    def __init__(self, base, rank=4):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.a.T @ self.b.T

model = nn.Sequential(*(nn.Sequential(LoRALinear(nn.Linear(512, 512)), nn.GELU()) for _ in range(4)), nn.Linear(512, 10))
model[-1].requires_grad_(False)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
x = torch.randn(64, 512)
y = torch.randint(0, 10, (64,))
model(x).sum().backward()
optimizer.step()
optimizer.zero_grad()
"""

HAND_STEP = """\
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad()
"""


def test_lora_by_hand_is_predicted_as_measured_with_state_for_the_adapters_only(ip, run):
    fit = _memfit(ip, run, BY_HAND, "", HAND_STEP)
    real = measure(prepare_source(HAND_STEP), fresh(BY_HAND))
    assert abs(fit.peak_bytes - real.peak_bytes) <= 0.05 * real.peak_bytes, (fit.peak_bytes, real.peak_bytes)
    adapters = 4 * (2 * 4 * 512)
    # AdamW's two moments per adapter element, and a step count per adapter: none for the frozen base
    assert real.categories["optimizer_state"] == 2 * 4 * adapters + 4 * 8
    rounded = measure(prepare_source(HAND_STEP), fresh(BY_HAND), round_to=512)  # as CUDA's blocks
    assert fit.categories["optimizer_state"] == rounded.categories["optimizer_state"]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_peft_model_is_predicted_as_measured(ip, run, kind):
    fit = _memfit(ip, run, setup(kind, before=PEFT.format(rank=8)), "")
    real = measure(prepare_source(STEP), fresh(setup(kind, before=PEFT.format(rank=8))))
    assert abs(fit.peak_bytes - real.peak_bytes) <= 0.05 * real.peak_bytes, (fit.peak_bytes, real.peak_bytes)


@pytest.mark.parametrize(("kind", "rank"), [("gpt2", 8), ("llama", 16)])
def test_lora_what_if_predicts_what_peft_adapters_of_that_rank_need(ip, run, kind, rank):
    fit = _memfit(ip, run, setup(kind), f"--what-if lora:{rank}")
    row = fit.what_if.set_index("fix").loc[f"lora:{rank}"]
    assert row["peak_bytes"] is not None, row["changed"]
    ns = fresh(setup(kind, before=PEFT.format(rank=rank)))
    trainable, _ = ns["model"].get_nb_trainable_parameters()
    said = re.search(r"\(([\d,]+) trainable parameters", row["changed"])
    assert said is not None and int(said.group(1).replace(",", "")) == trainable, row["changed"]
    real = measure(prepare_source(STEP), ns)
    assert abs(row["peak_bytes"] - real.peak_bytes) <= 0.05 * real.peak_bytes, (row["peak_bytes"], real.peak_bytes)


@pytest.mark.parametrize("fix", ["lora:0", "lora:x", "lora"])
def test_a_lora_what_if_without_a_rank_is_a_usage_error(ip, run, fix):
    r = run("import torch\nx = torch.ones(2)\n")
    r = run(f"%%memfit --memory 1GiB --what-if {fix}\ny = x * 2\n")
    assert not r.result.success
    assert "lora:RANK" in str(r.result.error_in_exec)
