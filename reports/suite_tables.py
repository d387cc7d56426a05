"""The run page's benchmark and traffic tables: one table per suite (``run.benchmarks``, ``run.traffic``),
its metric columns, folded figures, shared conditions, numbered notes and bar charts.

Cells carry the verdict of the comparison with the baseline where there is one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import formatting
from harness.formatting import ShownValue, show_metric, show_quantity
from harness.records import BETTER
from reports import charts
from reports.compare import MetricComparison, record_keys

_RECORD_KEYS = frozenset({"suite", "name", "params", "primary", "metrics", "conditions"})


@dataclass(frozen=True)
class MetricColumn:
    name: str
    unit: str
    better: str | None

    @property
    def header(self) -> str:
        """The name with a break opportunity after each ``_`` (a zero-width space), so headers wrap."""
        return self.name.replace("_", "_\u200b")

    @property
    def direction(self) -> str:
        """What ``better`` means, in words (header tooltips, chart axes)."""
        return BETTER_WORDS.get(self.better or "", "")


#: How each ``better`` of a metric reads.
BETTER_WORDS = {"lower": "lower is better", "higher": "higher is better", "near-1": "closer to 1 is better"}


@dataclass(frozen=True)
class MetricCell:
    shown: ShownValue
    verdict: str
    verdict_title: str
    change: str
    #: 1-based number of the suite note (below its table) this cell's note is, 0 for none: a long note
    #: (why a figure is missing) is written once per suite, not in every cell it applies to.
    note_ref: int = 0


#: A row's conditions are shown in the row itself only when they are this few and this short; otherwise
#: they fold into a ``<details>``, so a record with twenty conditions is still one line of the table.
INLINE_CONDITIONS, INLINE_CONDITION_CHARS = 2, 40


#: A suite table shows at most this many metric columns (the primary figure and the ratios first); each row
#: folds the rest into "more figures", so a suite of twelve metrics still fits a laptop screen.
MAX_METRIC_COLUMNS = 4
#: A note longer than this becomes a numbered note below the table instead of text in the cell.
INLINE_NOTE_CHARS = 24


@dataclass(frozen=True)
class RecordRow:
    name: str
    params: list[str]
    metrics: list[MetricCell | None]
    conditions: list[tuple[str, str]]  # the ones not shared by every row of the suite
    warnings: list[str]
    more: list[tuple[MetricColumn, MetricCell]] = field(default_factory=list)  # the folded metrics

    @property
    def conditions_inline(self) -> bool:
        return len(self.conditions) <= INLINE_CONDITIONS and all(
            len(key) + len(value) < INLINE_CONDITION_CHARS for key, value in self.conditions
        )


@dataclass(frozen=True)
class ChartView:
    """An inline SVG chart and what it leaves out (``showing 40 of 54 records``), "" when nothing."""

    svg: str
    note: str = ""


@dataclass(frozen=True)
class SuiteView:
    section: str
    suite: str
    anchor: str
    param_names: list[str]
    metrics: list[MetricColumn]  # the columns shown; the others fold into each row's ``more``
    rows: list[RecordRow]
    charts: list[ChartView] = field(default_factory=list)
    common_conditions: list[tuple[str, str]] = field(default_factory=list)  # the same in every row
    notes: list[str] = field(default_factory=list)  # numbered notes below the table (MetricCell.note_ref)

    @property
    def show_names(self) -> bool:
        """Record names repeat the suite and the parameters (``mm_out[bfloat16-64x64x64]``): shown only
        where there are no parameter columns to tell the rows apart."""
        return not self.param_names

    @property
    def has_more(self) -> bool:
        return any(row.more for row in self.rows)


def suite_views(
    section: str, records: Sequence[Mapping[str, Any]], verdicts: Mapping[tuple[str, str, str, str], Any]
) -> list[SuiteView]:
    """One table per suite, in first-appearance order; every metric of every record gets a column."""
    by_suite: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for record, (suite, key_name) in zip(records, record_keys(records), strict=True):
        by_suite.setdefault(suite, []).append((key_name, record))
    views = []
    for number, (suite, entries) in enumerate(by_suite.items(), start=1):
        columns = _metric_columns([record for _, record in entries])
        shown = _shown_columns(columns)
        param_names = list(dict.fromkeys(k for _, r in entries for k in _mapping(r.get("params"))))
        notes: list[str] = []
        rows = [
            _record_row(section, suite, key_name, r, columns, param_names, verdicts, notes)
            for key_name, r in entries
        ]
        rows = [_fold_metrics(row, columns, shown) for row in rows]
        rows, common = _split_common_conditions(rows)
        views.append(
            SuiteView(
                section=section,
                suite=suite or "(no suite)",
                anchor=f"{section}-{number}",
                param_names=param_names,
                metrics=shown,
                rows=rows,
                charts=_suite_charts(section, suite, entries, columns, verdicts),
                common_conditions=common,
                notes=notes,
            )
        )
    return views


def _shown_columns(columns: Sequence[MetricColumn]) -> list[MetricColumn]:
    """The metric columns a suite table shows: the primary figure, then the ratios (unit "x": what a
    reader compares first), then the others in record order, :data:`MAX_METRIC_COLUMNS` at most."""
    if not columns:
        return []
    ordered = [
        columns[0],
        *[c for c in columns[1:] if c.unit == "x"],
        *[c for c in columns[1:] if c.unit != "x"],
    ]
    return ordered[:MAX_METRIC_COLUMNS]


def _fold_metrics(
    row: RecordRow, columns: Sequence[MetricColumn], shown: Sequence[MetricColumn]
) -> RecordRow:
    """``row`` with one cell per shown column (in their order) and the rest in ``more``."""
    cells = dict(zip((c.name for c in columns), row.metrics, strict=True))
    names = {c.name for c in shown}
    more = [(c, cell) for c in columns if c.name not in names and (cell := cells[c.name]) is not None]
    return dataclasses.replace(row, metrics=[cells[c.name] for c in shown], more=more)


def _note_ref(note: str, notes: list[str]) -> int:
    """The number of ``note`` among the suite's notes (added if new)."""
    if note not in notes:
        notes.append(note)
    return notes.index(note) + 1


def _split_common_conditions(rows: list[RecordRow]) -> tuple[list[RecordRow], list[tuple[str, str]]]:
    """The conditions every row of a suite shares (the GPU, the policy, the clocks when they held) are
    shown once above its table; each row keeps the ones that differ."""
    if len(rows) < 2:  # "shared by every record" of one record says nothing
        return rows, []
    common = [pair for pair in rows[0].conditions if all(pair in row.conditions for row in rows[1:])]
    if not common:
        return rows, []
    shared = set(common)
    kept = [
        dataclasses.replace(row, conditions=[pair for pair in row.conditions if pair not in shared])
        for row in rows
    ]
    return kept, common


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _metric_columns(records: Sequence[Mapping[str, Any]]) -> list[MetricColumn]:
    columns: dict[str, MetricColumn] = {}
    primaries = [str(r["primary"]) for r in records if r.get("primary")]
    names = primaries + [str(name) for r in records for name in _mapping(r.get("metrics"))]
    for name in names:
        if name in columns:
            continue
        metric = next(
            (_mapping(r.get("metrics")).get(name) for r in records if name in _mapping(r.get("metrics"))), {}
        )
        metric = _mapping(metric)
        better = metric.get("better")
        columns[name] = MetricColumn(
            name, str(metric.get("unit") or ""), better if better in BETTER else None
        )
    return list(columns.values())


def _record_row(
    section: str,
    suite: str,
    key_name: str,
    record: Mapping[str, Any],
    columns: Sequence[MetricColumn],
    param_names: Sequence[str],
    verdicts: Mapping[tuple[str, str, str, str], Any],
    notes: list[str],
) -> RecordRow:
    metrics = _mapping(record.get("metrics"))
    params = _mapping(record.get("params"))
    cells: list[MetricCell | None] = []
    for column in columns:
        metric = metrics.get(column.name)
        if not isinstance(metric, Mapping):
            cells.append(None)
            continue
        verdict = verdicts.get((section, suite, key_name, column.name))
        shown, ref = show_metric(metric), 0
        if shown.note and (shown.value == shown.note or len(shown.note) > INLINE_NOTE_CHARS):
            # A missing figure reads "n/a", its reason once below the table.
            ref = _note_ref(shown.note, notes)
            missing = shown.value == shown.note
            shown = dataclasses.replace(shown, value="n/a" if missing else shown.value, note="")
        cells.append(
            MetricCell(
                shown=shown,
                verdict=verdict.verdict if verdict else "",
                verdict_title=verdict_title(verdict) if verdict else "",
                change=_change_text(verdict),
                note_ref=ref,
            )
        )
    conditions, warnings = _conditions(_mapping(record.get("conditions")))
    for key, value in record.items():
        if key not in _RECORD_KEYS:
            conditions.append((str(key), _plain(value)))
    return RecordRow(
        name=str(record.get("name", "")),
        params=[_plain(params[name]) if name in params else "" for name in param_names],
        metrics=cells,
        conditions=conditions,
        warnings=warnings,
    )


def _conditions(conditions: Mapping[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """Conditions as key/value pairs; a non-empty throttle list becomes a warning badge as well."""
    pairs, warnings = [], []
    for key, value in conditions.items():
        if "throttle" in str(key) and value:
            warnings.append(f"{key}: {_plain(value)}")
        else:
            pairs.append((str(key), _plain(value)))
    return pairs, warnings


def _plain(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value) or "none"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items())
    return "" if value is None else str(value)


def _change_text(item: MetricComparison | None) -> str:
    return "" if item is None or item.change_pct is None else f"{item.change_pct:+.1f}%"


def verdict_title(item: MetricComparison) -> str:
    change = "" if item.change_pct is None else f" ({item.change_pct:+.1f}%)"
    base = show_quantity(item.baseline, item.unit)
    spread = show_quantity(item.baseline_spread, item.unit)
    note = f"; {item.note}" if item.note else ""
    return f"{item.verdict}: baseline {base} ± {spread}{change}{note}"


def _suite_charts(
    section: str,
    suite: str,
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    columns: Sequence[MetricColumn],
    verdicts: Mapping[tuple[str, str, str, str], Any],
) -> list[ChartView]:
    """The primary metric, plus every ratio metric (unit "x"): the figures a reader compares first."""
    if not columns:
        return []
    chosen = [columns[0]] + [c for c in columns[1:] if c.unit == "x"]
    svgs = []
    for column in chosen:
        bars = []
        for key_name, record in entries:
            metric = _mapping(_mapping(record.get("metrics")).get(column.name))
            value = formatting.number(metric.get("value"))
            if value is None:
                continue
            verdict = verdicts.get((section, suite, key_name, column.name))
            bars.append(
                charts.Bar(
                    label=_bar_label(record),
                    value=value,
                    spread=abs(formatting.number(metric.get("spread")) or 0.0),
                    baseline=verdict.baseline if verdict else None,
                    baseline_spread=verdict.baseline_spread if verdict else 0.0,
                )
            )
        svg = charts.bar_chart(column.name, bars, column.unit, column.better)
        if svg:
            svgs.append(ChartView(svg, charts.bars_note(len(bars))))
    return svgs


def _bar_label(record: Mapping[str, Any]) -> str:
    params = _mapping(record.get("params"))
    if len(params) == 1:
        return "=".join(_plain(item) for item in next(iter(params.items())))
    return " · ".join(_plain(v) for v in params.values()) if params else str(record.get("name", ""))
