"""Attention as CUDA would run it, in a dry run on a machine without a GPU.

``torch.nn.functional.scaled_dot_product_attention`` picks its kernel at run time, by device:
on the CPU, any dropout sends it to the math path, which materialises the L×L attention
weights and keeps them (and the dropout mask) for backward; on CUDA the flash and
memory-efficient kernels handle dropout and keep only the output, a logsumexp per query and
the random number generator's state. A dry run on the CPU that let the CPU choose would
predict GPT-2's training step at sequence 1024 with 544 MiB where the fused kernel holds
40 MiB (issue 26, item 2). :class:`CudaAttention` makes CUDA's choice for the target card
and calls that kernel's own operator, whose fake (meta) implementation gives its outputs and
whose autograd formula what it saves for backward.

The choice, :func:`choose_kernel`, follows torch 2.13's rules (``select_sdp_backend`` in
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` and the checks of
``sdp_utils_cpp.h``), in their priority order (``torch._C._get_sdp_priority_order()``),
honouring the switches a cell may set (``torch.backends.cuda.enable_flash_sdp``,
``torch.nn.attention.sdpa_kernel``):

* flash: float16/bfloat16, sm80 to sm121, no attention mask, the same head dim for q, k and
  v and at most 256 (training with a head dim in (192, 224], or in (224, 256] with dropout,
  not on sm86/sm89/sm120), ``is_causal`` only with as many keys as queries;
* memory-efficient: float16 and float32 from sm50, bfloat16 from sm80; masks and dropout
  allowed; head dims divisible by the GEMM alignment (8 for half precision, 4 for float32 on
  sm80+, 1 for float32 before), storage offsets aligned likewise on sm80+;
* both: 4-d inputs with the same batch, the same heads (or grouped-query attention with
  ``enable_gqa``), non-empty sequences, the last dim's stride 1;
* math otherwise, CUDA's math: the same composite as the CPU's.

How each kernel is called is the CUDA composite's (``scaled_dot_product_attention`` in
``aten/src/ATen/native/transformers/attention.cpp``): a boolean mask becomes an additive one
(``convert_boolean_attn_mask``); the memory-efficient kernel's mask is expanded to
(B, H, L, S) and, when S is not a multiple of 16, padded (``preprocess_mask``: that copy is
real memory); flash pads head dims to a multiple of 8 (``pad_last_dim<8>``). Not modelled:
the workspaces the kernels allocate inside their backward (flash's ``dq_accum`` and
``softmax_d``, the memory-efficient kernel's ``delta``), which no operator returns; and on
sm90/sm100 torch may prefer cuDNN's attention (``check_prefer_cudnn_attention``, cuDNN newer
than 9.15), which keeps the same output and statistics as flash.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten
FLASH, EFFICIENT, MATH = "flash", "memory-efficient", "math"
# What a dry run assumes when no card is named (--memory, or the whole table): the most
# common training card's.
DEFAULT_SM = (8, 0)
_HALF = (torch.float16, torch.bfloat16)
_SDPA = functional.scaled_dot_product_attention
# torch's SDPBackend numbers (torch._C._SDPBackend)
_BACKENDS = {1: FLASH, 2: EFFICIENT, 0: MATH}


@dataclass(frozen=True)
class CudaCard:
    """The card whose kernels a dry run without a GPU models: its name and compute capability."""

    name: str
    sm: tuple[int, int]


def card_for(name: str | None, major: int | None, minor: int | None) -> CudaCard:
    """The card of a target (``--gpu``), or :data:`DEFAULT_SM`'s when none names a capability."""
    if name is None or major is None:
        return CudaCard(f"sm{DEFAULT_SM[0]}{DEFAULT_SM[1]} (an A100's: no card named)", DEFAULT_SM)
    return CudaCard(name, (major, minor or 0))


@dataclass(frozen=True)
class Call:
    """What one call gives the rules: shapes, strides, dtype, mask, dropout, grad."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    dropout: float
    causal: bool
    gqa: bool
    grad: bool


def _enabled() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {FLASH: cuda.flash_sdp_enabled(), EFFICIENT: cuda.mem_efficient_sdp_enabled(), MATH: cuda.math_sdp_enabled()}


def _dense_ok(c: Call, ignore_singleton: bool) -> str:
    """The checks both fused kernels make of dense inputs; "" when they pass, else why not."""
    if not (c.q.dim() == c.k.dim() == c.v.dim() == 4):
        return "inputs are not 4-d"
    if not (c.q.shape[0] == c.k.shape[0] == c.v.shape[0]):
        return "query, key and value have different batch sizes"
    hq, hk, hv = c.q.shape[1], c.k.shape[1], c.v.shape[1]
    if c.gqa:
        if hk != hv or hq % hk:
            return "grouped-query heads do not divide"
    elif not (hq == hk == hv):
        return "query, key and value have different head counts"
    if c.q.shape[2] == 0 or c.k.shape[2] == 0:
        return "an empty sequence"
    strides_ok = all(t.stride(-1) == 1 for t in (c.q, c.k, c.v)) or (ignore_singleton and c.q.shape[-1] == 1)
    if not strides_ok or (c.mask is not None and c.mask.stride(-1) != 1):
        return "the last dim's stride is not 1"
    return ""


def _flash_why_not(c: Call, sm: tuple[int, int]) -> str:
    if c.mask is not None:
        return "flash takes no attention mask"
    dq, dk, dv = c.q.shape[-1], c.k.shape[-1], c.v.shape[-1]
    if not (dq == dk == dv and dq <= 256):
        return "flash needs one head dim of at most 256"
    if not (8, 0) <= sm <= (12, 1):
        return f"flash needs sm80 or newer (sm{sm[0]}{sm[1]})"
    consumer = (sm[0] == 8 and 6 <= sm[1] <= 9) or sm[0] == 12
    if c.grad and consumer and not (dq <= 192 or (c.dropout == 0 and dq > 224)):
        return f"flash does not train head dim {dq} on sm{sm[0]}{sm[1]}"
    if c.causal and c.q.shape[-2] != c.k.shape[-2]:
        return "flash's is_causal needs as many keys as queries"
    if c.q.dtype not in _HALF or not (c.q.dtype == c.k.dtype == c.v.dtype):
        return f"flash needs float16/bfloat16 ({str(c.q.dtype).replace('torch.', '')})"
    return _dense_ok(c, ignore_singleton=True)


def _efficient_why_not(c: Call, sm: tuple[int, int]) -> str:
    if not (5, 0) <= sm <= (12, 1):
        return "memory-efficient attention needs sm50 or newer"
    half = c.q.dtype in _HALF
    tensor_cores = sm[0] >= 8 or (sm[0] >= 7 and half)
    align = max(4 if sm[0] >= 8 else 1, (128 // 16 if half else 128 // 32) if tensor_cores else 1)
    dq, dk, dv = c.q.shape[-1], c.k.shape[-1], c.v.shape[-1]
    if dq != dk or dq % align or dv % align or dq <= 0 or dv <= 0:
        return f"memory-efficient attention needs head dims divisible by {align}"
    if sm[0] >= 8 and any(t.storage_offset() % align for t in (c.q, c.k, c.v)):
        return "memory-efficient attention needs aligned storage offsets"
    allowed = (torch.float16, torch.float32, torch.bfloat16) if sm[0] >= 8 else (torch.float16, torch.float32)
    if c.q.dtype not in allowed or not (c.q.dtype == c.k.dtype == c.v.dtype):
        return f"memory-efficient attention does not take {str(c.q.dtype).replace('torch.', '')} on sm{sm[0]}{sm[1]}"
    return _dense_ok(c, ignore_singleton=False)


def choose_kernel(c: Call, sm: tuple[int, int]) -> tuple[str, list[str]]:
    """The kernel CUDA picks for ``c`` on a card of compute capability ``sm``, and why each
    kernel before it in the priority order was not picked (see the module docstring)."""
    enabled = _enabled()
    why_not: list[str] = []
    for number in torch._C._get_sdp_priority_order():
        kernel = _BACKENDS.get(number)
        if kernel is None:
            continue  # cuDNN's (see the module docstring) and the overrideable backend
        if not enabled[kernel]:
            why_not.append(f"{kernel} is switched off")
            continue
        if kernel == MATH:
            return MATH, why_not
        reason = _flash_why_not(c, sm) if kernel == FLASH else _efficient_why_not(c, sm)
        if not reason:
            return kernel, why_not
        why_not.append(reason)
    return MATH, why_not  # torch raises "No available kernel"; the math path shows its memory


class CudaAttention(TorchFunctionMode):
    """``scaled_dot_product_attention`` run as CUDA's kernel for ``sm`` (see the module
    docstring); :attr:`chosen` counts the calls by (kernel, dtype, why not the better ones)."""

    def __init__(self, sm: tuple[int, int]) -> None:
        super().__init__()
        self.sm = sm
        self.chosen: Counter[tuple[str, str, str]] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is _SDPA:
            return self._attention(*args, **kwargs)
        return func(*args, **kwargs)

    def __enter__(self) -> CudaAttention:
        # A torch function written in Python runs with the modes off the stack, so the
        # attention F.multi_head_attention_forward (nn.MultiheadAttention,
        # nn.TransformerEncoderLayer) calls inside it would reach the CPU's kernel: that
        # one looks the function up in torch.nn.functional, where it is swapped while the
        # mode lasts.
        functional.scaled_dot_product_attention = self._attention
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        functional.scaled_dot_product_attention = _SDPA
        super().__exit__(*exc)

    def _attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        if any(t.is_nested for t in (query, key, value)):
            return _SDPA(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        call = Call(query, key, value, attn_mask, float(dropout_p), bool(is_causal), bool(enable_gqa), grad)
        kernel, why_not = choose_kernel(call, self.sm)
        self.chosen[(kernel, str(query.dtype).replace("torch.", ""), "; ".join(why_not))] += 1
        mask = _additive(attn_mask, query.dtype)
        if kernel == FLASH:
            return _flash(query, key, value, dropout_p, is_causal, scale)
        if kernel == EFFICIENT:
            if mask is not None:
                mask = _preprocess_mask(mask, query, key)
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, mask, grad, dropout_p, is_causal, scale=scale
            )[0]
        return aten._scaled_dot_product_attention_math(
            query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )[0]

    def notes(self, card: str) -> list[str]:
        if not self.chosen:
            return []
        calls = sum(self.chosen.values())
        kinds = "; ".join(
            f"{kernel} for {n} ({dtype}{', ' + why if why else ''})"
            for (kernel, dtype, why), n in sorted(self.chosen.items(), key=lambda kv: -kv[1])
        )
        fused = any(kernel != MATH for kernel, _, _ in self.chosen)
        kept = (
            " The fused kernels keep the output, a logsumexp per query and the random state "
            "for backward, no L×L attention weights."
            if fused
            else ""
        )
        return [
            f"Attention: {calls} scaled_dot_product_attention call(s) modelled as CUDA's kernel "
            f"on {card} would pick, not the CPU's: {kinds} (torch's sdp_utils.cpp rules).{kept}"
        ]


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``convert_boolean_attn_mask``: a boolean mask as the additive one the kernels take."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    additive = torch.zeros_like(mask, dtype=dtype)
    return additive.masked_fill_(mask.logical_not(), float("-inf"))


def _preprocess_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask``: the memory-efficient kernel's bias, (B, H, L, S) with its last
    dim padded to a multiple of 16 (a copy) when it is not one."""
    bias = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    last = bias.shape[-1]
    if last % 16:
        return torch.nn.functional.pad(bias, (0, 16 - last % 16))[..., :last]
    if any(s % 16 for s in bias.stride()[:3]):
        return bias.contiguous()
    return bias


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, causal: bool, scale: float | None) -> Any:
    """The CUDA composite's flash branch: head dims padded to a multiple of 8, the scale of
    the original head dim, the output cut back."""
    dim = q.shape[-1]
    if scale is None:
        scale = dim**-0.5
    if dim % 8:
        pad = 8 - dim % 8
        q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
    out = aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, False, scale=scale)[0]
    return out[..., :dim] if dim % 8 else out
