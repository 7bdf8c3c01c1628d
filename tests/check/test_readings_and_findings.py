"""%gpucheck's readings through NVML alone, on recorded card states (the NVML double answers as
nvidia-ml-py does, NotSupported where a card would), each fault named with its cause, evidence
and fix; a healthy card gives a plain "nothing found"."""

from __future__ import annotations

import dataclasses

import card_states as S
import pynvml
import pytest

from gpumagic.clock_events import name_reasons, read_clock_events
from gpumagic.environment.check.findings import pcie_link, power_capped, thermal
from gpumagic.environment.check.measurements import LoadSample
from gpumagic.environment.check.run import run_check


def check(nvml, cards, env, **kw):
    fake = nvml(cards)
    result = run_check(measure=False, nvml=fake, env=env, **kw)
    assert fake.open == 0, "nvmlInit and nvmlShutdown do not balance"
    return result


def only(result, code):
    found = [f for f in result.findings if f.code == code]
    assert len(found) == 1, result.codes
    return found[0]


def test_a_healthy_card_gives_nothing_found(nvml, with_cuda_torch):
    r = check(nvml, [S.HEALTHY_4090], with_cuda_torch)
    assert r.findings == []
    card = r.cards[0]
    assert (card.label, card.spec_name, card.specs.form) == ("cuda:0", "RTX 4090", "PCIe")
    # a link at Gen 1 while idle is the card saving power, not a fault
    assert card.reading.pcie.gen == 1 and card.reading.pcie.gen_max == 4
    text = r._text()
    assert "Nothing found: the readings match each card's defaults." in text
    assert "slot Gen 4 x16; card Gen 4 (specification Gen 4 x16)" in text
    # what the card cannot give is named, not guessed: a GeForce card has no ECC
    assert card.reading.unreadable == {"ECC mode": "not supported on this card"}
    assert "not readable here: ECC mode: not supported on this card" in text
    assert "gm-nothing-found" in r._html()


def test_a_power_capped_4090(nvml, with_cuda_torch):
    r = check(nvml, [S.POWER_CAPPED_4090], with_cuda_torch)
    f = only(r, "power-capped")
    assert r.codes == ["power-capped"] and f.level == "warning" and f.device == "cuda:0"
    assert f.title == "power limit 250 W of a default 450 W"
    assert "enforced limit 250 W, default 450 W (allowed 150 W–600 W)" in f.evidence
    assert "SM clock" not in f.evidence  # at rest the idle clock says nothing
    assert f.fix.startswith("`sudo nvidia-smi -i 0 -pl 450` as root")
    assert f.cost == pytest.approx(1 - 250 / 450)
    # under load the clocks it holds are the evidence (the "holds 1.4 GHz")
    loaded = dataclasses.replace(
        r.cards[0], load=LoadSample(sm_clock=1410, power_draw=249.0, clock_events=("sw_power_cap",))
    )
    (f,) = power_capped(loaded)
    assert "drawing 249 W; SM clock 1410 MHz of 3120 MHz under load (sw_power_cap active)" in f.evidence


def test_a_thermally_throttled_card(nvml, with_cuda_torch):
    r = check(nvml, [S.THERMAL_3090], with_cuda_torch)
    f = only(r, "thermal")
    assert r.codes == ["thermal"] and f.level == "warning"
    assert f.title.startswith("93 °C, slowdown at 95 °C: clocks held down (")
    assert "hw_thermal_slowdown" in f.title and "sw_thermal_slowdown" in f.title
    assert "SM clock 1005 MHz of 2100 MHz at the reading" in f.evidence
    assert f.cost == pytest.approx(1 - 1005 / 2100)
    assert "fans" in f.fix and "-pl" in f.fix
    # close to the threshold with no slowdown yet: a note, no cost
    warm = dataclasses.replace(r.cards[0].reading, clock_events=name_reasons(0))
    (note,) = thermal(dataclasses.replace(r.cards[0], reading=warm))
    assert note.level == "info" and note.title.endswith("close to slowing down") and note.cost is None


def test_a_gen3_x4_link(nvml, with_cuda_torch):
    r = check(nvml, [S.GEN3_X4_3090], with_cuda_torch)
    f = only(r, "pcie-link")
    assert r.codes == ["pcie-link"]
    assert f.title == "PCIe link Gen 3 x4 (3.9 GB/s) where the card does Gen 4 x16 (31.5 GB/s)"
    assert "the slot allows Gen 3, the card does Gen 4" in f.evidence
    assert "the slot gives x4 of the card's x16" in f.evidence
    assert f.cost == pytest.approx(1 - 8 * 128 / 130 * 4 / (16 * 128 / 130 * 16))
    # a full slot whose link stays below its generation under a copy is named too
    healthy = check(nvml, [S.HEALTHY_4090], with_cuda_torch).cards[0]
    (f,) = pcie_link(dataclasses.replace(healthy, link_load=LoadSample(pcie_gen=3, pcie_width=16)))
    assert "under a copy the link stayed at Gen 3 of Gen 4" in f.evidence


@pytest.mark.parametrize("visible", [None, S.MIG_1G])
def test_mig_slices(nvml, with_cuda_torch, monkeypatch, visible):
    fake = nvml([S.MIG_A100])
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    r = run_check(measure=False, nvml=fake, env=with_cuda_torch)
    assert len(r.cards) == 1 and r.cards[0].reading.visible
    f = only(r, "mig-slice")
    assert r.codes == ["mig-slice"]
    assert f.title == "MIG mode: NVIDIA A100-SXM4-80GB MIG 1g.10gb of the NVIDIA A100-SXM4-80GB"
    assert "NVIDIA A100-SXM4-80GB MIG 3g.40gb (39.2 GiB)" in f.evidence  # the empty slot is skipped
    assert "the first holds 1 of 7 compute slices" in f.evidence
    assert f.cost == pytest.approx(6 / 7)
    assert "-mig 0" in f.fix


def test_ecc_errors_and_remapped_rows(nvml, with_cuda_torch):
    r = check(nvml, [S.ECC_A100], with_cuda_torch)
    assert r.codes == ["ecc-errors", "ecc-pending"]  # the error first
    errors, pending = r.findings
    assert errors.level == "error" and pending.level == "warning"
    assert "2 uncorrectable errors since the driver loaded" in errors.evidence
    assert "5 uncorrectable errors in the card's life" in errors.evidence
    assert "5 rows remapped" in errors.evidence
    assert "sudo nvidia-smi -r -i 0" in errors.fix and "replacing" in errors.fix
    assert pending.title == "memory rows waiting to be remapped"
    e = r.cards[0].reading.ecc
    assert (e.volatile_corrected, e.aggregate_corrected, e.remap_failed) == (12, 40, False)


def test_retired_pages_before_ampere(nvml, with_cuda_torch):
    r = check(nvml, [S.RETIRED_V100], with_cuda_torch)
    f = only(r, "ecc-pending")
    assert r.codes == ["ecc-pending"]
    assert f.title == "memory pages waiting to be retired"
    assert "3 pages retired so far" in f.evidence
    reading = r.cards[0].reading
    assert reading.ecc.rows_remapped is None and reading.ecc.retired_pages == 3
    assert reading.unreadable == {}  # no remapped rows before Ampere, no MIG: not faults


def test_persistence_off(nvml, with_cuda_torch):
    r = check(nvml, [S.PERSISTENCE_OFF_H100], with_cuda_torch)
    f = only(r, "persistence-off")
    assert r.codes == ["persistence-off"] and f.level == "info" and f.cost is None
    assert "`sudo nvidia-smi -i 0 -pm 1`" in f.fix
    assert r.cards[0].spec_name == "H100 80GB"


def test_what_nvml_cannot_read_is_named_and_never_judged(nvml, with_cuda_torch):
    blind = S.card(
        power_limit_mw=250_000,
        unsupported={"nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetPersistenceMode"},
        no_permission={"nvmlDeviceGetTemperatureThreshold"},
    )
    r = check(nvml, [blind], with_cuda_torch)
    unreadable = r.cards[0].reading.unreadable
    assert unreadable["default power limit"] == "not supported on this card"
    assert unreadable["persistence mode"] == "not supported on this card"
    assert unreadable["slowdown temperature"] == "needs root"
    assert r.findings == []  # no default to judge the 250 W against: no guess
    assert "default power limit: not supported on this card" in r._text()


def test_a_card_nvml_cannot_open_leaves_the_others_read(nvml, with_cuda_torch):
    class LostOne(type(nvml([]))):
        def nvmlDeviceGetHandleByIndex(self, index):
            if index == 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return index

    fake = LostOne([S.HEALTHY_4090, S.POWER_CAPPED_4090])
    r = run_check(measure=False, nvml=fake, env=with_cuda_torch)
    lost, capped = r.cards
    assert capped.reading.power_limit == 250.0
    assert lost.reading.unreadable == {"the card": "NVMLError_GpuIsLost: GPU is lost"}
    assert r.codes == ["power-capped"] and r.findings[0].device == "cuda:1"


def test_no_nvml_says_why(nvml, with_cuda_torch):
    class NoDriver(type(nvml([]))):
        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    r = run_check(measure=False, nvml=NoDriver([]), env=with_cuda_torch)
    assert r.cards == [] and r.findings == []
    assert r.unchecked[0] == (
        "Not read: the cards' clocks, power, PCIe link, temperature, ECC and MIG: "
        "the NVIDIA driver is not loaded."
    )


def test_findings_are_ranked_errors_first_then_by_cost(nvml, with_cuda_torch, monkeypatch):
    cards = [S.POWER_CAPPED_4090, S.THERMAL_3090, S.ECC_A100]
    r = check(nvml, cards, with_cuda_torch)
    assert r.codes == ["ecc-errors", "thermal", "power-capped", "ecc-pending"]
    assert [f.device for f in r.findings] == ["cuda:2", "cuda:1", "cuda:0", "cuda:2"]
    text = r._text()
    assert text.index("✖ error · cuda:2") < text.index("! warning · cuda:1") < text.index("! warning · cuda:0")


def test_cuda_visible_devices_pointing_at_the_busy_card(nvml, with_cuda_torch, monkeypatch):
    busy = S.card(utilization=97, processes=[(4242, 20 * 2**30)], memory_used=20 * 2**30)
    idle = S.card(uuid="GPU-40904090-0000-0000-0000-000000000009")
    fake = nvml([busy, idle])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    r = run_check(measure=False, nvml=fake, env=with_cuda_torch)
    assert [c.reading.nvml_index for c in r.cards] == [0]
    assert set(r.codes) == {"gpu-busy", "busy-card-chosen"}
    chosen = only(r, "busy-card-chosen")
    assert "GPU 1" in chosen.title and "CUDA_VISIBLE_DEVICES=1" in chosen.fix
    assert "compute processes NVML lists: 4242" in only(r, "gpu-busy").evidence
    # a process NVML lists on an idle card (in a container: maybe this kernel) is no finding
    held = check(nvml, [S.card(processes=[(4242, 2**30)])], with_cuda_torch)
    assert held.findings == [] and held.cards[0].reading.other_processes == [4242]


def test_a_cpu_only_torch_beside_a_driver_is_the_first_finding(nvml, here, ip, run):
    if here.torch_build != "CPU-only":
        pytest.skip("needs torch's CPU build")
    nvml([S.POWER_CAPPED_4090])
    out = run("%gpucheck --no-measure")
    assert out.result.success, out.result.error_in_exec
    r = ip.user_ns["_gpucheck"]
    assert r.codes == ["cpu-only-torch", "power-capped"]
    first = r.findings[0]
    assert first.level == "error" and "NVML lists NVIDIA GeForce RTX 4090 (driver 570.124.06)" in first.evidence
    assert "--index-url" in first.fix
    # the card is still judged through NVML, with a CPU-only torch
    assert r.cards[0].reading.power_limit == 250.0
    html = out.html()
    assert 'data-code="cpu-only-torch"' in html and 'data-code="power-capped"' in html


def test_names_from_the_card_are_escaped(nvml, with_cuda_torch):
    r = check(nvml, [S.card(name="NVIDIA <b>Odd</b> & Co", power_limit_mw=200_000)], with_cuda_torch)
    html = r._html()
    assert "<b>Odd</b>" not in html and "&lt;b&gt;Odd&lt;/b&gt; &amp; Co" in html
    assert r.cards[0].no_specs == "NVIDIA <b>Odd</b> & Co is not in gpumagic's card table"


def test_clock_event_reasons_are_read_and_named_for_any_core():
    class OldDriver:
        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            return 0x4 | 0x40 | 0x1000

    events = read_clock_events(OldDriver(), 0)
    assert events.names == ("sw_power_cap", "hw_thermal_slowdown", "unknown_0x1000")
    assert events.thermal and events.slowing == events.names

    class NotSupported:
        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    with pytest.raises(pynvml.NVMLError_NotSupported):
        read_clock_events(NotSupported(), 0)
    assert name_reasons(0x1 | 0x10).slowing == ()  # idle and sync boost slow nothing
