"""``%%memfit --gpus N --shard ...``: one rank's peak of a sharded training step.

The reference is the same step run for real on 2 processes with the gloo backend on the CPU,
under DDP and FSDP2 (``fully_shard``), each rank's peak counted by the tensor census
(:mod:`sharded_run`); the prediction must be within 10% of the busiest rank's. The ZeRO stages
have no real run here (DeepSpeed is not installed); their model states are checked against the
ZeRO paper's formula."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pd = pytest.importorskip("pandas")

from sharded_models import stepped  # noqa: E402

from gpumagic.memory.fit.sharding.modes import ZERO_PERSISTENCE, ddp_buckets, zero_model_states  # noqa: E402

MiB = 2**20


pytestmark = pytest.mark.usefixtures("onednn_off")  # tests/memfit/conftest.py


def _setup(ip, model: str, **kw) -> str:
    ns, step = stepped(model, **kw)
    ip.user_ns.update(ns)
    return step


def _fit(run, ip, line: str, step: str):
    r = run(f"%%memfit -q {line}\n{step}")
    assert r.result.success, r.result.error_in_exec or r.result.error_before_exec
    return ip.user_ns["_memfit"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--gpus 0 --shard fsdp", "--gpus 0: give a whole number >= 1"),
        ("--gpus -2 --shard ddp", "--gpus -2: give a whole number >= 1"),
        ("--shard fsdp", "--shard needs --gpus N"),
        ("--gpus 4", "--gpus N needs --shard MODE"),
        ("--gpus 4 --shard zero4", "unknown sharding mode zero4"),
        ("--gpus 4 --shard ,", "unknown sharding mode (none)"),
        ("--gpus four --shard ddp", "invalid int value: 'four'"),
    ],
)
def test_bad_sharding_options_are_usage_errors(ip, run, line, message):
    from IPython.core.error import UsageError

    r = run(f"%%memfit {line}\nx = 1\n")
    err = r.result.error_in_exec or r.result.error_before_exec
    assert isinstance(err, UsageError), err
    assert message in str(err)
    assert "usage: %%memfit" in str(err)


def test_one_gpu_is_the_plain_run_and_recording_changes_nothing(ip, run):
    step = _setup(ip, "mlp")
    plain = _fit(run, ip, "", step)
    fit = _fit(run, ip, "--gpus 1 --shard zero1,zero2,zero3,fsdp", step)
    assert fit.peak_bytes == plain.peak_bytes  # the recording hooks allocate nothing
    table = fit.shards.set_index("mode")
    for mode in ("zero1", "zero2", "zero3"):  # one rank of one holds everything, no buffer
        assert table.loc[mode, "peak_bytes"] == plain.peak_bytes, table
    # FSDP2 on one GPU still gathers each unit into new tensors
    assert table.loc["fsdp", "peak_bytes"] > plain.peak_bytes


def test_fsdp_on_one_process_against_the_real_run(ip, run, tmp_path):
    """FSDP2 on a one-process gloo group, in this process: the census counts its DTensor
    gradients and its re-gathered parameters (without memory/census/wrapped.py it counted no
    gradient at all), and the prediction for one GPU is within 10% of it."""
    import torch.distributed as dist
    from real_run import measure, prepare_source
    from sharded_run import OPTIMIZER, WRAP

    from gpumagic.memory.fit.sharding.units import unit_modules

    step = _setup(ip, "mlp")
    predicted = _fit(run, ip, "--gpus 1 --shard fsdp", step).shards.loc[0, "peak_bytes"]
    ns, _ = stepped("mlp")
    ns = {"torch": torch, "net": ns["model"], "units": [m for _, m in unit_modules(ns["model"])]}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        measure(prepare_source(WRAP["fsdp"] + OPTIMIZER + step), ns)
        real = measure(prepare_source(step), ns)
    finally:
        dist.destroy_process_group()
    assert real.categories["gradients"] > 0, real.categories
    assert predicted == pytest.approx(real.peak_bytes, rel=0.10), (predicted, real.peak_bytes)


def test_each_mode_divides_what_it_divides(ip, run):
    step = _setup(ip, "mlp")
    fit = _fit(run, ip, "--gpus 4 --shard all", step)
    t = fit.shards.set_index("mode")
    params = sum(p.numel() * 4 for p in ip.user_ns["model"].parameters())
    assert list(t.index) == ["ddp", "fsdp", "zero1", "zero2", "zero3"]
    # DDP: everything whole, plus buckets the size of the gradients (all fp32, trainable)
    assert t.loc["ddp", "parameters"] == pytest.approx(params, rel=0.01)
    assert t.loc["ddp", "optimizer_state"] == pytest.approx(2 * params, rel=0.01)
    sizes = [(p.numel() * 4, 4) for p in ip.user_ns["model"].parameters()]
    assert sum(ddp_buckets(sizes)) == params and t.loc["ddp", "buffers"] >= params * 0.99
    # FSDP: a quarter of each (dim-0 shards); ZeRO: the paper's stages, fp32 Adam (K = 8)
    for mode in ("fsdp", "zero3"):
        for part, whole in (("gradients", params), ("optimizer_state", 2 * params)):
            assert t.loc[mode, part] == pytest.approx(whole / 4, rel=0.03), (mode, part)
    assert t.loc["fsdp", "parameters"] == pytest.approx(params / 4, rel=0.03)
    # ZeRO-3 leaves parameters under stage3_param_persistence_threshold (1e5 elements) whole
    numels = [p.numel() for p in ip.user_ns["model"].parameters()]
    persistent = sum(4 * n for n in numels if n < ZERO_PERSISTENCE)
    assert persistent > 0
    assert t.loc["zero3", "parameters"] == pytest.approx(persistent + (params - persistent) / 4, rel=0.01)
    for stage in (1, 2):
        mode = f"zero{stage}"
        states = t.loc[mode, ["parameters", "gradients", "optimizer_state"]].sum()
        expected = zero_model_states(params // 4, 4, stage, param_bytes=4, grad_bytes=4, k=8)
        assert states == pytest.approx(expected, rel=0.01), mode
    assert t.loc["fsdp", "peak_bytes"] < t.loc["ddp", "peak_bytes"]


def test_the_report_names_the_smallest_number_of_cards(ip, run):
    step = _setup(ip, "mlp", d=1024, depth=6)
    fit = _fit(run, ip, "--gpus 2 --shard fsdp,ddp --memory 1.25GiB", step)
    rows = fit.shards.set_index("mode")
    n = int(rows.loc["fsdp", "smallest_gpus"])
    assert n > 1 and pd.isna(rows.loc["ddp", "smallest_gpus"])
    text = fit._text()
    assert f"fits on {n}x 1.25 GiB with fsdp" in text, text
    assert "DDP holds everything on every rank" in text
    # the claim holds when asked at N and at N - 1
    at = _fit(run, ip, f"--gpus {n} --shard fsdp --memory 1.25GiB", step).shards
    below = _fit(run, ip, f"--gpus {n - 1} --shard fsdp --memory 1.25GiB", step).shards
    assert at["fits"].tolist() == [True], at
    assert below["fits"].tolist() != [True], below


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "gpt2"])
def test_per_rank_peak_matches_two_real_processes(ip, run, model):
    if model == "gpt2":
        pytest.importorskip("transformers")
    from sharded_run import run_ranks
    from torch.nn.attention import SDPBackend, sdpa_kernel

    step = _setup(ip, model)
    # GPT-2 trains with attention dropout: the CPU ranks run attention's math path, while a dry
    # run without a GPU models CUDA's fused kernel; with only the math kernel on, both run it
    with sdpa_kernel(SDPBackend.MATH):
        fit = _fit(run, ip, "--gpus 2 --shard ddp,fsdp", step)
    predicted = dict(zip(fit.shards["mode"], fit.shards["peak_bytes"]))
    ranks = run_ranks(model, ["ddp", "fsdp"], world=2)
    for mode in ("ddp", "fsdp"):
        real = max(r[mode]["steady"] for r in ranks)
        assert predicted[mode] == pytest.approx(real, rel=0.10), (mode, predicted[mode], real)


def test_a_dry_run_that_stopped_judges_no_rank(ip, run):
    # the step recorded only up to the failing line: no per-rank figures, no verdict
    step = _setup(ip, "mlp")
    r = run(f"%%memfit -q --gpu T4 --gpus 2 --shard ddp,fsdp\n{step}raise ValueError('stop')\n")
    assert r.result.error_in_exec is not None
    fit = ip.user_ns["_memfit"]
    assert fit.error and fit.shard is None and fit.fits is None
    assert any(n.startswith("--gpus/--shard: no per-rank figures") for n in fit.notes)
