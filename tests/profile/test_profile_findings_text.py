"""A finding's words and its evidence say the same numbers, on every shared trace.

Every number a finding's message quotes (a count, a duration, a share, a size) must be one
its evidence holds (or its saving), to the precision the message prints it with: a reader
who checks "41 synchronisations per step" against ``host_syncs_per_step: 21`` must find
where the 41 comes from. Numbers that are not measurements (``num_workers=0``, ``< 1``)
are no quotes.
"""

from __future__ import annotations

import re

import pytest
from profile_helpers import ALL_TRACES

# a number not glued to a word (fp32, x16, sm_80) or an assignment, and its unit
_QUOTE = re.compile(
    r"(?<![\w.=#/-])(\d+(?:\.\d+)?)(?:\s?(µs|ms|s|min|%|B|KiB|MiB|GiB|TiB))?(?![\w.])"
)
_SCALE = {
    None: 1.0,
    "µs": 1.0,
    "ms": 1e3,
    "s": 1e6,
    "min": 6e7,
    "%": 1.0,
    "B": 1.0,
    "KiB": 1024.0,
    "MiB": 1024.0**2,
    "GiB": 1024.0**3,
    "TiB": 1024.0**4,
}


def quotes(message: str) -> list[tuple[str, float, float]]:
    """(as printed, value in the evidence's unit, half of the last printed digit) per number."""
    out = []
    for m in _QUOTE.finditer(message):
        before = message[max(0, m.start() - 2) : m.start()]
        if before.strip() in ("<", ">"):  # a threshold, not a measurement
            continue
        digits, unit = m.group(1), m.group(2)
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        scale = _SCALE[unit]
        out.append((m.group(0), float(digits) * scale, 0.5 * 10**-decimals * scale))
    return out


def numbers(f) -> list[float]:
    values = [f.saving_us]
    for v in f.evidence.values():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            values.append(float(v))
        else:
            try:
                values.append(float(v))
            except ValueError:
                pass
    return values


def disagreements(f) -> list[str]:
    known = numbers(f)
    return [
        printed
        for printed, value, half in quotes(f.message)
        # the evidence keeps one or two decimals: allow its own rounding too
        if not any(abs(v - value) <= half * 1.0001 + 0.051 * max(1.0, half) for v in known)
    ]


@pytest.mark.parametrize("name", ALL_TRACES)
@pytest.mark.parametrize("keep_startup", [False, True])
def test_every_number_a_finding_quotes_is_in_its_evidence(load, name, keep_startup):
    r = load(name, keep_startup=keep_startup)
    for f in r.findings:
        assert not disagreements(f), (f.rule, disagreements(f), f.message, f.evidence)


def test_the_quote_reader_finds_what_a_reader_would_check():
    q = quotes("Up to 41 synchronisations per step (21 calls); 1.2 s per step, 65% of 18.4 MiB")
    assert [p for p, _, _ in q] == ["41", "21", "1.2 s", "65%", "18.4 MiB"]
    assert q[2][1] == pytest.approx(1.2e6) and q[2][2] == pytest.approx(0.05e6)
    assert quotes("num_workers=0 with fp32 and x16 (blocks per SM < 1)") == []


def test_the_sync_message_names_each_count_its_evidence_holds(load):
    f = {f.rule: f for f in load("a100_alexnet_syncs.json.gz", keep_startup=True).findings}["sync"]
    # the device records 41 synchronisation events per step, the host makes 21 calls: the
    # message says both, and which is which, where it used to say "41 device synchronisations"
    assert f.evidence["synchronisations_per_step"] == 41
    assert "21 synchronising runtime calls" in f.message
    assert "41 synchronisation events on the device" in f.message
    assert not disagreements(f)


def test_a_number_the_evidence_lacks_is_a_disagreement():
    from gpumagic.profile.rules.base import Finding

    f = Finding(
        "sync",
        "t",
        "low",
        5.0,
        "41 device synchronisations per step, 2.5 ms idle",
        {"host_syncs_per_step": 21.0, "idle_us": 2500.0},
    )
    assert disagreements(f) == ["41"]
