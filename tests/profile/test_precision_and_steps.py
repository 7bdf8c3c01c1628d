"""Precision and steps on the analysis side (issue 9): which kernel names are tensor-core
kernels (cuBLAS's fp32 ``..._ffma_...`` GEMMs on Ampere are not), autocast read from the trace,
the TF32 API (``fp32_precision``, torch >= 2.9) the live state reports, the first marked step
(first-call setup) left out; and the recorder's note on a CUDA recording that holds no GPU
events.

Traces the shared files do not contain (an FP32 FFMA cuBLAS kernel on an A100, a matmul under
autocast on a GPU) are built here with a few events; the real traces check the kernel names
they hold.
"""

from __future__ import annotations

import numpy as np
import pytest
from profile_helpers import ALL_TRACES, TraceBuilder
from trace_data import SHARED

from gpumagic.profile.analysis.precision import autocast_matmuls, is_tensor_core_kernel
from gpumagic.profile.load import load_trace
from gpumagic.profile.rules.registry import diagnose
from gpumagic.profile.trace.session import LiveState

FFMA = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_"
    "aligna4_alignc4_execute_kernel__5x_cublas"
)
TF32 = (
    "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_"
    "tensor16x8x8_execute_kernel__5x_cublas"
)
BF16 = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel"


def _matmul_trace(
    tmp_path, kernel: str, *, wrap: str = "", annotation: str = "", steps: int = 3, tag: str = ""
):
    """``steps`` ProfilerSteps, each an ``aten::linear`` > ``aten::addmm`` launching ``kernel``
    (800 µs of a 1 ms step). ``wrap="reenter"``: autocast's wrapper (the op casts its inputs
    and calls itself); ``wrap="cast"``: only a cast to bf16 inside the op (recorded shapes);
    ``annotation``: a user annotation around the matmul."""
    b = TraceBuilder()
    t = 0.0
    for i in range(steps):
        b.op(f"ProfilerStep#{i}", t, 1000.0, cat="user_annotation")
        if annotation:
            b.op(annotation, t + 5, 950.0, cat="user_annotation")
        b.op("aten::linear", t + 10, 900.0, **{"Input type": ["float", "float", "float"]})
        if wrap:
            b.op("aten::to", t + 12, 20.0)
            b.op("aten::_to_copy", t + 13, 18.0)
            b.op(
                "aten::copy_", t + 15, 10.0, **{"Input type": ["c10::BFloat16", "float", "Scalar"]}
            )
        if wrap == "reenter":
            b.op("aten::linear", t + 40, 850.0, **{"Input type": ["c10::BFloat16"] * 3})
        b.op("aten::addmm", t + 50, 800.0)
        b.launch(kernel, t + 60, t + 100, 800.0)
        t += 1000.0
    name = f"mm_{tag or abs(hash((kernel, wrap, annotation, steps)))}.json"
    return load_trace(b.write(tmp_path / name))


def _rules(result, live: LiveState | None = None) -> dict:
    return {f.rule: f for f in diagnose(result.primary, live)}


# --- FP32 FFMA/SIMT kernels are not tensor-core kernels ------------------------------------


@pytest.mark.parametrize(
    ("name", "tensor_cores"),
    [
        (FFMA, False),
        (FFMA.replace("tn_n_tilesize128x128x8", "nn_n_tilesize64x128x8"), False),
        ("cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(T1::Params)", False),
        ("ampere_sgemm_128x64_nn", False),
        ("volta_sgemm_64x64_nt", False),
        (
            "void cudnn::ops::scalePackedTensor_kernel<float, float>(cudnnTensor4dStruct, float*, float)",
            False,
        ),
        (TF32, True),
        (BF16, True),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>"
            "(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)",
            True,
        ),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", True),
        ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", True),
        ("volta_h884gemm_64x64_ldg8_nn", True),
    ],
)
def test_kernel_names_say_tensor_cores_or_not(name, tensor_cores):
    assert is_tensor_core_kernel(name) is tensor_cores


def test_fp32_ffma_cublas_kernel_fires_tensor_cores_and_tf32_does_not(tmp_path):
    f = _rules(_matmul_trace(tmp_path, FFMA, tag="ffma"))["tensor_cores"]
    assert f.evidence["compute_capability"] == "8.0"
    assert f.evidence["without_tensor_cores_us_per_step"] == pytest.approx(800.0)
    assert f.saving_us == pytest.approx(400.0)
    assert "tensor_cores" not in _rules(_matmul_trace(tmp_path, TF32, tag="tf32"))


def test_tensor_core_kernel_names_in_the_real_traces(load):
    """Every GEMM/conv kernel in the shared traces: tensor-core by name exactly where the name
    says TF32/tensorop, and never for sgemm/cudnn fp32 kernels."""
    seen = {}
    for name in [
        "a100_alexnet_syncs.json.gz",
        "a100_training_control.json.gz",
        "resnet50_v100_num_workers_0.json.gz",
        "v100_training_5steps.json.gz",
        "v100_training_test.json.gz",
    ]:
        gpu = load(name).primary.trace.gpu
        for k in gpu.name.values:
            seen[k] = is_tensor_core_kernel(k)
    tc = {k for k, v in seen.items() if v}
    assert tc, "the A100 traces hold tensor-core kernels"
    assert all("tf32" in k or "tensorop" in k for k in tc), sorted(tc)[:5]
    assert "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw" in " ".join(tc)
    assert not any(seen[k] for k in seen if "sgemm" in k or "cudnn::" in k)
    assert not seen.get("ampere_gcgemm_64x64_nt", False)


# --- autocast from the trace -------------------------------------------------------------


@pytest.mark.parametrize(
    ("wrap", "annotation"), [("reenter", ""), ("cast", ""), ("", "autocast bf16")]
)
def test_autocast_in_the_trace_silences_tensor_cores(tmp_path, wrap, annotation):
    # a non-tensor-core kernel under autocast misses tensor cores for another reason
    r = _matmul_trace(tmp_path, FFMA, wrap=wrap, annotation=annotation, tag=f"ac_{wrap}")
    marked = autocast_matmuls(r.primary)
    names = {r.primary.trace.host.name.at(i) for i in np.flatnonzero(marked)}
    assert {"aten::linear", "aten::addmm"} <= names
    assert "tensor_cores" not in _rules(r)


def test_without_autocast_in_the_trace_the_rule_fires_whatever_the_live_state_omits(tmp_path):
    r = _matmul_trace(tmp_path, FFMA, tag="bare")
    assert not autocast_matmuls(r.primary).any()
    # a session that says nothing about autocast (what %%gpuprofile passes now) changes nothing
    f = _rules(r, LiveState())["tensor_cores"]
    assert "under_autocast_us_per_step" not in f.evidence


def test_bf16_kernels_under_autocast_are_tensor_core_kernels(tmp_path):
    r = _matmul_trace(tmp_path, BF16, wrap="reenter", tag="bf16")
    assert autocast_matmuls(r.primary).any()
    assert "tensor_cores" not in _rules(r)
    # and without the autocast marks the kernel's own name is enough
    assert "tensor_cores" not in _rules(_matmul_trace(tmp_path, BF16, tag="bf16_bare"))


def test_backward_casts_are_not_autocast(load):
    # aten::convolution_backward casts with aten::to in this fp32 run: not autocast's wrapper
    r = load("v100_training_5steps.json.gz")
    host = r.primary.trace.host
    assert any(n == "aten::convolution_backward" for n in host.name.values)
    assert not autocast_matmuls(r.primary).any()
    assert "tensor_cores" in {f.rule for f in r.findings}


# --- the new TF32 API (fp32_precision) in the live state ----------------------------------


def test_tensor_cores_reads_the_new_fp32_precision_api(tmp_path):
    r = _matmul_trace(tmp_path, FFMA, tag="live")
    ieee = _rules(r, LiveState(matmul_fp32_precision="ieee", conv_fp32_precision="none"))
    f = ieee["tensor_cores"]
    assert f.evidence["matmul_fp32_precision"] == "ieee"
    # the session uses the new API, so the advice does too (PyTorch refuses to mix them)
    assert (
        "fp32_precision = 'tf32'" in f.snippet and "set_float32_matmul_precision" not in f.snippet
    )
    legacy = _rules(r, LiveState(matmul_allow_tf32=False, float32_matmul_precision="highest"))
    assert "set_float32_matmul_precision('high')" in legacy["tensor_cores"].snippet
    # TF32 already allowed (new API): what is left to advise is mixed precision
    on = _rules(r, LiveState(matmul_fp32_precision="tf32"))["tensor_cores"]
    assert "already allowed" in on.snippet and "autocast" in on.fix


def test_live_state_prefers_the_new_api():
    assert LiveState(matmul_fp32_precision="tf32", matmul_allow_tf32=None).tf32_matmul is True
    assert LiveState(matmul_fp32_precision="ieee", matmul_allow_tf32=True).tf32_matmul is False
    # "none" inherits: the legacy flags decide
    assert LiveState(matmul_fp32_precision="none", matmul_allow_tf32=True).tf32_matmul is True
    assert LiveState(matmul_fp32_precision="none").new_precision_api is False


# --- the first marked step (first-call setup) ----------------------------------------------


def _steps_trace(tmp_path, steps: int):
    b = TraceBuilder()
    t = 0.0
    for i in range(steps):
        dur = 5000.0 if i == 0 else 1000.0  # the first step pays the first-call setup
        b.op(f"ProfilerStep#{i}", t, dur, cat="user_annotation")
        b.launch("k", t + 10, t + dur - 500, 400.0)
        t += dur
    return b.write(tmp_path / f"steps{steps}.json")


def test_first_marked_step_left_out_when_asked(tmp_path):
    path = _steps_trace(tmp_path, 4)
    kept = load_trace(path)
    assert kept.summary.steps == 4 and kept.summary.first_step_left_out is False
    assert kept.summary.step_time_max_us == pytest.approx(5000.0)
    skipped = load_trace(path, skip_first=True)
    s = skipped.summary
    assert s.steps == 3 and s.first_step_left_out is True
    assert s.step_names == ["1", "2", "3"]
    assert s.step_time_us == pytest.approx(1000.0)
    text = skipped.to_text()
    assert (
        "steps: 3 of 4 (ProfilerStep 1-3; the first (setup) left out, --keep-first keeps it)"
        in text
    )
    assert "3 of 4" in skipped.to_html()


def test_an_only_step_is_kept(tmp_path):
    r = load_trace(_steps_trace(tmp_path, 1), skip_first=True)
    assert r.summary.steps == 1 and r.summary.first_step_left_out is False


# --- a CUDA recording whose trace holds no GPU events (CUPTI busy or unavailable) ----------


def _host_only_trace(tmp_path, runtime: list[str]):
    b = TraceBuilder()
    b.op("aten::mm", 0.0, 100.0)
    for i, name in enumerate(runtime):
        b.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": 10.0 + 20 * i,
                "dur": 5.0,
                "args": {"correlation": i + 1},
            }
        )
    return load_trace(b.write(tmp_path / f"host_{len(runtime)}_{runtime[:1]}.json")).primary.trace


@pytest.fixture
def cuda_recorder():
    from gpumagic.profile.record.recorder import Recorder, RecordOptions

    rec = Recorder(RecordOptions())
    rec.cuda = True  # CUDA activity was asked of the profiler
    yield rec
    rec.cleanup()


def test_launches_without_gpu_events_are_noted(tmp_path, cuda_recorder):
    trace = _host_only_trace(
        tmp_path, ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaDeviceSynchronize"]
    )
    assert not trace.has_gpu
    (note,) = cuda_recorder.notes(trace, 0)
    assert "the host made 2 CUDA launch/copy calls but no kernel or copy reached it" in note
    assert "CUPTI may be busy or unavailable" in note


def test_a_sync_alone_or_no_cuda_recording_is_not_noted(tmp_path, cuda_recorder):
    # torch's own stop() calls cudaDeviceSynchronize; a CPU cell on a GPU box shows only that
    trace = _host_only_trace(tmp_path, ["cudaDeviceSynchronize"])
    assert cuda_recorder.notes(trace, 0) == []
    cuda_recorder.cuda_used = True  # ...unless the cell allocated on the GPU
    assert "the cell allocated CUDA memory" in cuda_recorder.notes(trace, 0)[0]
    cuda_recorder.cuda = False  # a CPU-only recording says nothing of the GPU
    assert cuda_recorder.notes(_host_only_trace(tmp_path, ["cudaLaunchKernel"]), 0) == []


def test_kernel_names_are_read_as_the_case_insensitive_patterns_read_them(load):
    # is_tensor_core_kernel lower-cases ASCII names and searches case-sensitively (issue 27:
    # the speed of a 109k-event trace); every real kernel name, and names whose case or
    # non-ASCII letters fold differently, must get the answer the patterns' definition gives
    from gpumagic.profile.analysis.precision import (
        _NO_TENSOR_CORE_EVIDENCE,
        _TENSOR_CORE_EVIDENCE,
    )

    def by_definition(name: str) -> bool:
        return (
            _TENSOR_CORE_EVIDENCE.search(name) is not None
            and _NO_TENSOR_CORE_EVIDENCE.search(name) is None
        )

    here = [t for t in ALL_TRACES if (SHARED / t).exists()]  # the ones beside the repository
    names = {n for t in here for n in load(t).primary.trace.gpu.name.values}
    names |= {
        "VOLTA_H884GEMM",
        "Ampere_SGEMM_fp16",
        "İMMA_kernel",
        "ſgemm_bf16",
        "\u212aernel_tf32",
    }
    assert len(names) > 300
    assert {n for n in names if is_tensor_core_kernel(n)} == {n for n in names if by_definition(n)}
