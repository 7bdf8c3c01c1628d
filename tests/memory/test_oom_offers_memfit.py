"""The out-of-memory report of ``%%memtrace`` ends with the ``%%memfit`` line that answers
"what fits": the card that ran out, the batch-size variable the cell reads, every fix; and
that line, run on the same cell, answers without running out."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpumagic.memory.fit.suggest import batch_variable, names_in, oom_memfit_line  # noqa: E402

OOM_CELL = """\
x = torch.randn(B, 256)
h = net(x).detach()
huge = torch.empty(2**45, dtype=torch.uint8)
"""


@pytest.fixture
def fake_cuda(monkeypatch, ip):
    from cuda_double import FakeCuda

    fake = FakeCuda(monkeypatch)
    ip.user_ns["fake"] = fake
    return fake


def test_the_host_report_ends_with_the_memfit_line_and_the_line_answers(ip, run):
    if torch.cuda.is_available():
        pytest.skip("without a GPU here: the line has no target")
    ip.user_ns.update(torch=torch, net=torch.nn.Linear(256, 256), B=64)
    r = run("%%memtrace\n" + OOM_CELL)
    assert "can't allocate memory" in str(r.result.error_in_exec), r.result.error_in_exec
    oom = ip.user_ns["_memtrace"].oom
    # no GPU here and the host ran out: no card to name, so every card of the table is
    # judged, and --batch (which needs a target) is not offered
    assert oom.memfit == "%%memfit --what-if all"
    text = r.bundles[0]["text/plain"].rstrip()
    assert text.endswith("with this line on top of the cell: %%memfit --what-if all")
    assert 'gm-memfit-next">What fits' in r.html()
    # the offered line, on the same cell: a dry run says what the cell needs, nothing allocated
    r = run(oom.memfit + "\n" + OOM_CELL)
    assert r.result.success, r.result.error_in_exec
    fit = ip.user_ns["_memfit"]
    assert fit.peak_bytes >= 2**45 and fit.peak_line == 4
    assert all(fits is False for _, _, fits in fit.verdicts)
    assert "huge" not in ip.user_ns  # nothing ran for real


def test_a_cuda_report_names_the_card_or_its_size_and_the_batch(ip, run, fake_cuda):
    fake_cuda.allocate(3 * 2**30)
    ip.user_ns.update(torch=torch, batch_size=48)
    r = run(
        "%%memtrace -q\n"
        "x = torch.ones(batch_size, 4)\n"
        "raise torch.AcceleratorError('CUDA error: out of memory')\n"
    )
    assert isinstance(r.result.error_in_exec, torch.AcceleratorError)
    oom = ip.user_ns["_memtrace"].oom
    assert oom.device == "cuda:0 (Fake H200)" and oom.total == 140 * 2**30
    # the table has no "Fake H200": the card's size instead
    assert oom.memfit == "%%memfit --memory 140.0GiB --batch batch_size=12,24,48 --what-if all"


def test_the_line_for_cards_the_table_knows():
    line = oom_memfit_line(
        cuda=True, device="cuda:1 (NVIDIA A100-SXM4-80GB)", total=85_000_000_000,
        sources=["x, y = make_batch(BATCH)", "loss = model(x)"], namespace={"BATCH": 256}, gpu_here=True,
    )  # fmt: skip
    assert line == '%%memfit --gpu "A100 80GB" --batch BATCH=64,128,256 --what-if all'
    # a size the table lacks, rounded down; a batch name that holds no count is no batch
    line = oom_memfit_line(
        cuda=True, device="cuda:0 (Some GPU)", total=int(79.19 * 2**30),
        sources=["x = torch.randn(bs, 3)"], namespace={"bs": "big"}, gpu_here=True,
    )  # fmt: skip
    assert line == "%%memfit --memory 79.1GiB --what-if all"
    # the host ran out on a machine with a GPU: that GPU is memfit's target, so --batch holds
    line = oom_memfit_line(
        cuda=False, device="host", total=2**36, sources=["x = f(B)"], namespace={"B": 8}, gpu_here=True
    )
    assert line == "%%memfit --batch B=2,4,8 --what-if all"
    assert batch_variable(names_in(["n = batch_size + B"]), {"B": 4, "batch_size": 32}) == ("batch_size", 32)
