"""``%%memfit``'s parts that need no dry run: the GPU table, the headroom's verdict, the
caching allocator's model, the batch search, the line offered after an out-of-memory error."""

from __future__ import annotations

import itertools
import random

import pytest

from gpumagic.cards import GPUS, find_gpu
from gpumagic.memory.fit import api as fit_api
from gpumagic.memory.fit.allocator import AllocatorModel
from gpumagic.memory.fit.batch import BatchPoint, largest_batch
from gpumagic.memory.fit.headroom import HeadroomLine, headroom, verdict
from gpumagic.memory.fit.suggest import memfit_line

MiB, GiB = 2**20, 2**30
torch = pytest.importorskip("torch")


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


def test_a_freed_block_merges_with_both_neighbours_in_a_segment_of_many_blocks():
    m = AllocatorModel()
    for key in range(8):  # eight 64 KiB blocks of one 2 MiB small-pool segment
        m.malloc(key, 64 * 1024)
    assert m.reserved == 2 * MiB
    m.release(2)
    m.release(4)
    m.release(3)  # between two free blocks: one free block of 192 KiB where 2, 3 and 4 were
    m.malloc(9, 192 * 1024)  # fits there exactly: no new segment
    assert m.reserved == 2 * MiB
    (segment,) = m._segments
    assert [(b.offset, b.size, b.free) for b in sorted(segment.values(), key=lambda b: b.offset)][1:4] == [
        (64 * 1024, 64 * 1024, False), (128 * 1024, 192 * 1024, False), (320 * 1024, 64 * 1024, False)
    ]


def test_after_every_free_each_segment_is_one_free_block_again():
    # random mixed sizes over both pools: whatever the order of frees, neighbours merge
    # until each segment is whole, and the blocks of a segment tile it at every step
    rng = random.Random(7)
    m = AllocatorModel()
    live: list[int] = []
    for key in range(3000):
        if live and rng.random() < 0.45:
            m.release(live.pop(rng.randrange(len(live))))
        else:
            m.malloc(key, rng.choice([rng.randint(1, 4096), rng.randint(4096, MiB), rng.randint(MiB, 30 * MiB)]))
            live.append(key)
        if key % 500 == 0:
            _check_tiling(m)
    for key in live:
        m.release(key)
    _check_tiling(m)
    assert all(len(segment) == 1 and segment[0].free for segment in m._segments)
    assert (m.requested, m.allocated) == (0, 0)


def _check_tiling(m: AllocatorModel) -> None:
    for segment in m._segments:
        blocks = sorted(segment.values(), key=lambda b: b.offset)
        for a, b in itertools.pairwise(blocks):
            assert a.offset + a.size == b.offset and a.next is b and b.prev is a
            assert not (a.free and b.free)  # free neighbours are always merged
        assert blocks[0].prev is None and blocks[-1].next is None


def test_one_allocator_replay_serves_every_card(ip, run, monkeypatch):
    # The model reads no property of the card (allocator.py), so a %%memfit that judges all
    # sixteen cards of the table replays the cell's allocations once, not once per card.
    if torch.cuda.is_available():
        pytest.skip("with a GPU the target is this GPU")
    replays = []
    replay = AllocatorModel.replay

    def counted(self, trace):
        replays.append(replay(self, trace))
        return replays[-1]

    monkeypatch.setattr(AllocatorModel, "replay", counted)
    ip.user_ns.update(torch=torch, net=torch.nn.Linear(64, 64))
    r = run("%%memfit -q\nout = net(torch.randn(32, 64)).sum()\nout.backward()\n")
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert len(fit.verdicts) == len(GPUS) > 1
    assert len(replays) == 1 and replays[0].peak_requested == fit.peak_bytes
    assert [line.bytes for line in fit.headroom if line.what == "allocator fragmentation"] == [replays[0].fragmentation]


# Cells whose peaks (fake tensors: nothing is allocated) fall on either side of the table's
# cards and near some, so that the verdicts differ from card to card, with frees in between
# that leave the allocator's model a fragmentation to state.
_CELLS_FOR_EVERY_CARD = [
    "out = net(torch.randn(32, 64)).sum()\nout.backward()\n",
    "conv = torch.nn.Conv2d(3, 8, 3)\ny = conv(torch.randn(4, 3, 32, 32)).relu().sum()\ny.backward()\n",
    # 14.5 GiB and 7 GiB: a peak of 21.5 GiB, within the headroom's range of L4 and A10G
    "a = torch.randn(29, 128, 1024, 1024)\nb = a[:14] @ a[:14]\ndel a\nc = b.sum(0)\n",
    "xs = [torch.randn(n, 1024, 1024) for n in (3000, 500, 7000, 20, 2500)]\ndel xs[1::2]\n"
    "y = torch.randn(6000, 1024, 1024)\n",
]


@pytest.mark.parametrize("cell", _CELLS_FOR_EVERY_CARD)
def test_every_cards_prediction_is_the_one_a_replay_per_card_gave(ip, run, monkeypatch, cell):
    # What %%memfit did before it replayed once: for each card, a fresh allocator model over
    # the run's trace, its headroom and its verdict. The one replay must give each card the
    # same lines and verdict, with no target (the table) and with each card as the target.
    if torch.cuda.is_available():
        pytest.skip("with a GPU the target is this GPU")
    runs, replays = [], []
    dry_run, replay = fit_api.dry_run, AllocatorModel.replay

    def kept_run(*args, **kwargs):
        runs.append(dry_run(*args, **kwargs))
        return runs[-1]

    def counted(self, trace):
        replays.append(trace)
        return replay(self, trace)

    monkeypatch.setattr(fit_api, "dry_run", kept_run)
    monkeypatch.setattr(AllocatorModel, "replay", counted)
    ip.user_ns.update(torch=torch, net=torch.nn.Linear(64, 64))
    r = run("%%memfit -q\n" + cell)
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert not fit.error, fit.error
    (main,) = runs
    assert len(replays) == 1 and main.accounting.trace is not None
    ops = main.accounting.ops

    def before(gpu):
        lines = headroom(
            matmuls=any(name.startswith(fit_api._MATMULS) for name in ops),
            convolutions=any(name.startswith(fit_api._CONVOLUTIONS) for name in ops),
            fragmentation=replay(AllocatorModel(), main.accounting.trace).fragmentation,
            capability_major=gpu.capability, total_bytes=gpu.cuda_bytes,
        )  # fmt: skip
        return lines, verdict(fit.peak_bytes, lines, gpu.cuda_bytes, gpu.uncertainty_bytes)

    assert fit.verdicts == [(g.name, g.cuda_bytes, before(g)[1]) for g in GPUS]
    for gpu in GPUS[:: max(1, len(GPUS) // 5)]:
        runs.clear()
        replays.clear()
        r = run(f'%%memfit -q --gpu "{gpu.name}"\n' + cell)
        assert r.result.success, r.result.error_in_exec
        fit = ip.user_ns["_memfit"]
        lines, fits = before(gpu)
        assert len(replays) == 1 and (fit.headroom, fit.fits) == (lines, fits), gpu.name


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
