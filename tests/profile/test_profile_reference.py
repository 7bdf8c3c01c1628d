"""Agreement with the two reference tools on the real traces.

Step-time breakdown: the PyTorch Profiler TensorBoard plugin (torch-tb-profiler 0.4.3,
its last release), numbers copied from

    /tmp/tbvenv/bin/python tests/profile/reference/tb_plugin_reference.py ../shared/traces/resnet50_*.json.gz
    /tmp/tbvenv/bin/python tests/profile/reference/tb_plugin_reference.py --normalize <the other traces>

The plugin predates Kineto's newer category names (it ignores ``cuda_runtime`` and all
``user_annotation`` spans but ProfilerStep), so on new-schema traces it reports Runtime 0
and never sees the DataLoader. ``--normalize`` renames those categories to the old ones
before the plugin parses the trace; that is the plugin's algorithm on the events we also
count. Its eight roles are our eight categories, Communication included (issue 11).

On the traces with NCCL kernels the plugin's Communication misses them: it links kernels to
``nccl:*`` CPU ops through the External id, and there the launches carry External id =
correlation id. We find them by name, as HTA does; the reference for those traces is the
plugin with that one change (``--comm-kernels-by-name``, see the script), which also gives
its Distributed View per step:

    /tmp/tbvenv/bin/python tests/profile/reference/tb_plugin_reference.py --normalize \
        --comm-kernels-by-name <the traces with NCCL kernels>

GPU idle: Holistic Trace Analysis 0.5.0, ``get_idle_time_breakdown`` per stream, from

    /tmp/htavenv/bin/python tests/profile/reference/hta_reference.py <trace>

HTA always leaves out the last ProfilerStep; ``idle_breakdown(window="hta")`` makes the
same choice. Traces with fractional (ns) timestamps are not compared exactly: HTA rounds
each event inward to whole µs, which lengthens every gap by up to 2 µs.

Tuning discipline: nothing here is fitted. The code implements the plugin's algorithm
as its source documents it (``overall_parser.py``, ``event_parser.py``); the first run
was compared against every trace at once and already agreed to within 0.03 pp, and no
constant or rule changed after that. TUNED names the traces allowed to inform any future
adjustment; HELD_OUT must then still pass untouched.
"""

from __future__ import annotations

import pytest

from gpumagic.profile.analysis.breakdown import CATEGORIES

PLUGIN_ROLES = (
    "Kernel",
    "Memcpy",
    "Memset",
    "Communication",
    "Runtime",
    "DataLoader",
    "CpuOp",
    "Other",
)

# trace: (Kernel, Memcpy, Memset, Communication, Runtime, DataLoader, CpuOp, Other) percent,
#        mean step µs, GPU utilisation %, est. SM efficiency %, achieved occupancy %
TB_PLUGIN = {
    # old Kineto schema, as the plugin reads it directly
    "resnet50_v100_num_workers_0.json.gz": (
        (63.607, 1.119, 0.057, 0.0, 2.617, 22.919, 8.899, 0.781),
        154911.3,
        63.607,
        62.651,
        49.136,
    ),
    "resnet50_v100_num_workers_4.json.gz": (
        (69.354, 2.02, 0.069, 0.0, 7.409, 0.204, 10.023, 10.921),
        142808.5,
        69.354,
        68.322,
        48.914,
    ),
    # new schema, with --normalize
    "a100_training_control.json.gz": (
        (79.408, 4.035, 0.122, 0.027, 3.182, 0.09, 13.001, 0.134),
        77501.7,
        79.381,
        59.205,
        32.464,
    ),
    "v100_training_5steps.json.gz": (
        (96.826, 0.765, 0.122, 0.011, 0.841, 0.0, 1.255, 0.179),
        96703.6,
        96.826,
        94.922,
        46.45,
    ),
    "v100_training_test.json.gz": (
        (83.443, 12.819, 0.101, 0.017, 1.867, 0.018, 1.715, 0.019),
        124085.8,
        83.443,
        70.534,
        35.847,
    ),
    "two_ranks/rank-0.json.gz": (
        (44.487, 0.027, 0.002, 0.024, 0.499, 0.0, 53.692, 1.268),
        615120.0,
        44.486,
        20.758,
        21.038,
    ),
    "two_ranks/rank-1.json.gz": (
        (46.466, 0.365, 0.002, 0.01, 0.351, 0.0, 51.548, 1.258),
        619271.5,
        46.464,
        25.191,
        25.189,
    ),
    "a100_alexnet_syncs.json.gz": (
        (0.024, 0.128, 0.0, 0.0, 97.263, 0.0, 2.585, 0.0),
        43425283.0,
        0.024,
        0.024,
        38.416,
    ),
    "mi250_rocm_minitoy.json.gz": (
        (1.194, 0.411, 0.0, 0.0, 72.119, 0.0, 20.479, 5.797),
        9288.3,
        1.194,
        None,
        None,
    ),
    "a100_triton_kernel.json.gz": (
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.01, 99.989),
        13336315.8,
        0.0,
        0.0,
        0.0,
    ),
    "cpu_only.json.gz": (
        (0.0, 0.0, 0.0, 85.088, 0.0, 0.0, 0.0, 14.912),
        210109.2,
        None,
        None,
        None,
    ),
    "a100_cupti_counters.json.gz": (
        (0.0, 0.0, 0.0, 0.0, 69.186, 0.0, 30.814, 0.0),
        11843523.0,
        None,
        None,
        None,
    ),
}
# The traces with NCCL kernels, through the plugin with communication kernels found by
# name (--comm-kernels-by-name): the eight roles, mean step µs, GPU utilisation, est. SM
# efficiency and achieved occupancy of the compute kernels, and the Distributed View per
# step, (computation, overlap, communication, other) µs as the plugin's costs hold them.
TB_PLUGIN_COMM_BY_NAME = {
    "two_ranks/rank-0.json.gz": (
        (17.096, 0.104, 0.002, 27.314, 0.503, 0.0, 53.713, 1.268),
        615120.0,
        17.095,
        16.66,
        51.755,
        [(106252, 23068, 195327, 328801), (104068, 36148, 200872, 354136)],
    ),
    "two_ranks/rank-1.json.gz": (
        (21.959, 0.69, 0.003, 24.181, 0.352, 0.0, 51.557, 1.258),
        619271.5,
        21.958,
        21.509,
        53.712,
        [(135548, 33691, 168027, 338020), (136425, 41839, 211026, 325027)],
    ),
    "a100_training_control.json.gz": (
        (60.501, 4.198, 0.252, 18.613, 3.187, 0.09, 13.023, 0.134),
        77501.7,
        60.48,
        54.32,
        47.607,
        [
            (45364, 6552, 16256, 20588),
            (47024, 8811, 21122, 17465),
            (48105, 17004, 31488, 13645),
            (47228, 14576, 29164, 14911),
            (47039, 15370, 34480, 12324),
            (46576, 13301, 31025, 16820),
        ],
    ),
    "v100_training_test.json.gz": (
        (73.598, 13.751, 0.22, 8.793, 1.873, 0.018, 1.727, 0.019),
        124085.8,
        73.598,
        70.241,
        51.762,
        [
            (119596, 43535, 58702, 21883),
            (85593, 26453, 38394, 19594),
            (84423, 27323, 39477, 18225),
            (88028, 28570, 38578, 25068),
            (85523, 25416, 37390, 19195),
            (84786, 26746, 38800, 19303),
        ],
    ),
}
WITH_NCCL_KERNELS = list(TB_PLUGIN_COMM_BY_NAME)

TUNED = ["resnet50_v100_num_workers_0.json.gz", "a100_training_control.json.gz"]
HELD_OUT = [t for t in TB_PLUGIN if t not in TUNED and t not in WITH_NCCL_KERNELS]

# The spec's bar: within 2 percentage points per category.
MAX_PP = 2.0


def _plugin_percent(values: tuple[float, ...]) -> dict[str, float]:
    return {c: v for c, v in zip(CATEGORIES, values)}


@pytest.mark.parametrize("name", [t for t in TUNED + HELD_OUT if t not in WITH_NCCL_KERNELS])
def test_breakdown_agrees_with_the_tensorboard_plugin(load, name):
    # the plugin counts an unmarked trace whole, its start-up phase included
    r = load(name, keep_startup=True)
    values, step_us, util, sm_eff, occupancy = TB_PLUGIN[name]
    assert len(PLUGIN_ROLES) == len(CATEGORIES) == len(values)
    expected = _plugin_percent(values)
    got = r.breakdown["percent"].to_dict()
    worst = max(abs(got[c] - expected[c]) for c in CATEGORIES)
    assert worst <= MAX_PP, {c: (round(got[c], 3), expected[c]) for c in CATEGORIES}
    # in practice the agreement is far tighter than the bar; keep it that way
    assert worst <= 0.05, {c: (round(got[c], 3), expected[c]) for c in CATEGORIES}
    s = r.summary
    assert s.step_time_us == pytest.approx(step_us, abs=0.1)
    if util is None:
        assert s.gpu_utilization_percent is None
    else:
        assert s.gpu_utilization_percent == pytest.approx(util, abs=0.01)
    if sm_eff is not None:
        assert s.sm_efficiency_percent == pytest.approx(sm_eff, abs=0.01)
    if occupancy is not None:
        assert s.achieved_occupancy_percent == pytest.approx(occupancy, abs=0.01)


@pytest.mark.parametrize("name", WITH_NCCL_KERNELS)
def test_breakdown_with_nccl_kernels_agrees_with_the_plugin_finding_them_by_name(load, name):
    r = load(name, keep_startup=True)  # the plugin's whole-trace step, as above
    values, step_us, util, sm_eff, occupancy, view = TB_PLUGIN_COMM_BY_NAME[name]
    expected = _plugin_percent(values)
    got = r.breakdown["percent"].to_dict()
    worst = max(abs(got[c] - expected[c]) for c in CATEGORIES)
    # what differs: the plugin also counts the nccl:* CPU spans (they only enqueue the
    # kernels) as CPU ops, and so do we; nothing else
    assert worst <= 0.05, {c: (round(got[c], 3), expected[c]) for c in CATEGORIES}
    s = r.summary
    assert s.step_time_us == pytest.approx(step_us, abs=0.1)
    assert s.gpu_utilization_percent == pytest.approx(util, abs=0.01)
    assert s.sm_efficiency_percent == pytest.approx(sm_eff, abs=0.01)
    assert s.achieved_occupancy_percent == pytest.approx(occupancy, abs=0.01)
    # the unpatched plugin counted the NCCL kernels as Kernel: the time anything ran on
    # the GPU is the same either way
    unpatched = TB_PLUGIN[name][0]
    gpu = ["Kernel", "Memcpy", "Memset", "Communication"]
    assert sum(got[c] for c in gpu) == pytest.approx(sum(unpatched[:3]), abs=0.05)
    # the Distributed View, step by step: our split holds the plugin's exclusive parts
    ov = r.overlap
    assert len(ov) == len(view)
    for row, (comp, both, comm, other) in zip(ov.itertuples(), view):
        assert row.computation_only_us + row.overlap_us == pytest.approx(comp, abs=1.0)
        assert row.overlap_us == pytest.approx(both, abs=1.0)
        assert row.communication_only_us + row.overlap_us == pytest.approx(comm, abs=1.0)
        assert row.other_us == pytest.approx(other, abs=1.0)


# HTA 0.5.0 get_idle_time_breakdown, µs: {stream: (host_wait, kernel_wait, other)}
HTA_IDLE = {
    "resnet50_v100_num_workers_0.json.gz": {7: (211365, 8433, 0)},
    "resnet50_v100_num_workers_4.json.gz": {7: (87072, 9076, 0)},
    "a100_training_control.json.gz": {
        7: (102154, 14226, 32183),
        20: (346996, 621, 7470),
        21: (237710, 71, 0),
        22: (271786, 1253, 0),
    },
    "v100_training_test.json.gz": {
        7: (2960, 42372, 41756),
        14: (520794, 1087, 14536),
        15: (348483, 138, 38936),
        16: (422925, 829, 0),
    },
    "two_ranks/rank-0.json.gz": {
        7: (213825, 1985, 261740),
        23: (596037, 70, 34),
        25: (0, 9, 47865),
        84: (148934, 6, 0),
        203: (0, 0, 0),
    },
    "two_ranks/rank-1.json.gz": {
        7: (156827, 1816, 281064),
        23: (596313, 100, 0),
        25: (0, 9, 53028),
        84: (251860, 0, 23247),
        203: (0, 0, 0),
    },
    "a100_alexnet_syncs.json.gz": {7: (12855007, 104, 0), 20: (12011718, 3, 0)},
}


@pytest.mark.parametrize("name", list(HTA_IDLE))
def test_idle_split_agrees_with_hta(load, name):
    report = load(name).idle_breakdown(window="hta")
    got = {
        int(row.stream): (row.host_wait_us, row.kernel_wait_us, row.other_us)
        for row in report.streams.itertuples()
    }
    assert set(got) == set(HTA_IDLE[name])
    for stream, expected in HTA_IDLE[name].items():
        for ours, theirs in zip(got[stream], expected):
            # HTA sums negative gaps (events that overlap by a rounding error); we clip them
            assert ours == pytest.approx(theirs, rel=0.01, abs=150), (stream, got[stream], expected)


def test_default_idle_window_is_the_steps_and_splits_like_hta(load):
    r = load("resnet50_v100_num_workers_0.json.gz")
    ours = r.idle.totals
    hta = dict(
        zip(
            ("host_wait", "kernel_wait", "other"),
            HTA_IDLE["resnet50_v100_num_workers_0.json.gz"][7],
        )
    )
    # the steps window includes the last step HTA leaves out: more idle time, same split
    assert ours["host_wait"] > hta["host_wait"]
    share = ours["host_wait"] / sum(ours.values())
    assert share == pytest.approx(hta["host_wait"] / sum(hta.values()), abs=0.01)
    assert r.idle.window_kind == "steps"


def test_fractional_timestamps_differ_from_hta_only_by_its_rounding(load):
    # HTA rounds each ns-resolution event inward to whole µs (ceil start, floor end), so
    # each of the ~4,000 gaps on stream 7 grows by up to 2 µs in HTA's numbers.
    report = load("v100_training_5steps.json.gz").idle_breakdown(window="hta")
    row = report.streams.set_index("stream").loc[7]
    ours = row.host_wait_us + row.kernel_wait_us + row.other_us
    hta = 1709 + 8404 + 0
    gaps = row.events - 1
    assert ours <= hta <= ours + 2 * gaps
