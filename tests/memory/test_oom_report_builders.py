"""The OOM report builders on plain data: allocator-stat dictionaries of torch's shape."""

from __future__ import annotations

import pytest

from gpumagic.memory.trace.oom.analyse import build_cuda_report, build_host_report
from gpumagic.memory.trace.oom.detect import is_oom, requested_bytes
from gpumagic.memory.trace.oom.holders import Holder
from gpumagic.render.memtrace import oom_html, oom_text

GiB = 2**30
MiB = 2**20


def cuda_stats(allocated: int, reserved: int, retries: int = 0) -> dict[str, int]:
    """A dictionary with the keys and shape torch.cuda.memory_stats() returns."""
    stats: dict[str, int] = {}
    for metric, current in (
        ("allocated_bytes", allocated),
        ("reserved_bytes", reserved),
        ("active_bytes", allocated),
        ("inactive_split_bytes", reserved - allocated),
        ("requested_bytes", allocated),
    ):
        for pool in ("all", "large_pool", "small_pool"):
            scale = 1 if pool != "small_pool" else 0
            for stat in ("current", "peak", "allocated", "freed"):
                stats[f"{metric}.{pool}.{stat}"] = current * scale if pool != "all" else current
    stats["num_alloc_retries"] = retries
    stats["num_ooms"] = 1
    stats["num_device_alloc"] = 12
    stats["num_device_free"] = 3
    return stats


CUDA_MSG = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.19 GiB is free. Including non-PyTorch memory, this process has 77.99 GiB memory "
    "in use. Of the allocated memory 60.25 GiB is allocated by PyTorch, and 17.10 GiB is "
    "reserved by PyTorch but unallocated."
)


class FakeOom(RuntimeError):
    """Stands in for torch.OutOfMemoryError's message in pure tests (is_oom matches the text)."""


@pytest.mark.parametrize(
    "message, expected",
    [
        (CUDA_MSG, 2 * GiB),
        ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 35184372088832 bytes.", 2**45),
        ("Unable to allocate 32.0 TiB for an array with shape (4398046511104,) and data type float64", 32 * 2**40),
        ("out of memory", None),
    ],
)
def test_requested_bytes_from_messages(message, expected):
    assert requested_bytes(message) == expected


def test_is_oom_recognises_the_three_kinds():
    torch = pytest.importorskip("torch")
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory."))
    assert is_oom(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("CUDA out of memory"))


def test_cuda_report_fragmentation_and_holders():
    holders = [
        Holder("model.fc.weight", "parameter", 4 * GiB, (32768, 32768), "float32", "cuda:0"),
        Holder("opt.state[model.fc.weight]['exp_avg']", "optimizer state", 4 * GiB, (32768, 32768), "float32", "cuda:0"),
        Holder("model.fc.weight.grad", "gradient", 4 * GiB, (32768, 32768), "float32", "cuda:0"),
        Holder("x", "tensor", 512 * MiB, (8, 1024, 16384), "float32", "cuda:0"),
    ]
    stats = cuda_stats(allocated=int(60.25 * GiB), reserved=int(77.35 * GiB), retries=3)
    report = build_cuda_report(FakeOom(CUDA_MSG), stats, (int(1.19 * GiB), int(79.19 * GiB)),
                               "cuda:0 (NVIDIA H100)", holders, unnamed=(GiB, 7))
    assert report.requested == 2 * GiB
    assert report.free == int(1.19 * GiB)
    assert report.reserved_unallocated == int(77.35 * GiB) - int(60.25 * GiB)
    assert report.fragmented
    assert report.holders[0].nbytes == 4 * GiB and report.holders[-1].name == "x"
    text = " ".join(report.advice)
    assert "expandable_segments:True" in text
    assert "checkpoint" in text and "autocast" in text
    assert "set_to_none=True" in text and "empty_cache" in text
    html = oom_html(report)
    assert "2.0 GiB" in html and "(fragmented)" in html
    assert "opt.state[model.fc.weight][&#x27;exp_avg&#x27;]" in html
    assert "7 tensors no variable names" in oom_text(report)


def test_cuda_report_without_fragmentation_does_not_suggest_expandable_segments():
    stats = cuda_stats(allocated=70 * GiB, reserved=71 * GiB)
    report = build_cuda_report(FakeOom(CUDA_MSG), stats, (GiB, 80 * GiB), "cuda:0", [])
    assert not report.fragmented
    assert not any("expandable_segments" in a for a in report.advice)
    # no model in sight: no checkpointing advice
    assert not any("checkpoint" in a for a in report.advice)


def test_cuda_report_before_cuda_init_has_zeros_not_errors():
    report = build_cuda_report(FakeOom("CUDA out of memory."), {}, None, "cuda:0", [])
    assert report.allocated == 0 and report.free is None and report.requested is None
    assert "CUDA out of memory" in oom_text(report)


def test_host_report_with_an_address_space_cap():
    report = build_host_report(
        MemoryError("Unable to allocate 8.00 GiB for an array"), rss=3 * GiB, available=20 * GiB,
        total=24 * GiB, holders=[], address_limit=6 * GiB, address_used=5 * GiB,
    )
    assert report.requested == 8 * GiB
    assert report.free == GiB  # the cap, not the machine, is what is left
    assert report.total == 6 * GiB
    assert report.limit_note == (
        "the process's address space is capped at 6.0 GiB (RLIMIT_AS), 5.0 GiB of it in use"
    )


def test_request_and_free_that_print_alike_get_more_digits():
    report = build_host_report(
        MemoryError("Unable to allocate 32.0 MiB for an array"), rss=GiB, available=int(31.99 * MiB),
        total=24 * GiB, holders=[],
    )
    text = oom_text(report)
    assert "asked for 32.000 MiB; free 31.990 MiB" in text


@pytest.mark.parametrize(
    "make, kind",
    [
        (lambda t: t.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."), "cuda"),
        (lambda t: t.AcceleratorError("CUDA error: out of memory"), "cuda"),
        (lambda t: RuntimeError("CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA"), "cuda"),
        (lambda t: RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "cuda"),
        (lambda t: RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cuda"),
        (lambda t: RuntimeError("cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"), "cuda"),
        (lambda t: RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), "cuda"),
        (lambda t: RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"), "host"),
        (lambda t: RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"), "host"),
        (lambda t: MemoryError(), "host"),
        (lambda t: t.AcceleratorError("CUDA error: an illegal memory access was encountered"), None),
        (lambda t: RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"), None),
        (lambda t: ValueError("CUDA error: out of memory"), None),
    ],
)
def test_oom_kind_follows_the_error(make, kind):
    from gpumagic.memory.trace.oom.detect import oom_kind

    torch = pytest.importorskip("torch")
    exc = make(torch)
    assert oom_kind(exc) == kind, exc
    assert is_oom(exc) == (kind is not None)


def test_requested_is_the_allocators_rounded_size_and_says_so():
    from gpumagic.memory.trace.oom.detect import oom_device_index

    report = build_cuda_report(FakeOom(CUDA_MSG), cuda_stats(GiB, GiB), (GiB, 80 * GiB), "cuda:0", [])
    assert report.requested == 2 * GiB
    assert "rounded block size" in report.requested_note and "20 MiB" in report.requested_note
    assert "rounded block size" in oom_text(report) and "rounded block size" in oom_html(report)
    library = build_cuda_report(
        FakeOom("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        cuda_stats(GiB, GiB), None, "cuda:0", [],
    )
    assert library.requested is None and "does not say" in library.requested_note
    assert any("handle or workspace" in a for a in library.advice)
    assert oom_device_index(FakeOom(CUDA_MSG.replace("GPU 0", "GPU 3"))) == 3
    assert oom_device_index(FakeOom("CUDA out of memory. (GPU 1; 79.19 GiB total capacity)")) == 1


def test_a_named_activation_is_listed_without_reading_its_grad() -> None:
    """``h = net(x)`` leaves a non-leaf tensor in the namespace; reading its ``.grad`` makes
    torch warn, and under warnings-as-errors (pytest here) the whole report was lost."""
    import warnings

    import torch

    from gpumagic.memory.trace.oom.holders import named_tensors

    w = torch.ones(4, 4, requires_grad=True)
    h = w * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names = [holder.name for holder in named_tensors({"w": w, "h": h}, lambda t: True)]
    assert sorted(names) == ["h", "w"]
