"""The one place numbers become text and text becomes numbers (``gpumagic.units``): the
parsers strict (a typo is an error that names what was given, never a silent default), the
formatters readable at a glance, with "–" for a missing value."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gpumagic.units import (
    fmt_bytes,
    fmt_celsius,
    fmt_clock,
    fmt_mhz,
    fmt_named,
    fmt_number,
    fmt_percent,
    fmt_pp,
    fmt_seconds,
    fmt_text,
    fmt_us,
    fmt_usd,
    fmt_watts,
    fmt_wh,
    parse_duration,
    parse_percent,
    parse_price,
    parse_size,
)

GIB = 1024**3
MIB = 1024**2


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8GiB", 8 * GIB), ("8G", 8 * GIB), ("8 GB", 8 * 10**9), ("500MiB", 500 * MIB), ("1.5g", int(1.5 * GIB)), ("1024", 1024), (2048, 2048)],
)
def test_parse_size(text: Any, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "8XB", "GiB", "-1G", "8 Gi", "ib", True])
def test_parse_size_rejects(text: Any) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("90s", 90), ("45", 45), ("0.5", 0.5), (" 2 h ", 7200), (1.5, 1.5)],
)
def test_parse_duration(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0", "-5m", "5x", "m", "1h30", "30m30m", "nan", "inf", True, 0])
def test_parse_duration_is_strict(text: Any) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "expected"), [("50", 50.0), ("50%", 50.0), (" 7.5 % ", 7.5), (30, 30.0)])
def test_parse_percent(text: Any, expected: float) -> None:
    assert parse_percent(text) == expected


@pytest.mark.parametrize("text", ["lots", "", "%", True])
def test_parse_percent_rejects(text: Any) -> None:
    with pytest.raises(ValueError, match="percentage"):
        parse_percent(text)


@pytest.mark.parametrize(("text", "expected"), [(None, None), ("2.5", 2.5), (0, 0.0), ("3", 3.0)])
def test_parse_price(text: Any, expected: float | None) -> None:
    assert parse_price(text) == expected


@pytest.mark.parametrize("text", ["cheap", "-1", "nan", "inf", True])
def test_parse_price_rejects(text: Any) -> None:
    with pytest.raises(ValueError, match="dollars per hour"):
        parse_price(text)


def test_sizes_durations_and_shares_read_at_a_glance() -> None:
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(-3 * MIB) == "-3.0 MiB"
    assert fmt_bytes(2 * GIB, signed=True) == "+2.0 GiB" and fmt_bytes(512) == "512 B"
    assert fmt_bytes(32 * MIB + 1, digits=3) == "32.000 MiB"
    assert fmt_us(3200) == "3.2 ms" and fmt_us(250) == "250 µs" and fmt_us(-1500, signed=True) == "-1.5 ms"
    assert fmt_us(150e6) == "2 min 30 s"
    assert fmt_percent(3.14159) == "3.1%" and fmt_percent(42.0, signed=True) == "+42%"
    assert fmt_percent(0.0, digits=0) == "0%" and fmt_text(None) == "–" and fmt_text(3) == "3"
    assert fmt_pp(-22.7) == "-22.7 pp" and fmt_number(2.5) == "2.50" and fmt_number(12.4) == "12"


def test_watch_units() -> None:
    assert fmt_celsius(71.6) == "72 °C" and fmt_watts(301.2) == "301 W" and fmt_mhz(1410) == "1410 MHz"
    # the default window reads as minutes, a minute and a half as seconds
    assert fmt_seconds(300) == "5 min" and fmt_seconds(90) == "90.0 s" and fmt_seconds(0.5) == "500 ms"
    assert len(fmt_clock(0.0)) == 8 and fmt_clock(0.0).count(":") == 2


def test_money_and_energy() -> None:
    assert fmt_usd(3.6) == "$3.60" and fmt_usd(1234.5) == "$1,234.50"
    assert fmt_usd(0.004) == "$0.0040" and fmt_usd(0.00001) == "<$0.0001" and fmt_usd(0.0) == "$0.00"
    assert fmt_wh(0.005) == "5.00 mWh" and fmt_wh(2.5) == "2.50 Wh" and fmt_wh(25) == "25.0 Wh"
    assert fmt_wh(2500) == "2.50 kWh"


def test_a_value_named_by_its_unit() -> None:
    assert fmt_named("saving_us_per_step", 3200) == "3.2 ms"
    assert fmt_named("copied_bytes", 2 * MIB) == "2.0 MiB"
    assert fmt_named("gpu_utilization_percent", 12.5) == "12%"
    assert fmt_named("calls", 1234) == "1,234" and fmt_named("per_step", 1462.0) == "1,462" and fmt_named("ratio", 0.25) == "0.25"
    assert fmt_named("kernel", "sgemm") == "sgemm" and fmt_named("calls", None) == "–"


@pytest.mark.parametrize(
    "fmt", [fmt_bytes, fmt_us, fmt_percent, fmt_pp, fmt_number, fmt_celsius, fmt_watts, fmt_mhz, fmt_usd, fmt_wh]
)
def test_a_missing_value_is_a_dash(fmt: Any) -> None:
    assert fmt(math.nan) == "–"
