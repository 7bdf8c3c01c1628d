"""Issue 29 item 3 beside item 1: a cell watched on a recorded thermally throttled card is
marked with the clock-event reasons %gpucheck reads and judges on the same card, named from
the one table of them (gpumagic/clock_events.py), and the summary sends the user to it."""

from __future__ import annotations

import card_states as S

import gpumagic
from gpumagic.environment.check.run import run_check


def test_the_watch_marks_the_reasons_the_check_names(nvml, ip, with_cuda_torch):
    fake = nvml([S.THERMAL_3090])
    w = gpumagic.watch(interval=0.1, shell=ip)
    try:
        ip.user_ns["_w"] = w
        cell = ip.run_cell("_w.sample_now()", store_history=True)
    finally:
        result = w.stop()
        ip.user_ns.pop("_w", None)
    (shares,) = result.cells.set_index("execution_count").loc[[cell.execution_count], "clock_events"]
    assert shares == {
        "cuda:0": {"hw_slowdown": 1.0, "sw_thermal_slowdown": 1.0, "hw_thermal_slowdown": 1.0}
    }
    said = (
        "GPU 0 was slowed to half its clocks or less by its hardware and slowed by heat during "
        f"100% of cell In[{cell.execution_count}]: see %gpucheck"
    )
    assert said in str(result)

    check = run_check(measure=False, nvml=fake, env=with_cuda_torch)
    assert check.codes == ["thermal"]
    events = check.cards[0].reading.clock_events
    assert events is not None and set(events.names) == set(shares["cuda:0"])
