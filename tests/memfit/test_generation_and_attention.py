"""``%%memfit`` on what large transformers do (issue 26, items 1 and 2), models built as
``transformers`` builds them from a config (nothing downloaded): ``model.generate`` runs to its
length limit in a dry run and is predicted as the real run measures it; attention is predicted
as the kernel CUDA would pick, not the CPU's, and that choice follows torch's rules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from real_run import measure, prepare_source  # noqa: E402

from gpumagic.memory.fit.attention import EFFICIENT, FLASH, MATH, Call, choose_kernel  # noqa: E402

GPT2 = """\
import torch, transformers
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=256,
                              bos_token_id=0, eos_token_id=1, attn_pdrop={dropout})
model = transformers.GPT2LMHeadModel(cfg)
"""

GENERATE = """\
out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
"""


pytestmark = pytest.mark.usefixtures("onednn_off")  # tests/memfit/conftest.py


def _setup(run, code: str) -> None:
    r = run(code)
    assert r.result.success, r.result.error_in_exec


def test_generate_runs_to_max_new_tokens_and_is_predicted_as_measured(ip, run):
    _setup(run, GPT2.format(dropout=0.0) + "model.eval()\nids = torch.randint(2, 1000, (4, 12))\n")
    # Before: every truth value after the third was False, the stopping test never fired
    # and the dry run ran into its time limit.
    r = run("%%memfit --memory 1GiB -q --timeout 60\n" + GENERATE)
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert fit.error == "", fit.error
    assert fit.seconds < 30
    assert "out" not in ip.user_ns  # a dry run leaves the namespace as it was
    real = measure(prepare_source(GENERATE), ip.user_ns)
    assert ip.user_ns["out"].shape == (4, 12 + 16)  # the real run generated to its limit too
    assert abs(fit.peak_bytes - real.peak_bytes) <= 0.05 * real.peak_bytes, (fit.peak_bytes, real.peak_bytes)
    notes = " ".join(fit.notes)
    assert "no sequence stops early" in notes and "EosTokenCriteria" in notes


def test_a_stopping_test_on_known_values_is_answered_exactly(ip, run):
    # A loop whose end follows from the code alone (no data): answered by the values the
    # dry run keeps beside the fake tensors, not by the three-True approximation.
    _setup(run, "import torch\nx = torch.zeros(8, 16)\n")
    cell = (
        "done = torch.zeros(8, dtype=torch.bool)\nsteps = 0\nkept = []\n"
        "while not done.all():\n"
        "    steps += 1\n"
        "    kept.append(x * steps)\n"
        "    done = done | torch.full((8,), steps >= 7)\n"
    )
    r = run("%%memfit --memory 1GiB -q --timeout 30\n" + cell)
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert fit.error == "", fit.error
    real = measure(prepare_source(cell), ip.user_ns, round_to=512)
    assert ip.user_ns["steps"] == 7
    assert fit.peak_bytes == real.peak_bytes
    assert not any("answered True" in n for n in fit.notes), fit.notes


def _training(run, ip, dropout: float, batch: int, seq: int) -> tuple[str, dict]:
    _setup(run, GPT2.format(dropout=dropout) + f"model.train()\nids = torch.randint(2, 1000, ({batch}, {seq}))\n")
    return "loss = model(ids, labels=ids).loss\nloss.backward()\n", ip.user_ns


def test_training_attention_with_dropout_is_predicted_as_cudas_fused_kernel(ip, run):
    cell, ns = _training(run, ip, dropout=0.1, batch=2, seq=256)
    r = run("%%memfit --gpu 'A100 80GB' -q\n" + cell)
    assert r.result.success, r.result.error_in_exec
    fit = ns["_memfit"]
    assert fit.error == "", fit.error
    notes = " ".join(fit.notes)
    assert "memory-efficient" in notes and "A100 80GB" in notes, notes  # float32: not flash
    # The CPU's math path keeps each layer's (B, H, L, L) weights and dropout mask ...
    math = measure(prepare_source(cell), ns).peak_bytes
    # ... the fused kernel keeps the output and a logsumexp, as the CPU's own fused kernel
    # does for the same model without attention dropout.
    cell, ns = _training(run, ip, dropout=0.0, batch=2, seq=256)
    fused = measure(prepare_source(cell), ns).peak_bytes
    assert math > 1.3 * fused, (math, fused)
    assert abs(fit.peak_bytes - fused) <= 0.05 * fused, (fit.peak_bytes, fused, math)


def _call(dtype=torch.float16, head=64, mask=None, dropout=0.0, causal=False, grad=True, lk=128) -> Call:
    q = torch.empty(2, 4, 128, head, dtype=dtype, device="meta")
    k = torch.empty(2, 4, lk, head, dtype=dtype, device="meta")
    return Call(q, k, k, mask, dropout, causal, False, grad)


@pytest.mark.parametrize(
    ("call", "sm", "kernel"),
    [
        (_call(), (8, 0), FLASH),
        (_call(dtype=torch.bfloat16, dropout=0.1), (9, 0), FLASH),
        (_call(dtype=torch.float32), (8, 0), EFFICIENT),  # flash takes half precision only
        (_call(mask=torch.empty(128, 128, device="meta")), (8, 0), EFFICIENT),  # flash takes no mask
        (_call(), (7, 5), EFFICIENT),  # a T4: no flash before sm80
        (_call(dtype=torch.bfloat16), (7, 5), MATH),  # nor memory-efficient bfloat16
        (_call(head=256, dropout=0.1), (8, 9), EFFICIENT),  # an L4 does not train that flash
        (_call(head=256, dropout=0.1), (8, 0), FLASH),  # an A100 does
        (_call(head=256, grad=False, dropout=0.1), (8, 9), FLASH),  # nor is it asked to in inference
        (_call(head=60), (8, 0), FLASH),  # padded to 64 by the composite
        (_call(head=60, dtype=torch.float32), (8, 0), EFFICIENT),  # float32 aligns head dims to 4
        (_call(head=62, dtype=torch.float32), (8, 0), MATH),
        (_call(causal=True, lk=64), (8, 0), EFFICIENT),  # flash's is_causal: as many keys as queries
    ],
)
def test_the_kernel_choice_follows_torchs_rules(call, sm, kernel):
    assert choose_kernel(call, sm)[0] == kernel


def test_switched_off_kernels_are_not_chosen():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        kernel, why = choose_kernel(_call(), (8, 0))
    assert kernel == EFFICIENT and "flash is switched off" in why


@pytest.mark.gpu
def test_the_choice_is_the_one_cuda_makes_on_this_gpu():
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    sm = torch.cuda.get_device_capability()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for head in (60, 64, 128, 256):
            for masked in (False, True):
                for dropout in (0.0, 0.1):
                    q = torch.randn(2, 4, 128, head, dtype=dtype, device="cuda", requires_grad=True)
                    mask = torch.zeros(128, 128, dtype=dtype, device="cuda") if masked else None
                    params = SDPAParams(q, q, q, mask, dropout, False, False)
                    call = Call(q, q, q, mask, dropout, False, False, True)
                    ours = choose_kernel(call, sm)[0]
                    theirs = (
                        FLASH
                        if can_use_flash_attention(params, False)
                        else EFFICIENT
                        if can_use_efficient_attention(params, False)
                        else MATH
                    )
                    assert ours == theirs, (dtype, head, masked, dropout)
