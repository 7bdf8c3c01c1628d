"""The models the sharding checks run, each with its training step: an MLP stack (a
``ModuleList`` of residual blocks, as a transformer's body is) and a GPT-2 built from a
``transformers`` config (no download), both trained with AdamW."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class MLPStack(nn.Module):
    def __init__(self, d: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(64, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=2000, n_positions=128)
    return GPT2LMHeadModel(config)


MLP_STEP = """\
x = torch.randn(256, 64)
y = torch.randint(0, 10, (256,))
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad()
"""

GPT2_STEP = """\
ids = torch.randint(0, 2000, (8, 128))
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
optimizer.step()
optimizer.zero_grad()
"""

# name -> (model factory, the training step: `model` and `optimizer` are the namespace's)
MODELS = {"mlp": (MLPStack, MLP_STEP), "gpt2": (gpt2, GPT2_STEP)}


def stepped(model: str, **kw: object) -> tuple[dict[str, object], str]:
    """A namespace with the model and AdamW after one real step (the optimizer's state
    exists, as in every step after the first), and the step's source."""
    make, step = MODELS[model]
    torch.manual_seed(0)
    net = make(**kw)
    ns: dict[str, object] = {"torch": torch, "model": net, "optimizer": torch.optim.AdamW(net.parameters(), lr=1e-3)}
    exec(compile(step, "<step>", "exec"), ns)
    return ns, step
