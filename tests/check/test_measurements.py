"""%gpucheck's measurements, really run on the CPU at short sizes (the same timing code as on
CUDA), each figure beside the card table's with its source; the rules over measured figures;
the host's threads judged against the CPUs this process may use."""

from __future__ import annotations

import json
import math
import os

import card_states as S
import pytest
import torch

from gpumagic.card_specs import pcie_bandwidth
from gpumagic.cards import find_specs
from gpumagic.environment.check import gpucheck, last_check
from gpumagic.environment.check.facts import CardCheck, HostFacts
from gpumagic.environment.check.findings import below_spec, pinned_copies, tf32_off
from gpumagic.environment.check.judge import threads
from gpumagic.environment.check.measurements import (
    LoadSample,
    Measurement,
    Sizes,
    attach_spec,
    matmul,
    measure_device,
    measure_host,
    memory_copy,
    tf32,
)
from gpumagic.environment.check.run import run_check
from gpumagic.environment.collect import _torch_flags

T = 1e12


def test_the_host_is_measured_for_real():
    threads_before = torch.get_num_threads()
    found = measure_host(torch, seconds=0.02, n=256, nbytes=8 * 2**20)
    assert torch.get_num_threads() == threads_before  # one thread for a moment, then back
    keys = [m.key for m in found]
    assert keys[0] == "cpu_matmul" and keys[-1] == "cpu_memory"
    assert ("cpu_matmul_1" in keys) == (threads_before > 1)
    for m in found:
        assert m.device == "host" and m.calls >= 3 and math.isfinite(m.value) and m.value > 0
        assert m.spec is None and m.ratio is None  # a CPU has no datasheet figure here
    assert found[0].unit == "FLOP/s" and found[-1].unit == "B/s"
    # a 256 x 256 fp32 matmul is 2 * 256^3 FLOP; no CPU does a PFLOP/s
    assert 1e6 < found[0].value < 1e15
    assert found[0].size == f"256×256 float32, {threads_before} thread{'s' if threads_before != 1 else ''}"


def test_a_cards_figures_are_the_same_code_run_on_the_cpu():
    """measure_device on the CPU at tiny sizes: what CUDA runs, less the pinned memory a CPU
    build cannot allocate; the probe is read while the BF16 matmul and the copy run."""
    _, specs, _ = find_specs("NVIDIA GeForce RTX 4090")
    probed = []

    def probe():
        probed.append(1)
        return LoadSample(sm_clock=2520 + len(probed))

    sizes = Sizes(fp32=64, tensor=64, memory=2 * 2**20, transfer=2**20, launches=50)
    found, load, link = measure_device(torch, "cpu", sizes, 0.005, specs, probe, pinned=False)
    assert [m.key for m in found] == [
        "fp32", "tf32", "bf16", "fp16", "memory", "h2d_pageable", "d2h_pageable", "launch"
    ]
    assert all(m.value > 0 and m.calls >= 3 for m in found)
    assert (load.sm_clock, link, len(probed)) == (2521, None, 1)  # no pinned copy: no link read
    sizes_of = {m.key: m.size for m in found}
    assert sizes_of["bf16"] == "64×64 bfloat16" and sizes_of["memory"] == "2 MiB"
    specs_of = {m.key: m.spec for m in found}
    assert specs_of["bf16"] == pytest.approx(165.2 * T) and specs_of["launch"] is None
    assert specs_of["h2d_pageable"] == pytest.approx(pcie_bandwidth(4, 16))
    m = memory_copy(torch, "cpu", "memory", 4 * 2**20, 0.01)
    assert m.size == "4 MiB" and m.value > 0


@pytest.mark.parametrize(
    "setup",
    [
        lambda: None,
        lambda: torch.set_float32_matmul_precision("high"),
        lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
        lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
    ],
    ids=["default", "precision-high", "fp32_precision-tf32", "legacy-allow_tf32"],
)
def test_tf32_on_or_off_for_a_measurement_leaves_the_users_setting_as_it_was(setup):
    matmul_ = torch.backends.cuda.matmul
    saved = torch.get_float32_matmul_precision(), matmul_.fp32_precision
    try:
        setup()
        before = _torch_flags(torch)
        for on in (True, False):
            with tf32(torch, on):
                assert matmul_.fp32_precision == ("tf32" if on else "ieee")
                matmul(torch, "cpu", "tf32" if on else "fp32", 64, 0.001)
            assert _torch_flags(torch) == before  # errors included: torch refuses some mixes itself
    finally:  # both of torch 2.9's settings back as they were, for the tests after this one
        torch.set_float32_matmul_precision(saved[0])
        matmul_.fp32_precision = saved[1]


def test_each_figure_sits_beside_the_cards_with_its_source():
    _, specs, _ = find_specs("NVIDIA GeForce RTX 4090")
    bf16 = Measurement("cuda:0", "bf16", 150 * T, "8192×8192 bfloat16", 20)
    attach_spec(bf16, specs)
    assert bf16.spec == pytest.approx(165.2 * T) and bf16.ratio == pytest.approx(150 / 165.2)
    assert "nvidia-ada-gpu-architecture.pdf" in bf16.spec_source
    assert "FP32 Accumulate" in bf16.spec_source
    h2d = Measurement("cuda:0", "h2d_pinned", 25e9, "256 MiB", 10)
    attach_spec(h2d, specs)
    assert h2d.spec == pytest.approx(pcie_bandwidth(4, 16)) and h2d.spec_source.startswith("PCIe Gen 4 x16")
    launch = Measurement("cuda:0", "launch", 5.0, "one element", 2000)
    attach_spec(launch, specs)
    assert launch.spec is None
    # an H200's dense BF16 is half the datasheet's 1,979 with sparsity
    _, h200, _ = find_specs("NVIDIA H200")
    assert h200.bf16.value == pytest.approx(989.5 * T) and "sparsity" in h200.bf16.note


def _card(state, *measurements, **kw):
    reading = run_check(measure=False, nvml=_double(state), env=kw.pop("env")).cards[0].reading
    row, specs, why = find_specs(reading.name)
    card = CardCheck(reading, 0, row.name if row else None, specs, why, list(measurements))
    for m in card.measurements:
        attach_spec(m, specs)
    return card


def _double(state):
    from nvml_double import NvmlDouble

    return NvmlDouble([state])


def test_a_figure_far_below_its_specification_is_a_finding_unless_a_reading_explains_it(with_cuda_torch):
    slow = Measurement("cuda:0", "bf16", 0.4 * 165.2 * T, "8192×8192 bfloat16", 20)
    (f,) = below_spec(_card(S.HEALTHY_4090, slow, env=with_cuda_torch))
    assert f.code == "slow-bf16" and f.title == "BF16 matmul at 40% of the card's specification"
    assert "measured 66.1 TFLOP/s" in f.evidence and "165 TFLOP/s" in f.evidence
    assert f.cost == pytest.approx(0.6)
    slow = Measurement("cuda:0", "bf16", 0.4 * 165.2 * T, "8192×8192 bfloat16", 20)
    assert below_spec(_card(S.POWER_CAPPED_4090, slow, env=with_cuda_torch)) == []  # the cap explains it
    fine = Measurement("cuda:0", "bf16", 0.8 * 165.2 * T, "8192×8192 bfloat16", 20)
    assert below_spec(_card(S.HEALTHY_4090, fine, env=with_cuda_torch)) == []


def test_tf32_off_and_pageable_copies_from_the_figures(with_cuda_torch):
    fp32 = Measurement("cuda:0", "fp32", 70 * T, "4096×4096 float32", 20)
    tf = Measurement("cuda:0", "tf32", 150 * T, "8192×8192 float32", 20)
    card = _card(S.HEALTHY_4090, fp32, tf, env=with_cuda_torch)
    (f,) = tf32_off(card, {"torch.get_float32_matmul_precision()": "highest"})
    assert f.title == "float32 matmuls without TF32: 70.0 TFLOP/s instead of 150 TFLOP/s"
    assert "set_float32_matmul_precision('high')" in f.fix
    assert tf32_off(card, {"torch.get_float32_matmul_precision()": "high"}) == []
    pinned = Measurement("cuda:0", "h2d_pinned", 25e9, "256 MiB", 10)
    pageable = Measurement("cuda:0", "h2d_pageable", 9e9, "256 MiB", 10)
    (f,) = pinned_copies(_card(S.HEALTHY_4090, pinned, pageable, env=with_cuda_torch))
    assert f.code == "pageable-copies" and "pin_memory=True" in f.fix


def test_too_many_torch_threads_is_found_with_the_measured_figures(nvml, here):
    usable = here.cpu.usable
    saved = torch.get_num_threads()
    torch.set_num_threads(usable + 2)
    try:
        r = gpucheck(seconds=0.02)
    finally:
        torch.set_num_threads(saved)
    assert last_check() is r
    f = next(f for f in r.findings if f.code == "threads-oversubscribed")
    assert f.title == f"torch uses {usable + 2} threads on {usable} usable CPUs"
    assert f"with {usable + 2} threads" in f.evidence and "with one" in f.evidence
    assert f.fix.startswith(f"torch.set_num_threads({usable})")
    assert f.cost == pytest.approx(1 - usable / (usable + 2))


def test_a_cpu_only_torch_beside_a_driver_nvml_cannot_read():
    from gpumagic.environment.check.judge import cpu_only_torch

    host = HostFacts("2.13.0+cpu", "CPU-only", False, True, "570.124.06", 2, 2, 2)
    (f,) = cpu_only_torch([], host)
    assert f.code == "cpu-only-torch" and f.title == "a CPU-only torch beside an NVIDIA driver"
    assert f.evidence == "torch 2.13.0+cpu (CPU-only); the NVIDIA driver 570.124.06 is loaded"
    no_driver = HostFacts("2.13.0+cpu", "CPU-only", False, False, None, 2, 2, 2)
    assert cpu_only_torch([], no_driver) == []


def test_few_threads_on_many_cpus_is_a_note():
    host = HostFacts("2.13.0", "CUDA 12.8", True, True, "570.1", torch_threads=2, usable_cpus=16, affinity=16)
    (f,) = threads(host)
    assert f.code == "threads-few" and f.level == "info" and f.cost == pytest.approx(1 - 2 / 16)
    assert threads(HostFacts("2.13.0", "CUDA 12.8", True, True, None, 16, 16, 16)) == []


def test_the_result_is_data(nvml, with_cuda_torch):
    r = run_check(nvml=nvml([S.POWER_CAPPED_4090]), env=with_cuda_torch, seconds=0.01)
    frame = r.measurements
    assert list(frame.columns) == ["device", "key", "figure", "value", "unit", "spec", "ratio", "source", "size", "calls"]
    assert set(frame["device"]) == {"host"} and (frame["value"] > 0).all()
    data = json.loads(json.dumps(r.to_dict()))
    assert data["cards"][0]["reading"]["power_limit"] == 250.0
    assert data["cards"][0]["spec_name"] == "RTX 4090"
    assert data["findings"][0]["code"] == "power-capped"
    assert data["host"]["measurements"][0]["key"] == "cpu_matmul"
    assert os.getpid() not in (data["cards"][0]["reading"]["other_processes"] or [])


# --- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpucheck_on_a_gpu_measures_each_card_and_gives_its_memory_back():
    """Every figure of cuda:0 measured and set beside the specification where the table has
    one, NVML read under load, the user's TF32 setting and the allocator's memory as they were
    (the plausible ranges against the specification are tools/gpu_cells.py's gpucheck)."""
    flags = _torch_flags(torch)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated(0)
    r = gpucheck(seconds=0.1, devices=[0])
    assert _torch_flags(torch) == flags
    assert torch.cuda.memory_allocated(0) == allocated
    (card,) = r.cards
    assert card.cuda_index == 0 and card.reading.name == torch.cuda.get_device_name(0)
    keys = [m.key for m in card.measurements]
    assert keys == ["fp32", "tf32", "bf16", "fp16", "memory", "h2d_pinned", "d2h_pinned",
                    "h2d_pageable", "d2h_pageable", "launch"]  # fmt: skip
    assert all(m.value > 0 and m.calls >= 3 and m.device == "cuda:0" for m in card.measurements)
    if card.specs is not None:
        assert all(m.spec and m.spec_source for m in card.measurements if m.key in ("bf16", "memory"))
    assert card.load is not None and card.load.sm_clock and card.load.sm_clock > 0
    assert card.link_load is not None and card.link_load.pcie_gen
    assert "cpu-only-torch" not in r.codes
