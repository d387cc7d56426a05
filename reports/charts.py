"""Charts as inline SVG made with matplotlib, so a page needs no network and no script to show them.

Only this module produces markup that templates insert unescaped; matplotlib escapes every text it
writes, and ``_inline`` refuses an SVG that still contains anything active. Without matplotlib the
charts are left out and the pages say so; nothing else depends on it.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.formatting import scale_for
from harness.outcomes import Outcome
from reports import chart_cache

# Outcome colours, shared with the stylesheet's badges; the stacking order of the history chart.
OUTCOME_COLOURS: dict[Outcome, str] = {
    Outcome.PASSED: "#1a7f37",
    Outcome.XFAILED: "#8c959f",
    Outcome.COVERAGE: "#54aeff",
    Outcome.SKIPPED: "#bf8700",
    Outcome.SHOULD_FAILED: "#fb8f44",
    Outcome.FAILED: "#cf222e",
    Outcome.ERROR: "#a40e26",
    Outcome.XPASSED: "#fa4549",
    Outcome.CRASHED: "#6e40c9",
    Outcome.TIMEOUT: "#8250df",
    Outcome.DEVICE_FAULT: "#4c2889",
    Outcome.NOT_RUN: "#d0d7de",
}
_CURRENT, _BASELINE, _GRID, _TEXT = "#0969da", "#57606a", "#d8dee4", "#1f2328"
MAX_BARS = 40
_TICK_CHAR_IN = 0.068  # width of one 8 pt tick-label character, in inches (DejaVu Sans, on average)
# Markup that could run or load something (links to "#id" inside the SVG are fine); text content is
# escaped, so this only needs to look inside tags.
_ACTIVE = re.compile(
    r"<\s*(script|foreignObject|iframe|image|a)\b|<[^>]*\son[a-z]+\s*=|<[^>]*(href|src)\s*=\s*[\"'](?!#)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    spread: float
    baseline: float | None = None
    baseline_spread: float = 0.0


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def bars_note(count: int) -> str:
    """What a chart of ``count`` bars leaves out, in words ("" when it shows them all)."""
    return f"showing the first {MAX_BARS} of {count}" if count > MAX_BARS else ""


def bar_chart(title: str, bars: Sequence[Bar], unit: str, better: str | None) -> str | None:
    """Horizontal bars (median ± spread), baseline as a grey tick when known; None without matplotlib.
    At most ``MAX_BARS`` bars: a chart of more says so on itself ("showing the first 40 of 54")."""
    if not bars or not available():
        return None
    key = repr(("bar", _library_version(), title, tuple(bars), unit, better))
    return chart_cache.cached(key, lambda: _draw_bar_chart(title, bars, unit, better), is_safe)


#: Units drawn on a logarithmic axis: times of one suite span microseconds to seconds (a 64³ and a 8192³
#: GEMM), and on a linear axis the short ones are invisible next to the long ones.
LOG_UNITS = ("s",)
#: How each ``better`` of a metric reads on an axis (harness/records.py's BETTER).
_DIRECTION = {
    "lower": " — lower is better",
    "higher": " — higher is better",
    "near-1": " — closer to 1 is better",
}


def _draw_bar_chart(title: str, bars: Sequence[Bar], unit: str, better: str | None) -> str | None:
    shown = list(bars[:MAX_BARS])
    log = unit in LOG_UNITS and all(bar.value > 0 for bar in shown)
    labels = [_shorten(bar.label) for bar in shown]
    has_baseline = any(bar.baseline is not None for bar in shown)
    note = bars_note(len(bars))
    height = 0.9 + 0.3 * len(shown)
    fig, ax = _figure(7.2, height, left=min(3.2, 0.2 + _TICK_CHAR_IN * max(map(len, labels))),
                      bottom=0.5, top=0.35 if has_baseline or note else 0.12, right=0.25)  # fmt: skip
    if note:  # above the plot, left, where the baseline legend (right) leaves room
        ax.set_title(note, loc="left", fontsize=9, color=_TEXT, fontweight="bold", pad=6)
    ys = list(range(len(shown)))[::-1]
    if log:  # raw values; every bar from one floor a decade under the shortest
        factor, axis_unit = 1.0, "log scale"
        extremes = [bar.value for bar in shown] + [bar.baseline for bar in shown if bar.baseline]
        floor = 10 ** math.floor(math.log10(min(extremes)) - 1e-9)
        ax.set_xscale("log")
        ax.set_xlim(floor, 10 ** math.ceil(math.log10(max(extremes) * 1.05)))
    else:
        factor, scaled = scale_for(unit, max(abs(bar.value) for bar in shown) or 1.0)
        floor, axis_unit = 0.0, "×" if unit == "x" else scaled
    values = [bar.value / factor for bar in shown]
    # On a log axis an error bar as large as its value has no lower end: clipped just above the floor.
    below = [
        min(bar.spread / factor, v - floor * 1.01) if log else bar.spread / factor
        for bar, v in zip(shown, values, strict=True)
    ]
    ax.barh(
        ys, [v - floor for v in values], left=floor, height=0.62, color=_CURRENT, alpha=0.85, label="this run"
    )
    ax.errorbar(values, ys, xerr=[below, [bar.spread / factor for bar in shown]], fmt="none", ecolor=_TEXT,
                elinewidth=1, capsize=2.5)  # fmt: skip
    base = [(y, bar) for y, bar in zip(ys, shown, strict=True) if bar.baseline is not None]
    if base:
        ax.errorbar([bar.baseline / factor for _, bar in base if bar.baseline is not None],
                    [y for y, _ in base], xerr=[bar.baseline_spread / factor for _, bar in base],
                    fmt="|", markersize=14, markeredgewidth=2.2, color=_BASELINE, ecolor=_BASELINE,
                    elinewidth=1, capsize=2, label="baseline")  # fmt: skip
        # Above the plot, where it cannot hide a bar.
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=2, fontsize=8, frameon=False)
    if log:  # ticks at decades, each in the unit it reads best in (10 µs, 1 ms)
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.xaxis.set_major_locator(LogLocator(base=10))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: _decade(x, unit)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(ys, labels)
    ax.set_xlabel(f"{title} ({axis_unit}){_DIRECTION.get(better or '', '')}")
    ax.grid(axis="x", color=_GRID, linewidth=0.8)
    ax.set_axisbelow(True)
    scale = ", log scale" if log else ""
    return _inline(
        fig,
        f"{title}{scale}: {len(shown)} of {len(bars)} bars" if note else f"{title}{scale}: {len(shown)} bars",
    )


def _decade(value: float, unit: str) -> str:
    """A tick of a log axis in the scale it reads best in: ``10 µs``, ``1 ms``, ``2 s``."""
    factor, shown = scale_for(unit, value)
    return f"{value / factor:g} {shown}"


def outcome_history_chart(labels: Sequence[str], counts: Sequence[dict[str, int]]) -> str | None:
    """Stacked outcome counts per run, oldest on the left."""
    if len(labels) < 2 or not available():
        return None
    key = repr(
        ("history", _library_version(), tuple(labels), tuple(tuple(sorted(c.items())) for c in counts))
    )
    return chart_cache.cached(key, lambda: _draw_history_chart(labels, counts), is_safe)


def _draw_history_chart(labels: Sequence[str], counts: Sequence[dict[str, int]]) -> str | None:
    fig, ax = _figure(9.0, 2.6, left=0.6, bottom=0.75, top=0.12, right=1.3)
    xs = list(range(len(labels)))
    bottoms = [0] * len(labels)
    for outcome, colour in OUTCOME_COLOURS.items():
        heights = [c.get(outcome, 0) for c in counts]
        if any(heights):
            ax.bar(xs, heights, bottom=bottoms, color=colour, width=0.7, label=outcome.value)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(xs, [_shorten(label, 14) for label in labels], rotation=30, ha="right")
    ax.set_ylabel("cases")
    ax.grid(axis="y", color=_GRID, linewidth=0.8)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return _inline(fig, f"outcomes of the last {len(labels)} runs")


def _figure(
    width: float, height: float, left: float, bottom: float, top: float, right: float
) -> tuple[Any, Any]:
    """A figure with fixed margins in inches. Margins are set, not solved for: a layout engine would
    draw every chart twice, which was most of the dashboard's build time."""
    # Figure, not pyplot: no global state, no GUI backend, safe to use from any thread.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height
    )
    ax = fig.subplots()
    ax.tick_params(labelsize=8, colors=_TEXT)
    ax.xaxis.label.set_size(9)
    ax.yaxis.label.set_size(9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def _inline(fig: Any, description: str) -> str | None:
    import matplotlib

    buffer = io.StringIO()
    # Text stays text (smaller, selectable, escaped by matplotlib); a fixed salt and no date make
    # the same input give the same SVG.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dashboard"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None}, transparent=True)
    svg = buffer.getvalue()
    svg = svg[svg.find("<svg") :]  # the XML prolog and DOCTYPE mean nothing inside HTML
    # Scale with the page: keep the viewBox, drop the fixed size.
    svg = re.sub(r'\s(width|height)="[^"]*"', "", svg[: svg.find(">")], count=2) + svg[svg.find(">") :]
    label = html.escape(description, quote=True)
    svg = svg.replace("<svg", f'<svg class="chart" role="img" aria-label="{label}"', 1)
    return svg if is_safe(svg) else None


def is_safe(svg: str) -> bool:
    """One SVG element of ours with nothing in it that could run or load anything."""
    return svg.startswith('<svg class="chart" ') and svg.count("<svg") == 1 and not _ACTIVE.search(svg)


def _library_version() -> str:
    import matplotlib

    return str(matplotlib.__version__)


def _shorten(label: str, limit: int = 48) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"
