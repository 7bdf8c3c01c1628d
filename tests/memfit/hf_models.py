"""Small transformers as their libraries build them, from configs in code (nothing downloaded),
as the setup cells of ``%%memfit`` tests: the same architecture code as the large ones, at a
size the CPU trains in a second."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

SETUPS = {
    "gpt2": """\
import torch, transformers
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=128))
""",
    "bert": """\
import torch, transformers
torch.manual_seed(0)
model = transformers.BertForMaskedLM(transformers.BertConfig(
    num_hidden_layers=4, hidden_size=128, num_attention_heads=4, intermediate_size=512, vocab_size=1000))
""",
    "llama": """\
import torch, transformers
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=344, vocab_size=1000, max_position_embeddings=256))
""",
}

DATA = """\
model.train()
ids = torch.randint(0, 1000, ({batch}, {seq}))
"""

STEP = """\
loss = model(ids, labels=ids).loss
loss.backward()
optimizer.step()
optimizer.zero_grad()
"""


def setup(kind: str, batch: int = 8, seq: int = 128, optimizer: str = "AdamW", before: str = "") -> str:
    """The setup cell: the model, ``before`` (code run on it: checkpointing, adapters), the
    optimizer over its trainable parameters, and a batch of ids."""
    return (
        SETUPS[kind]
        + before
        + f"optimizer = torch.optim.{optimizer}([p for p in model.parameters() if p.requires_grad], lr=1e-4)\n"
        + DATA.format(batch=batch, seq=seq)
    )


@contextlib.contextmanager
def math_attention() -> Iterator[None]:
    """Only torch's math attention: the CPU's choice for training with dropout, and the one a
    dry run then models for CUDA too, so that the prediction and the real CPU run are of the
    same kernel (``test_generation_and_attention.py`` checks the CUDA kernels' own)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


def fresh(code: str) -> dict:
    """A namespace of its own with ``code`` run in it: a real run to measure beside the shell's."""
    ns: dict = {"torch": torch}
    exec(compile(code, "<setup>", "exec"), ns)
    return ns
