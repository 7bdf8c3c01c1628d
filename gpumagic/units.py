"""The one place numbers become text: bytes and microseconds internally, human units on display."""

from __future__ import annotations

import math

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: float | int | None, signed: bool = False, digits: int | None = None) -> str:
    """``1536 -> '1.5 KiB'``; ``signed=True`` prefixes ``+`` on positive values (deltas);
    ``digits`` fixes the decimals (for two sizes that would otherwise print alike)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    sign = ""
    if n < 0:
        sign = "-"
    elif signed and n > 0:
        sign = "+"
    value = float(abs(n))
    unit = 0
    while value >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(value)} B"
    if digits is None:
        digits = 0 if value >= 100 else 1
    return f"{sign}{value:.{digits}f} {_BYTE_UNITS[unit]}"


def fmt_us(us: float | int | None, signed: bool = False) -> str:
    """Microseconds to the unit that reads best: ``3200 -> '3.2 ms'``."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "–"
    sign = ""
    if us < 0:
        sign = "-"
    elif signed and us > 0:
        sign = "+"
    value = abs(float(us))
    if value < 1000:
        return f"{sign}{value:.{0 if value >= 100 else 1}f} µs"
    if value < 1_000_000:
        ms = value / 1000
        return f"{sign}{ms:.{0 if ms >= 100 else 1}f} ms"
    s = value / 1_000_000
    if s < 120:
        return f"{sign}{s:.{1 if s < 100 else 0}f} s"
    minutes, seconds = divmod(s, 60)
    return f"{sign}{int(minutes)} min {seconds:.0f} s"


def fmt_percent(p: float | None, signed: bool = False) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    sign = "+" if signed and p > 0 else ""
    return f"{sign}{p:.1f}%" if abs(p) < 10 else f"{sign}{p:.0f}%"


def fmt_gbps(gbps: float | None) -> str:
    """A bandwidth in GB/s (10^9 bytes per second, as nccl-tests prints it)."""
    if gbps is None or (isinstance(gbps, float) and math.isnan(gbps)):
        return "–"
    if gbps < 1:
        return f"{gbps * 1000:.0f} MB/s" if gbps >= 0.001 else f"{gbps * 1e6:.0f} kB/s"
    return f"{gbps:.1f} GB/s" if gbps < 100 else f"{gbps:.0f} GB/s"


def fmt_mean_count(n: float) -> str:
    """A count averaged over steps: whole when large or whole, else one decimal (``2.5``)."""
    return f"{n:.0f}" if n >= 10 or float(n).is_integer() else f"{n:.1f}"


def fmt_count(n: float | int | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    return f"{int(n):,}"
