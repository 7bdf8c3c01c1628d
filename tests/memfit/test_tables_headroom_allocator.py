"""``%%memfit``'s parts that need no dry run: the GPU table, the headroom's verdict, the
caching allocator's model, the batch search, the line offered after an out-of-memory error."""

from __future__ import annotations

import pytest

from gpumagic.memory.fit.allocator import AllocatorModel
from gpumagic.memory.fit.batch import BatchPoint, largest_batch
from gpumagic.memory.fit.gpus import GPUS, find_gpu
from gpumagic.memory.fit.headroom import HeadroomLine, headroom, verdict
from gpumagic.memory.fit.suggest import memfit_line

MiB, GiB = 2**20, 2**30


def test_the_table_has_the_cards_the_issue_names_each_with_a_source():
    for name in ("H200", "H100 80GB", "A100 40GB", "A100 80GB", "L4", "A10G", "T4", "V100 16GB", "V100 32GB", "RTX 4090", "RTX 3090"):
        assert find_gpu(name) is not None, name
    for gpu in GPUS:
        assert gpu.source.startswith("https://"), gpu.name
        assert gpu.how and gpu.capability in (7, 8, 9)
        assert 14 * GiB < gpu.cuda_bytes < 150 * GiB
        if gpu.smi_mib is not None:  # CUDA's total is below nvidia-smi's: the driver keeps some
            assert gpu.cuda_bytes < gpu.smi_mib * MiB, gpu.name


@pytest.mark.parametrize(
    ("torch_name", "row"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB"),
        ("Tesla V100-SXM2-16GB", "V100 16GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA A10G", "A10G"),
        ("a100-80gb", "A100 80GB"),
    ],
)
def test_cards_are_found_by_the_names_torch_and_users_give_them(torch_name, row):
    found = find_gpu(torch_name)
    assert found is not None and found.name == row
    assert find_gpu("K80") is None


def test_the_verdict_holds_the_whole_range_of_the_headroom():
    lines = [HeadroomLine("a", 100, 50, 200, "s", "w")]
    assert verdict(800, lines, 1000) is True  # 800 + 200 fits
    assert verdict(960, lines, 1000) is False  # 960 + 50 does not
    assert verdict(900, lines, 1000) is None  # fits at the bottom of the range, not the top
    assert verdict(800, lines, 1000, capacity_uncertainty=10) is None


def test_headroom_lines_follow_what_the_cell_runs():
    bare = headroom(matmuls=False, convolutions=False, fragmentation=None)
    assert [line.what for line in bare] == ["CUDA context"]
    hopper = headroom(matmuls=True, convolutions=True, fragmentation=3 * MiB, capability_major=9)
    whats = [line.what for line in hopper]
    assert whats == ["CUDA context", "cuBLAS workspaces", "cuDNN workspace", "allocator fragmentation"]
    assert hopper[1].bytes == 64 * MiB  # 32 MiB cuBLAS + 32 MiB cuBLASLt on Hopper (pytorch#120925)
    ampere = headroom(matmuls=True, convolutions=False, fragmentation=None, capability_major=8, total_bytes=80 * GiB)
    assert ampere[1].bytes == 8_519_680 + 4 * MiB
    for line in hopper:
        assert line.low <= line.bytes <= line.high and line.source.startswith("https://")


def test_the_allocator_model_reserves_segments_as_the_caching_allocator_does():
    m = AllocatorModel()
    m.malloc(1, 1000)  # small: a 2 MiB segment, a 1024-byte block
    assert (m.reserved, m.allocated) == (2 * MiB, 1024)
    m.malloc(2, 5 * MiB)  # under 10 MiB: a 20 MiB segment
    assert m.reserved == 22 * MiB
    m.malloc(3, 11 * MiB)  # the rest of that segment (15 MiB) is taken best-fit and split
    assert m.reserved == 22 * MiB
    m.malloc(4, 30 * MiB + 1)  # large: its own segment, rounded to 2 MiB
    assert m.reserved == 22 * MiB + 32 * MiB
    m.release(2)
    m.malloc(5, 5 * MiB)  # reuses the freed block
    assert m.reserved == 54 * MiB
    m.release(5)
    m.release(3)  # merges with its free neighbours: one free 20 MiB block again
    m.malloc(6, 19 * MiB)
    assert m.reserved == 54 * MiB


def test_the_allocator_model_states_fragmentation():
    # 1 MiB + 512 bytes, 40 times: a 20 MiB segment holds 19 (the 19th takes the segment's
    # tail whole: what is left after it is under 1 MiB, too small to split off)
    trace = [(i, MiB + 512) for i in range(40)]
    m = AllocatorModel().replay(trace)
    assert m.peak_requested == 40 * (MiB + 512)
    assert m.reserved_at_peak == 3 * 20 * MiB
    assert m.allocated == 2 * 20 * MiB + 2 * (MiB + 512)
    assert m.fragmentation == 60 * MiB - 40 * (MiB + 512)
    for i in range(40):  # freed, the reserve stays: segments are not given back
        m.release(i)
    assert (m.requested, m.allocated, m.reserved) == (0, 0, 60 * MiB)


def test_the_batch_search_confirms_the_largest_fitting_size():
    calls = []

    def run_at(v: int) -> BatchPoint:
        calls.append(v)
        need = 3 * GiB + v * 7 * MiB + (v // 3) * 512  # near-linear, as a peak is
        return BatchPoint(v, need, need, need <= 10 * GiB)

    fit = largest_batch("B", [8, 16, 32], 10 * GiB, run_at)
    expected = max(v for v in range(1, 2000) if 3 * GiB + v * 7 * MiB + (v // 3) * 512 <= 10 * GiB)
    assert fit.largest == expected
    assert len(calls) <= 6  # the three sizes given, the line's answer and its neighbour


def test_the_batch_search_says_when_even_one_does_not_fit():
    fit = largest_batch("B", [8, 16], 1 * GiB, lambda v: BatchPoint(v, 2 * GiB + v, 2 * GiB + v, False))
    assert fit.largest == 0


def test_the_line_offered_after_an_out_of_memory_error():
    assert memfit_line("NVIDIA A100-SXM4-80GB", "batch_size", 64) == (
        '%%memfit --gpu "A100 80GB" --batch batch_size=16,32,64 --what-if all'
    )
    assert memfit_line("Some GPU", None) == "%%memfit --what-if all"
    assert memfit_line(None, "B") == "%%memfit --batch B=8,16,32 --what-if all"
