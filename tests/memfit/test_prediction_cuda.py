"""``%%memfit`` on a GPU: the dry run (fake CUDA tensors, where CUDA is there) against the
real step's ``torch.cuda.max_memory_allocated()``, within 10%. Part of the GPU check
(``pytest -m gpu``; ``tools/gpu_cells.py`` checks the same on a ResNet-18)."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

SETUP = """\
import torch
from memfit_models import ResNet
torch.manual_seed(0)
model = ResNet(width=64, blocks=4).cuda()
optimizer = torch.optim.Adam(model.parameters())
B = 64
x = torch.randn(B, 3, 64, 64, device="cuda")
torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (B,), device="cuda")).backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
del x
torch.cuda.synchronize()
"""

STEP = """\
x = torch.randn(B, 3, 64, 64, device="cuda")
y = torch.randint(0, 10, (B,), device="cuda")
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
"""


def _given(model, optimizer) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.is_cuda}
    return sum(-(-n // 512) * 512 for n in storages.values())


def test_prediction_within_10_percent_of_max_memory_allocated(ip, run):
    assert run(SETUP).result.success
    r = run("%%memfit -q\n" + STEP)
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert fit.on_gpu and fit.target is not None and "this GPU" in fit.target.name
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    given = _given(ip.user_ns["model"], ip.user_ns["optimizer"])
    torch.cuda.reset_peak_memory_stats()
    assert run(STEP).result.success
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - (before - given)
    assert abs(fit.peak_bytes - measured) <= 0.10 * measured, (fit.peak_bytes, measured)
    assert fit.fits is True
