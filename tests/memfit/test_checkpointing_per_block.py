"""Activation checkpointing per repeated block (issue 26, item 3): a model's own
``gradient_checkpointing_enable()`` and ``torch.utils.checkpoint`` per layer are predicted as
the real step measures them, and ``--what-if checkpoint`` checkpoints each layer of the stack,
as people do, not the model's body as one segment."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import STEP, fresh, math_attention, setup  # noqa: E402
from real_run import measure, prepare_source  # noqa: E402

# HF's own switch, by the name transformers 5 gives it (the old one warns)
OWN = "model.activation_checkpointing_enable(activation_checkpointing_kwargs={'use_reentrant': False})\n"


@pytest.fixture(autouse=True)
def _kernels():
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    with math_attention():
        yield
    torch._C._set_mkldnn_enabled(was)


def _memfit(ip, run, setup_code: str, line: str):
    r = run(setup_code)
    assert r.result.success, r.result.error_in_exec
    r = run(f"%%memfit --memory 4GiB -q {line}\n" + STEP)
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert fit.error == "", fit.error
    return fit


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_checkpoint_what_if_saves_what_the_models_own_per_layer_checkpointing_saves(ip, run, kind):
    fit = _memfit(ip, run, setup(kind), "--what-if checkpoint")
    row = fit.what_if.set_index("fix").loc["checkpoint"]
    assert "per layer" in row["changed"], row["changed"]
    plain = measure(prepare_source(STEP), fresh(setup(kind))).peak_bytes
    checkpointed = measure(prepare_source(STEP), fresh(setup(kind, before=OWN))).peak_bytes
    measured = plain - checkpointed
    assert measured > 0.3 * plain  # per layer saves much (one segment saved 0.001 MiB on BERT)
    assert abs(row["saving_bytes"] - measured) <= 0.10 * measured, (row["saving_bytes"], measured)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_model_checkpointed_per_layer_is_predicted_as_measured(ip, run, kind):
    fit = _memfit(ip, run, setup(kind, before=OWN), "")
    real = measure(prepare_source(STEP), fresh(setup(kind, before=OWN))).peak_bytes
    assert abs(fit.peak_bytes - real) <= 0.05 * real, (fit.peak_bytes, real)


LAYERS = """\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(256)
        self.up = nn.Linear(256, 1024)
        self.down = nn.Linear(1024, 256)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

class Net(nn.Module):
    def __init__(self, checkpointed=False):
        super().__init__()
        self.embed = nn.Embedding(1000, 256)
        self.body = nn.Module()
        self.body.layers = nn.ModuleList(Block() for _ in range(6))
        self.head = nn.Linear(256, 1000)
        self.checkpointed = checkpointed

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.body.layers:
            h = checkpoint(layer, h, use_reentrant=False) if self.checkpointed else layer(h)
        return self.head(h)

torch.manual_seed(0)
model = Net({checkpointed})
optimizer = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 1000, (16, 128))
"""

PLAIN_STEP = """\
loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
loss.backward()
optimizer.step()
optimizer.zero_grad()
"""


def test_checkpoint_what_if_checkpoints_each_layer_of_a_nested_stack(ip, run):
    r = run(LAYERS.replace("{checkpointed}", "False"))
    assert r.result.success, r.result.error_in_exec
    r = run("%%memfit --memory 4GiB -q --what-if checkpoint\n" + PLAIN_STEP)
    fit = ip.user_ns["_memfit"]
    row = fit.what_if.set_index("fix").loc["checkpoint"]
    assert "model.body.layers.0" in row["changed"] and "model.body.layers.5" in row["changed"], row["changed"]
    plain = measure(prepare_source(PLAIN_STEP), fresh(LAYERS.replace("{checkpointed}", "False"))).peak_bytes
    by_hand = fresh(LAYERS.replace("{checkpointed}", "True"))
    # the same per-layer checkpointing, written by hand, predicted and measured
    r = run(LAYERS.replace("{checkpointed}", "True"))
    r = run("%%memfit --memory 4GiB -q\n" + PLAIN_STEP)
    predicted = ip.user_ns["_memfit"].peak_bytes
    checkpointed = measure(prepare_source(PLAIN_STEP), by_hand).peak_bytes
    assert abs(predicted - checkpointed) <= 0.05 * checkpointed, (predicted, checkpointed)
    measured = plain - checkpointed
    assert abs(row["saving_bytes"] - measured) <= 0.10 * measured, (row["saving_bytes"], measured)
