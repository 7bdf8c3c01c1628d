"""The one place numbers become text and text becomes numbers: bytes and microseconds
internally, human units on display, and the sizes, durations, prices and percentages users
type into the magics' options and the scripting API."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

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


def fmt_percent(p: float | None, signed: bool = False, digits: int | None = None) -> str:
    """``3.1%``, ``42%``: one decimal under 10 (``digits`` fixes it: 0 for a chart's axis)."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    sign = "+" if signed and p > 0 else ""
    if digits is None:
        digits = 1 if abs(p) < 10 else 0
    return f"{sign}{p:.{digits}f}%"


def fmt_gbps(gbps: float | None) -> str:
    """A bandwidth in GB/s (10^9 bytes per second, as nccl-tests prints it)."""
    if gbps is None or (isinstance(gbps, float) and math.isnan(gbps)):
        return "–"
    if gbps < 1:
        return f"{gbps * 1000:.0f} MB/s" if gbps >= 0.001 else f"{gbps * 1e6:.0f} kB/s"
    return f"{gbps:.1f} GB/s" if gbps < 100 else f"{gbps:.0f} GB/s"


def fmt_flops(flops: float | None) -> str:
    """A throughput in FLOP/s, in the prefix that reads best: ``989 TFLOP/s``, ``45.2 GFLOP/s``."""
    if flops is None or (isinstance(flops, float) and math.isnan(flops)):
        return "–"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(flops) >= scale:
            value = flops / scale
            return f"{value:.{0 if value >= 100 else 1}f} {prefix}FLOP/s"
    return f"{flops:.0f} FLOP/s"


def fmt_mean_count(n: float) -> str:
    """A count averaged over steps: whole when whole or in the hundreds, else one decimal
    (``2.5``, ``17.5``: a finding's text quotes the number its evidence holds)."""
    return f"{n:.0f}" if n >= 100 or float(n).is_integer() else f"{n:.1f}"


def fmt_count(n: float | int | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    return f"{int(n):,}"


def fmt_text(value: object) -> str:
    """Any value as text, "–" for a missing one (None, NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return str(value)


def fmt_number(value: float | None) -> str:
    """A plain ratio (blocks per SM): two decimals under 10, whole above."""
    if value is None or math.isnan(value):
        return "–"
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def fmt_pp(delta: float | None) -> str:
    """A change between two percentages, in percentage points: ``+1.2 pp``."""
    if delta is None or math.isnan(delta):
        return "–"
    return f"{delta:+.1f} pp"


def fmt_interval(
    interval: tuple[float, float] | None,
    fmt: Callable[[float], str] = lambda v: fmt_percent(v, signed=True),
    confidence: float = 0.95,
) -> str:
    """A confidence interval: ``95% CI -9.1% to -6.4%`` ("no interval" for None)."""
    if interval is None:
        return "no interval"
    return f"{100 * confidence:.0f}% CI {fmt(interval[0])} to {fmt(interval[1])}"


def fmt_named(key: str, value: object) -> str:
    """A number by the unit its name ends in (the package's column naming: ``*_us``,
    ``*_us_per_step``, ``*bytes``, ``*percent``); a whole count or the value as text otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–" if value is None else str(value)
    if key.endswith(("_us", "_us_per_step")):
        return fmt_us(value)
    if key.endswith(("bytes", "bytes_per_step")):
        return fmt_bytes(value)
    if key.endswith("percent"):
        return fmt_percent(value)
    if isinstance(value, float) and math.isnan(value):
        return "–"
    return f"{int(value):,}" if isinstance(value, int) or value.is_integer() else f"{value:g}"


def _whole(value: float | None, unit: str) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.0f} {unit}"


def fmt_celsius(value: float | None) -> str:
    return _whole(value, "°C")


def fmt_watts(value: float | None) -> str:
    return _whole(value, "W")


def fmt_mhz(value: float | None) -> str:
    return _whole(value, "MHz")


def fmt_seconds(s: float) -> str:
    """Seconds: whole minutes read as ``5 min`` (``fmt_us`` would say ``5 min 0 s`` for
    ``%gpuwatch``'s default window); anything else as :func:`fmt_us` says it."""
    if s >= 120 and float(s).is_integer() and s % 60 == 0:
        return f"{int(s) // 60} min"
    return fmt_us(s * 1e6)


def fmt_clock(t: float) -> str:
    """A wall-clock time (seconds since the epoch) as local ``HH:MM:SS``."""
    from datetime import datetime

    return datetime.fromtimestamp(t).strftime("%H:%M:%S")


def fmt_usd(value: float) -> str:
    """Dollars: cents, or four decimals for the fractions of a cent a short cell costs."""
    if math.isnan(value):
        return "–"
    if 0 < value < 0.0001:
        return "<$0.0001"
    if value != 0 and abs(value) < 0.01:
        return f"${value:.4f}"
    return f"${value:,.2f}"


def fmt_wh(value: float) -> str:
    """Energy in watt-hours, in mWh or kWh where those read better."""
    if math.isnan(value):
        return "–"
    if value >= 1000:
        return f"{value / 1000:.2f} kWh"
    if value < 0.01:
        return f"{value * 1000:.2f} mWh"
    return f"{value:.2f} Wh" if value < 10 else f"{value:.1f} Wh"


# --- parsing what users type ---------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
# K/M/G/T and KiB/MiB/GiB/TiB are binary, as nvidia-smi's MiB; KB/MB/GB/TB are decimal.
_SIZE_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", 1):
    _SIZE_UNITS[_p] = _SIZE_UNITS[f"{_p}ib"] = 1024**_i
    _SIZE_UNITS[f"{_p}b"] = 1000**_i


def parse_size(value: int | float | str) -> int:
    """Bytes from ``8GiB``, ``8G`` (both binary, as nvidia-smi's MiB), ``8GB`` (decimal),
    ``500MiB`` or a plain number of bytes; ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"size must be like 8GiB, 500MiB or bytes, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        m = _SIZE.match(str(value))
        if m is None:
            raise ValueError(f"size must be like 8GiB, 24GB, 500MiB or bytes, got {value!r}")
        number, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(
            f"size unit {unit!r} in {value!r} unknown: use B, KiB/MiB/GiB/TiB (K, M, G, T are "
            "the same) or KB/MB/GB/TB (powers of 1000)"
        )
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"size must be a number of bytes >= 0, got {value!r}")
    return int(number * _SIZE_UNITS[unit])


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(h|m|s)?")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, None: 1.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``"30m"``, ``"2h"``, ``"1h30m"``, ``"90s"`` or a bare number of seconds.

    Strict: anything else (empty, negative, zero, ``"5x"``, ``"m"``, NaN) is a ValueError
    that names what was given, so a typo never becomes a silent default.
    """
    if isinstance(text, bool):
        raise ValueError(f"duration must be like 30m, 2h or 90 (seconds), got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip().lower()
        pos, value, units_seen = 0, 0.0, []
        while pos < len(s):
            m = _DURATION.match(s, pos)
            if m is None or m.end() == pos:
                value = math.nan
                break
            units_seen.append(m.group(2))
            value += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
            while pos < len(s) and s[pos] == " ":
                pos += 1
        # "1h30m" reads as one duration; a bare number only stands alone ("1h30" is a typo).
        if not units_seen or (len(units_seen) > 1 and None in units_seen):
            value = math.nan
        if len(set(units_seen)) != len(units_seen):
            value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"duration must be a positive time like 30m, 2h, 1h30m or 90 (seconds), got {text!r}"
        )
    return value


def parse_price(price: float | str | None) -> float | None:
    """Dollars per hour: a finite number >= 0 (None: no price, no cost columns)."""
    if price is None:
        return None
    if isinstance(price, bool):
        raise ValueError(f"price must be dollars per hour, like 2.5, got {price!r}")
    try:
        value = float(price)
    except (TypeError, ValueError):
        raise ValueError(f"price must be dollars per hour, like 2.5, got {price!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"price must be a finite number of dollars per hour >= 0, got {price!r}")
    return value


def parse_percent(text: str | float) -> float:
    """A percentage from ``50``, ``"50"`` or ``"50%"``; ValueError for anything else (the
    range is the caller's to check: a utilisation cap and a share differ)."""
    if isinstance(text, bool):
        raise ValueError(f"must be a percentage, got {text!r}")
    try:
        return float(text.strip().rstrip("%") if isinstance(text, str) else text)
    except ValueError:
        raise ValueError(f"must be a percentage, got {text!r}") from None
