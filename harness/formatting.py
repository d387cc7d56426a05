"""Human-readable numbers for metric values, the one formatter of the project: the dashboard and the bench's
terminal table both show figures through it (bytes in KiB/MiB/GiB, times in ms/µs, rates in k/M)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# unit -> [(factor, shown unit)], largest first; a value is shown in the first scale it reaches.
_SCALES: dict[str, list[tuple[float, str]]] = {
    "s": [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")],
    "bytes": [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")],
    "B": [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")],
    "B/s": [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s")],
    "calls/s": [(1e9, "G calls/s"), (1e6, "M calls/s"), (1e3, "k calls/s"), (1.0, "calls/s")],
}


@dataclass(frozen=True)
class ShownValue:
    """``value ± spread unit`` ready for a table cell; ``text`` is empty when there is no value."""

    value: str
    spread: str
    unit: str
    n: str
    note: str

    @property
    def text(self) -> str:
        parts = [self.value]
        if self.spread:
            parts.append(f"± {self.spread}")
        if self.unit:
            parts.append(self.unit)
        return " ".join(parts) if self.value else ""


def number(value: object) -> float | None:
    """A finite float, or None for anything else (bools, strings, NaN, missing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def scale_for(unit: str, magnitude: float) -> tuple[float, str]:
    scales = _SCALES.get(unit)
    if not scales:
        return 1.0, unit
    for factor, shown in scales:
        if magnitude >= factor:
            return factor, shown
    return scales[-1]


def significant(value: float, digits: int = 4) -> str:
    """``digits`` significant figures without scientific notation in the usual ranges."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 10**digits:
        return f"{value:,.0f}"
    if magnitude < 1e-4:
        return f"{value:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(magnitude)))
    return f"{value:.{decimals}f}"


def show_metric(metric: Mapping[str, Any]) -> ShownValue:
    """A metric dict (``unit``, ``value``, ``spread``, ``n``) as text; odd values are shown, not hidden."""
    unit = str(metric.get("unit") or "")
    raw = metric.get("value")
    value = number(raw)
    n = metric.get("n")
    n_text = f"n={n}" if isinstance(n, int) and not isinstance(n, bool) else ""
    note = str(metric.get("note") or metric.get("status") or "")
    if value is None:
        # "unsupported" measurements must read as such, never as a number.
        shown = "" if raw is None else str(raw)
        return ShownValue(shown or note or "n/a", "", "" if not shown else unit, n_text, note)
    spread = number(metric.get("spread"))
    factor, shown_unit = scale_for(unit, max(abs(value), abs(spread or 0.0)) if value == 0 else abs(value))
    spread_text = "" if spread is None else significant(spread / factor, 2)
    if unit == "x":
        return ShownValue(significant(value / factor), spread_text, "×", n_text, note)
    return ShownValue(significant(value / factor), spread_text, shown_unit, n_text, note)


def show_quantity(value: float | None, unit: str) -> str:
    """One number with a unit, scaled like ``show_metric`` does it."""
    if value is None:
        return "n/a"
    factor, shown_unit = scale_for(unit, abs(value))
    shown_unit = "×" if unit == "x" else shown_unit
    return f"{significant(value / factor)} {shown_unit}".strip()


def show_bytes(count: object) -> str:
    value = number(count)
    return "" if value is None else show_quantity(value, "bytes")


def show_relative(value: float | None, spread: float | None, unit: str) -> str:
    """``1.23 ms ±1.0%``: the value scaled as everywhere else, the spread relative (for a terminal line)."""
    if value is None:
        return "n/a"
    text = show_quantity(value, unit)
    if spread is not None and value:
        text += f" ±{100 * spread / abs(value):.1f}%"
    return text


def show_duration(seconds: float | None) -> str:
    """A wall-clock span as a person reads it: ``45 s``, ``2 min 10 s``; ``n/a`` for no value."""
    value = number(seconds)
    if value is None:
        return "n/a"
    value = max(0.0, value)
    if value < 60:
        return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"
    minutes, rest = divmod(round(value), 60)
    return f"{minutes} min {rest:02d} s"
