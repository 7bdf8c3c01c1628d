"""Communication (issue 11): the category, HTA's overlap, the collectives, the rules.

On every shared trace with NCCL kernels, against Holistic Trace Analysis 0.5.0:

    python tests/profile/reference/hta_reference.py --overlap <trace>

(``TraceAnalysis.get_comm_comp_overlap``, ``comp_comm_overlap_pctg`` per rank). Built
traces cover what the shared ones do not record: message sizes with a group size, two
ranks of one job, gloo collectives on CUDA tensors.
"""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from profile_helpers import ALL_TRACES, TraceBuilder, trace_path
from svg_images import inline_svg

from gpumagic.profile.analysis import collectives
from gpumagic.profile.load import load_trace
from gpumagic.profile.rules.registry import diagnose
from gpumagic.profile.trace.session import DdpState, LiveState

# HTA 0.5.0 get_comm_comp_overlap, comp_comm_overlap_pctg
HTA_OVERLAP = {
    "two_ranks/rank-0.json.gz": 11.81,
    "two_ranks/rank-1.json.gz": 20.05,
    "a100_training_control.json.gz": 47.03,
    "v100_training_test.json.gz": 68.8,
}
WITH_NCCL_KERNELS = list(HTA_OVERLAP)
# collectives the traces' nccl:* spans name, with their call counts
COLLECTIVES = {
    "two_ranks/rank-0.json.gz": {"all_reduce": 4, "all_to_all": 4, "all_gather": 2},
    "two_ranks/rank-1.json.gz": {"all_reduce": 4, "all_to_all": 4, "all_gather": 2},
    "a100_training_control.json.gz": {"all_reduce": 18, "all_to_all": 42},
    # three all-reduce kernels and one send/recv launched before the CPU side was recorded
    "v100_training_test.json.gz": {"all_reduce": 21, "all_to_all": 42, "send/recv": 1},
}


def _raw_events(name):
    with gzip.open(trace_path(name)) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.parametrize("name", WITH_NCCL_KERNELS)
def test_nccl_traces_have_communication_overlap_and_collectives(load, name):
    r = load(name)
    bd = r.breakdown
    assert "Communication" in bd.index
    assert bd.loc["Communication", "us"] > 0
    s = r.summary
    assert s.communication_overlap_percent == pytest.approx(HTA_OVERLAP[name], abs=1.0)
    # in practice the same figure to its rounding
    assert s.communication_overlap_percent == pytest.approx(HTA_OVERLAP[name], abs=0.01)
    c = r.collectives
    assert dict(zip(c["name"], c["calls"])) == COLLECTIVES[name]
    assert set(c["backend"]) == {"nccl"}
    # every NCCL kernel of the trace belongs to exactly one row
    kernels = [
        e for e in _raw_events(name) if e.get("cat") == "kernel" and e["name"].startswith("nccl")
    ]
    assert c["device_us"].sum() == pytest.approx(sum(e["dur"] for e in kernels))
    # the per-step split adds up to the step, and Communication is the part of the
    # collectives no kernel, copy or set covered
    ov = r.overlap
    parts = ["computation_only_us", "overlap_us", "communication_only_us", "other_us"]
    assert np.allclose(ov[parts].sum(axis=1), ov["step_us"])
    assert (ov["communication_only_us"] + 1e-6 >= r.steps["Communication_us"]).all()


@pytest.mark.parametrize("name", ALL_TRACES)
def test_the_communication_rule_fires_exactly_above_ten_percent(load, name):
    r = load(name)
    share = r.breakdown.loc["Communication", "percent"]
    found = {f.rule: f for f in r.findings}
    assert ("communication" in found) == (share > 10.0), share
    if "communication" in found:
        f = found["communication"]
        split = r.overlap.set_index("rank")
        assert f.saving_us == pytest.approx(split["communication_only_us"].mean(), rel=1e-9)
        assert "no_sync()" in f.fix and "gradient_as_bucket_view" in f.snippet


def test_which_shared_traces_spend_over_ten_percent_in_communication(load):
    fires = {n for n in ALL_TRACES if "communication" in {f.rule for f in load(n).findings}}
    # the plugin's (by-name) Communication: 27.3, 24.2, 18.6 and 8.8 % for the NCCL traces,
    # 85.1 % for the gloo one
    assert fires == {
        "two_ranks/rank-0.json.gz",
        "two_ranks/rank-1.json.gz",
        "a100_training_control.json.gz",
        "cpu_only.json.gz",
    }


@pytest.mark.parametrize("name", [n for n in ALL_TRACES if n not in WITH_NCCL_KERNELS])
def test_traces_without_nccl_kernels_have_no_device_communication(load, name):
    r = load(name)
    a = r.primary
    assert not a.comms.kernels.any()
    if name == "cpu_only.json.gz":  # gloo: the all-reduce spans are the communication
        assert r.summary.communication_overlap_percent == 0.0
        assert list(r.collectives["name"]) == ["all_reduce"]
    elif name == "mtia_single_rank.json.gz":  # MTIA's CPU group is gloo: 48 barriers
        assert r.summary.communication_overlap_percent == 0.0
        assert list(r.collectives["name"]) == ["barrier"]
        assert list(r.collectives["backend"]) == ["gloo"]
    else:
        assert r.breakdown.loc["Communication", "us"] == 0
        assert r.summary.communication_overlap_percent is None


def test_record_param_comms_gives_bytes_and_group_size(load):
    # one rank of NCCL: no kernels, but every call is recorded with its size and group
    r = load("v100_training_5steps.json.gz")
    c = r.collectives.set_index("name")
    raw = [e["args"] for e in _raw_events("v100_training_5steps.json.gz")]
    rpc = [a for a in raw if a.get("Collective name") == "allreduce"]
    assert c.loc["all_reduce", "calls"] == len(rpc) == 25
    assert c.loc["all_reduce", "bytes"] == sum(4 * a["In msg nelems"] for a in rpc)  # Float
    assert c.loc["all_reduce", "group_size"] == 1
    assert c.loc["all_reduce", "device_us"] == 0
    assert c.loc["broadcast", "calls"] == 10
    # a group of one moves nothing: nccl-tests' bus factor 2(n-1)/n is 0, and no time ran
    assert math.isnan(c.loc["all_reduce", "busbw_gbps"])


def test_names_bus_factors_and_dtypes():
    assert collectives.canonical_name("nccl:_all_gather_base") == "all_gather"
    assert collectives.canonical_name("c10d::allreduce_") == "all_reduce"
    assert collectives.canonical_name("c10d::alltoall_base_") == "all_to_all"
    assert collectives.canonical_name("reduce_scatter_tensor_coalesced") == "reduce_scatter"
    assert collectives.canonical_name("nccl:send 0->1") == "send"
    assert collectives.canonical_name("gloo:broadcast") == "broadcast"
    assert collectives.kernel_collective("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == (
        "all_reduce"
    )
    assert collectives.kernel_collective("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == (
        "send/recv"
    )
    assert collectives.is_comm_kernel("ncclSymDevKernel_AllReduce_LL_sum_bf16")
    assert not collectives.is_comm_kernel("void at::native::vectorized_elementwise_kernel<4>")
    # nccl-tests doc/PERFORMANCE.md
    assert collectives.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert collectives.bus_factor("all_gather", 8) == collectives.bus_factor("reduce_scatter", 8) == 7 / 8
    assert collectives.bus_factor("all_to_all", 8) == 7 / 8
    assert collectives.bus_factor("broadcast", 8) == collectives.bus_factor("reduce", 8) == 1.0
    assert math.isnan(collectives.bus_factor("all_reduce", math.nan))
    assert collectives.dtype_bytes("BFloat16") == collectives.dtype_bytes("c10::Half") == 2
    assert collectives.dtype_bytes("long int") == 8


def _nccl_rank(
    path, rank: int, kernel_us: float, compute: tuple[float, float], steps: int = 2
) -> None:
    """One rank of a 4-rank job: per step a compute kernel, then an all-reduce of 1M floats
    (record_param_comms as torch >= 2.1 writes it) and an all-gather of 0.25M floats."""
    b = TraceBuilder()
    b.distributed = {"backend": "nccl", "rank": rank, "world_size": 4}
    step_us = 10_000.0
    for i in range(steps):
        t0 = 1000.0 + i * step_us
        b.op(f"ProfilerStep#{i}", t0, step_us - 10, cat="user_annotation")
        b.op("aten::mm", t0 + 10, 20)
        b.launch("ampere_sgemm_128x64_nn", t0 + 15, t0 + compute[0], compute[1])
        # c10d op > record_param_comms > nccl:<name> > cudaLaunchKernel, as NCCL writes them
        for k, (name, rpc_name, nin, nout, dur) in enumerate(
            [
                ("all_reduce", "allreduce", 1_000_000, 1_000_000, kernel_us),
                ("_all_gather_base", "_allgather_base", 250_000, 1_000_000, 500.0),
            ]
        ):
            ts = t0 + 100 + 40 * k
            b.op("c10d::" + name.strip("_") + "_", ts, 30)
            b.op(
                "record_param_comms",
                ts + 2,
                26,
                **{
                    "Collective name": rpc_name,
                    "dtype": "Float",
                    "In msg nelems": nin,
                    "Out msg nelems": nout,
                    "Group size": 4,
                },
            )
            b.op(f"nccl:{name}", ts + 4, 20, cat="user_annotation")
            b.launch(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
                if k == 0
                else "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                ts + 6,
                t0 + 2000 + 3000 * k,
                dur,
            )
    b.write(path / f"rank{rank}.json")


def test_bandwidths_as_nccl_tests_defines_them(tmp_path):
    _nccl_rank(tmp_path, 0, kernel_us=1000.0, compute=(2000.0, 500.0))
    r = load_trace(tmp_path / "rank0.json")
    c = r.collectives.set_index("name")
    ar, ag = c.loc["all_reduce"], c.loc["all_gather"]
    assert ar["calls"] == ag["calls"] == 2
    assert ar["group_size"] == ag["group_size"] == 4
    # all-reduce: S = 4 MB, t = 1 ms -> algbw 4 GB/s, busbw x 2(n-1)/n = 6 GB/s
    assert ar["bytes_per_call"] == 4_000_000
    assert ar["algbw_gbps"] == pytest.approx(4.0)
    assert ar["busbw_gbps"] == pytest.approx(6.0)
    # all-gather: S is the gathered buffer (Out msg nelems), t = 0.5 ms -> 8 and 6 GB/s
    assert ag["bytes_per_call"] == 4_000_000
    assert ag["algbw_gbps"] == pytest.approx(8.0)
    assert ag["busbw_gbps"] == pytest.approx(6.0)
    # the compute kernel covers half of the all-reduce: 500 of the 1500 µs of collectives
    assert r.summary.communication_overlap_percent == pytest.approx(100 * 500 / 1500)


def test_two_ranks_report_their_waits_and_the_slowest_waits_least(tmp_path):
    # rank 1 computes longer; rank 0's all-reduce spins 700 µs longer waiting for it
    _nccl_rank(tmp_path, 0, kernel_us=1000.0, compute=(1500.0, 200.0))
    _nccl_rank(tmp_path, 1, kernel_us=300.0, compute=(1500.0, 900.0))
    r = load_trace(tmp_path)
    pr = r.per_rank.set_index("rank")
    assert pr.loc[0, "collective_wait_us_per_step"] == pytest.approx(700.0)
    assert pr.loc[1, "collective_wait_us_per_step"] == pytest.approx(0.0)
    assert r.slowest_rank == 1
    assert r.summary.collective_wait_us_per_step == pytest.approx(0.0)
    assert sorted(set(r.collectives["rank"])) == [0, 1]
    assert sorted(set(r.overlap["rank"])) == [0, 1]
    text = r.to_text()
    assert "coll. wait/step" in text and "Collectives" in text
    html = r.to_html()
    assert 'class="gm-overlap"' in html and "busbw" in html
    assert inline_svg(html).count("<rect") > 8  # the overlap chart's bars, read from its image


def _gloo_gpu_trace(path, copies: bool):
    """gloo all-reduce of a CUDA tensor: the c10d op copies it to pinned host memory, the
    gloo thread reduces and copies it back (ProcessGroupGloo's CUDA work)."""
    b = TraceBuilder()
    b.distributed = {"backend": "gloo", "rank": 0, "world_size": 2}
    for i in range(2):
        t0 = 1000.0 + i * 10_000
        b.op(f"ProfilerStep#{i}", t0, 9_990, cat="user_annotation")
        b.op("aten::mm", t0 + 10, 20)
        b.launch("ampere_sgemm_128x64_nn", t0 + 15, t0 + 40, 2_000)
        b.op("c10d::allreduce_", t0 + 2_100, 60)
        b.op("gloo:all_reduce", t0 + 2_200, 3_000, cat="user_annotation", tid=2)
        if copies:
            b.launch(
                "Memcpy DtoH (Device -> Pinned)",
                t0 + 2_110,
                t0 + 2_120,
                400,
                cat="gpu_memcpy",
                runtime="cudaMemcpyAsync",
                bytes=4_000_000,
            )
            b.launch(
                "Memcpy HtoD (Pinned -> Device)",
                t0 + 5_000,
                t0 + 5_010,
                400,
                cat="gpu_memcpy",
                tid=2,
                runtime="cudaMemcpyAsync",
                bytes=4_000_000,
            )
    return b.write(path / "gloo_gpu.json")


def test_gloo_on_gpu_from_the_copies_gloo_makes(tmp_path):
    r = load_trace(_gloo_gpu_trace(tmp_path, copies=True))
    found = {f.rule: f for f in r.findings}
    f = found["gloo_on_gpu"]
    assert f.evidence["copies_in_collectives_per_step"] == 2
    assert f.evidence["copy_bytes_per_step"] == 8_000_000
    assert f.saving_us == pytest.approx(800.0)
    assert "nccl" in f.snippet and not f.confirmed
    # the gloo spans are communication even on a GPU run
    assert r.breakdown.loc["Communication", "us"] > 0
    assert list(r.collectives["backend"]) == ["gloo"]


def test_gloo_on_gpu_needs_copies_or_the_session_backend(tmp_path):
    r = load_trace(_gloo_gpu_trace(tmp_path, copies=False))
    assert "gloo_on_gpu" not in {f.rule for f in r.findings}
    live = LiveState(distributed_backend="gloo")
    found = {f.rule: f for f in diagnose(r.primary, live)}
    assert found["gloo_on_gpu"].confirmed
    nccl = {f.rule for f in diagnose(r.primary, LiveState(distributed_backend="nccl"))}
    assert "gloo_on_gpu" not in nccl


def test_live_ddp_settings_sharpen_the_communication_finding(load):
    r = load("a100_training_control.json.gz")
    live = LiveState(ddp=(DdpState("model", 25.0, False, True, False),))
    f = {f.rule: f for f in diagnose(r.primary, live)}["communication"]
    assert f.confirmed
    assert f.evidence["ddp_find_unused_parameters"] == "True"
    assert "it is on here" in f.fix
    plain = {f.rule: f for f in diagnose(r.primary)}["communication"]
    assert not plain.confirmed and "ddp_bucket_cap_mb" not in plain.evidence


def test_dataparallel_from_the_trace_span(tmp_path):
    b = TraceBuilder()
    for i in range(2):
        t0 = 1000.0 + i * 1000
        b.op(f"ProfilerStep#{i}", t0, 990, cat="user_annotation")
        b.op("DataParallel.forward", t0 + 10, 500, cat="user_annotation")
        b.op("aten::mm", t0 + 20, 20)
        b.launch("ampere_sgemm_128x64_nn", t0 + 25, t0 + 40, 100)
    r = load_trace(b.write(tmp_path / "dp.json"))
    f = {f.rule: f for f in r.findings}["dataparallel"]
    assert f.evidence["data_parallel_forward_calls_per_step"] == 1
    assert "DistributedDataParallel" in f.snippet and f.severity == "medium"


def test_compare_shows_communication_and_overlap(load):
    from gpumagic.profile.compare import compare

    cmp = compare(load("a100_training_control.json.gz"), load("v100_training_test.json.gz"))
    t = cmp.table
    assert t.loc["communication_overlap_percent", "a"] == pytest.approx(47.03, abs=0.01)
    assert t.loc["communication_overlap_percent", "b"] == pytest.approx(68.8, abs=0.01)
    assert t.loc["communication_percent", "delta"] < 0
    assert "Communication" in cmp.breakdown.index
    text = cmp._text()
    assert "communication overlap" in text and "Communication" in text
    assert "communication overlap" in cmp._html()


def test_report_escapes_and_draws_the_distributed_view(load):
    r = load_trace(trace_path("two_ranks"))
    html = r.to_html()
    assert "<h4>Communication" in html
    assert html.count('class="gm-overlap"') == 1
    html = inline_svg(html)  # the chart's labels, read from its image
    # one bar row per (rank, step) and the legend
    assert html.count("step 551") >= 2 and "communication only" in html
    assert "GPU utilisation (compute kernels)" in html
    text = r.to_text()
    assert "waiting in collectives" in text
    assert "all_to_all" in text
