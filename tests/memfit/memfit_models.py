"""Five model families defined in code for the ``%%memfit`` tests and benchmark: an MLP, a
CNN with batch norm, a transformer encoder with attention, an LSTM, a residual network; and
the training and inference cells run on them."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class ResNet(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 3, checkpointed: bool = False) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.Sequential(*(Residual(width) for _ in range(blocks)))
        self.head = nn.Linear(width, 10)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # checkpointed=True is what %%memfit --what-if checkpoint does to a stack of repeated
        # blocks (each block checkpointed), written out by hand: the tests measure it for real.
        run = (lambda m, h: checkpoint(m, h, use_reentrant=False)) if self.checkpointed else (lambda m, h: m(h))
        h = self.stem(x)
        for block in self.blocks:
            h = run(block, h)
        return self.head(h.mean((2, 3)))


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.lstm = nn.LSTM(64, 128, num_layers=2, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(x))
        return self.head(out[:, -1])


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        layer = nn.TransformerEncoderLayer(128, 4, 256, batch_first=True, dropout=0.1)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)).mean(1))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
    )


# name -> (model factory, the batch's expression, the labels' expression)
FAMILIES = {
    "mlp": (mlp, "torch.randn(B, 256)", "torch.randint(0, 10, (B,))"),
    "cnn_batchnorm": (cnn, "torch.randn(B, 3, 32, 32)", "torch.randint(0, 10, (B,))"),
    "transformer": (Encoder, "torch.randint(0, 1000, (B, 32))", "torch.randint(0, 10, (B,))"),
    "lstm": (LSTMNet, "torch.randint(0, 1000, (B, 20))", "torch.randint(0, 10, (B,))"),
    "resnet": (ResNet, "torch.randn(B, 3, 32, 32)", "torch.randint(0, 10, (B,))"),
}

TRAIN = """\
x = {x}
y = {y}
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad()
"""

INFER = """\
x = {x}
with torch.no_grad():
    out = model(x)
"""


def namespace(family: str, optimizer: str = "adam", batch: int = 32, seed: int = 0) -> dict[str, object]:
    torch.manual_seed(seed)
    make = FAMILIES[family][0]
    model = make()
    opt = (
        torch.optim.Adam(model.parameters(), lr=1e-3)
        if optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    )
    return {"torch": torch, "nn": nn, "model": model, "optimizer": opt, "B": batch}


def train_cell(family: str) -> str:
    _, x, y = FAMILIES[family]
    return TRAIN.format(x=x, y=y)


def infer_cell(family: str) -> str:
    return INFER.format(x=FAMILIES[family][1])
