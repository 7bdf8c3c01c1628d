"""``Module.to(...)`` inside a ``%%memfit`` cell, in each of its forms: ``nn.Module._apply``
calls ``t.to(device, dtype, non_blocking)`` with ``None`` in the slot not given (and in the
dtype slot for integer buffers), which must not shift ``non_blocking`` into ``copy``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("to", "dtype"),
    [
        ("torch.bfloat16", "torch.bfloat16"),  # a dtype alone: Module._apply's device slot empty
        ("'cuda', torch.bfloat16", "torch.bfloat16"),
        ("'cuda'", "torch.float32"),
        ("dtype=torch.float16", "torch.float16"),
    ],
)
def test_module_to_in_a_dry_run_counts_the_converted_weights(ip, run, to, dtype):
    device = "'cuda'" if "cuda" in to else "'cpu'"
    cell = (
        "%%memfit -q --memory 8GiB\n"
        # BatchNorm's num_batches_tracked is an integer buffer: its dtype slot stays empty
        f"net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64)).to({to})\n"
        f"y = net(torch.ones(8, 64, device={device}, dtype={dtype}))\n"
    )
    ip.user_ns["torch"] = torch
    r = run(cell)
    assert r.result.error_in_exec is None, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert fit.error == "", fit.error
    size = torch.tensor([], dtype=eval(dtype)).element_size()
    weights = (64 * 64 + 64 + 2 * 64) * size  # linear weight and bias, batch norm's affine
    assert fit.categories["parameters"] >= weights
    assert "y" not in ip.user_ns and "net" not in ip.user_ns  # a dry run: nothing set
    assert not any("answered" in n for n in fit.notes)
