"""Which kernels ran on tensor cores and which host ops ran under autocast, read from
the trace (the precision rule and the tests use these as analysis)."""

from __future__ import annotations

import re

import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.trace_analysis import Analysis

MATMUL_OP = re.compile(
    r"^aten::(mm|bmm|addmm_?|addbmm|baddbmm|matmul|linear|addmv|mv|_convolution|convolution"
    r"|conv[123]d|conv_tbc|conv_transpose[123]d|cudnn_convolution\w*|convolution_backward\w*)$"
    r"|^(Mm|Bmm|Addmm|Addbmm|Baddbmm|Addmv|Mv|Convolution|CudnnConvolution\w*)Backward\d*$"
)


# Tensor-core GEMM/conv kernels name an MMA instruction shape (volta_h884gemm,
# ampere_fp16_s16816gemm, cutlass_80_tensorop_s1688gemm), a tensor-core input type
# (sm80_xmma_gemm_f32f32_tf32f32_..._tensor16x8x8, sm90_xmma_..._bf16bf16_..., e4m3/e5m2 FP8)
# or a tensor-core family (tensorop, hmma/imma/wmma, Hopper's nvjet_*). A bare "xmma" is
# only NVIDIA's template library: full-FP32 cuBLAS GEMMs on Ampere/Hopper run as
# sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_... (plain FMA on the CUDA cores: what an fp32
# matmul with TF32 off runs on an A100), so "ffma", "simt" and "sgemm" are evidence
# against, and win.
_TENSOR_CORE_EVIDENCE = re.compile(
    r"[hsci](884|1688|16816|8816)|hmma|imma|wmma|tensorop|tensor\d+x\d+|tf32|bf16|fp16|f16|e4m3|e5m2"
    r"|nvjet|_tc_",
    re.IGNORECASE,
)


_NO_TENSOR_CORE_EVIDENCE = re.compile(r"ffma|simt|sgemm", re.IGNORECASE)
# The same patterns, case-sensitive, for a name already lower-cased: kernel names run to
# thousands of characters, and a case-insensitive search compares each one both ways
# (3-4x the time of lower() and a plain search over the shared traces' 332 kernel names).
_TENSOR_CORE_LOWER = re.compile(_TENSOR_CORE_EVIDENCE.pattern)
_NO_TENSOR_CORE_LOWER = re.compile(_NO_TENSOR_CORE_EVIDENCE.pattern)


def is_tensor_core_kernel(name: str) -> bool:
    """The kernel's name says it runs on tensor cores (and nothing in it says it does not)."""
    if not name.isascii():  # lower() and IGNORECASE fold some non-ASCII letters differently
        return (
            _TENSOR_CORE_EVIDENCE.search(name) is not None
            and _NO_TENSOR_CORE_EVIDENCE.search(name) is None
        )
    low = name.lower()
    return _TENSOR_CORE_LOWER.search(low) is not None and _NO_TENSOR_CORE_LOWER.search(low) is None


LOW_PRECISION_TYPES = ("c10::Half", "c10::BFloat16", "c10::Float8", "Half", "BFloat16")


_CAST_OP = re.compile(r"^aten::(to|_to_copy)$")


_AUTOCAST_NAME = re.compile(r"autocast", re.IGNORECASE)


def autocast_matmuls(a: Analysis) -> np.ndarray:
    """Host events that ran under autocast: forward matmul/conv ops autocast wrapped, and
    what nests in them or in an annotation or op named after autocast.

    Read from the trace, never from the cell's text (a comment, ``autocast('cpu')`` around
    CUDA work or ``enabled=False`` say nothing). Autocast's wrapper shows as the
    op calling itself after casting its inputs: ``aten::linear`` > ``aten::to`` (x3) >
    ``aten::linear`` > ``aten::addmm``; without autocast a forward op never re-enters
    itself. With recorded shapes a cast to a 16-bit type directly inside the op says the
    same. Only the device type autocast was entered for is wrapped, so ``autocast('cpu')``
    leaves CUDA matmuls bare. Backward ops are never wrapped (their own casts, e.g. in
    ``aten::convolution_backward``, are not autocast's).
    """
    host = a.trace.host
    host_par, _ = a.parents
    is_mm = host.name.mask(
        lambda n: MATMUL_OP.match(n) is not None and "backward" not in n.lower()
    )
    child = np.flatnonzero(host_par >= 0)
    parent = host_par[child]
    codes = host.name.codes
    under_mm = is_mm[parent]
    reenters = under_mm & (codes[child] == codes[parent])
    wrapped = np.zeros(len(host.ts), bool)
    wrapped[parent[reenters]] = True
    casts = child[under_mm & host.name.mask(lambda n: _CAST_OP.match(n) is not None)[child]]
    if len(casts):
        wrapped[host_par[casts[_casts_to_half(a, casts)]]] = True
    marks = wrapped | host.name.mask(lambda n: _AUTOCAST_NAME.search(n) is not None)
    return marks | tree.any_ancestor(host_par, marks)


def _casts_to_half(a: Analysis, casts: np.ndarray) -> np.ndarray:
    """Per cast op (``aten::to``/``_to_copy``), whether it wrote a 16-bit float type: the
    destination is the first input of the ``aten::copy_`` inside it (recorded shapes only)."""
    host = a.trace.host
    host_par, _ = a.parents
    copies = np.flatnonzero(host.name.mask(lambda n: n == "aten::copy_"))
    out = np.zeros(len(casts), bool)
    if not len(copies):
        return out
    # the cast that holds each copy_ (directly, or through aten::_to_copy)
    holder = host_par[copies]
    holder = np.where(
        (holder >= 0) & ~np.isin(holder, casts), host_par[np.maximum(holder, 0)], holder
    )
    inside = np.isin(holder, casts)
    copies, holder = copies[inside], holder[inside]
    if not len(copies):
        return out
    _dims, types = host.inputs(copies)
    half = np.array([any(t in s.split(",")[0] for t in LOW_PRECISION_TYPES) for s in types], bool)
    out[np.isin(casts, holder[half])] = True
    return out
