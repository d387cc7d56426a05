"""A run against a baseline run: a verdict per benchmark/traffic metric and the cases whose outcome changed.

Metric verdict rules (``threshold_pct`` defaults to 5):

* ``same``      — the relative change ``|current - baseline| / |baseline|`` is below the threshold.
* ``ambiguous`` — the change is at or above the threshold but the intervals ``value ± spread`` overlap,
                  so the recorded noise could explain it.
* ``slower`` / ``faster`` — the change is at or above the threshold and the intervals are apart; which
                  one follows the metric's ``better`` (``lower``: a larger value is slower; ``higher``: a
                  smaller value is slower). "slower" is the word for "worse" on every metric.
* ``changed``   — as slower/faster, but the metric has no ``better`` direction: reported, never gating.
* ``n/a``       — the two cannot be compared (a value missing or not a number, or the units differ).

A metric is matched by section (benchmarks or traffic), suite, name and metric name.

Case changes (by case id; a case in several shards counts with its worst outcome):

* ``newly_failing`` — passed (or failed as a declared known failure) in the baseline, failing now. Failing
  is an outcome of ``harness.outcomes.FAILING`` or one this version does not know
  (:func:`is_failing`), so an outcome added later counts as failing until it is listed otherwise.
* ``newly_skipped`` — passed (or xfailed) in the baseline, and now skipped, a coverage gap or not run
  (the run stopped first): the case no longer checks anything.
* ``lost`` — in the baseline, not in this run at all: a backend that stops collecting part of the suite.
* ``newly_passing`` (fixed) and ``new`` — reported, never gating.

Regressions (what fails the gate): ``slower`` metrics, ``newly_failing`` cases and, unless the comparison
is *narrowed* (this run is a deliberate subset of the baseline: a ``-k`` or ``--dtype`` selection, one
chapter, another machine), ``newly_skipped`` and ``lost`` cases.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.case_ids import current_case_id
from harness.formatting import number, show_quantity
from harness.outcomes import FAILING, NOT_CHECKING, OK, Outcome
from harness.results import OUTCOMES, CaseResult, RunResult

DEFAULT_THRESHOLD_PCT = 5.0
METRIC_VERDICTS: tuple[str, ...] = ("slower", "ambiguous", "changed", "faster", "same", "n/a")
CASE_CHANGES: tuple[str, ...] = ("newly_failing", "newly_skipped", "lost", "newly_passing", "new")
#: How a page or a table names each change.
CASE_CHANGE_LABELS: dict[str, str] = {
    "newly_failing": "newly failing",
    "newly_skipped": "newly skipped",
    "lost": "lost",
    "newly_passing": "fixed",
    "new": "new",
}
#: Changes that fail the gate only when the comparison is not narrowed.
COVERAGE_CHANGES: tuple[str, ...] = ("newly_skipped", "lost")
# Outcome groups (harness.outcomes): OK (checked, as expected), FAILING (a backend did something wrong)
# and NOT_CHECKING (skipped, a coverage gap, or not run at all). Failing is also any outcome this version
# does not know (added to the result file later): it fails until it is listed as not failing.
# should-failed (a policy/performance rule) and coverage never gate; a skip checked nothing.
# When one id appears in several shards, the worst outcome speaks for it; unknown outcomes rank worst.
_SEVERITY_ORDER: tuple[Outcome, ...] = (
    Outcome.PASSED, Outcome.XFAILED, Outcome.COVERAGE, Outcome.SKIPPED, Outcome.NOT_RUN,
    Outcome.SHOULD_FAILED, Outcome.XPASSED, Outcome.FAILED, Outcome.ERROR, Outcome.CRASHED,
    Outcome.DEVICE_FAULT, Outcome.TIMEOUT,
)  # fmt: skip
_OUTCOME_SEVERITY = {outcome: rank for rank, outcome in enumerate(_SEVERITY_ORDER)}


def is_failing(outcome: str | None) -> bool:
    """Whether a recorded outcome is a failure (see the module docstring)."""
    return outcome is not None and (outcome in FAILING or outcome not in OUTCOMES)


def severity(outcome: str) -> int:
    """Rank for "the worst outcome speaks for the case"; an outcome this version does not know, worst."""
    return _OUTCOME_SEVERITY.get(outcome, len(_SEVERITY_ORDER))


@dataclass(frozen=True)
class MetricComparison:
    section: str
    suite: str
    name: str
    metric: str
    unit: str
    better: str | None
    baseline: float | None
    baseline_spread: float
    current: float | None
    current_spread: float
    change_pct: float | None
    verdict: str
    note: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.section, self.suite, self.name, self.metric)

    def one_line(self) -> str:
        change = "" if self.change_pct is None else f" ({self.change_pct:+.1f}%)"
        before = (
            f"{show_quantity(self.baseline, self.unit)} ± {show_quantity(self.baseline_spread, self.unit)}"
        )
        now = f"{show_quantity(self.current, self.unit)} ± {show_quantity(self.current_spread, self.unit)}"
        where = f"{self.section} {self.suite} / {self.name} / {self.metric}"
        return f"{self.verdict}: {where}: {before} → {now}{change}"


@dataclass(frozen=True)
class CaseChange:
    id: str
    chapter: str
    change: str
    baseline_outcome: str | None
    current_outcome: str | None

    def one_line(self) -> str:
        before, now = self.baseline_outcome or "absent", self.current_outcome or "absent"
        return f"{CASE_CHANGE_LABELS[self.change]}: {self.id} ({before} → {now})"


#: Gate lines listed one by one per kind of change; beyond, one line says how many more.
GATE_LIST_LIMIT = 20


@dataclass(frozen=True)
class Comparison:
    baseline_run_id: str
    baseline_started_at: str
    threshold_pct: float
    metrics: list[MetricComparison] = field(default_factory=list)
    cases: list[CaseChange] = field(default_factory=list)
    #: The run is a deliberate subset of the baseline: lost and newly skipped cases do not gate.
    narrowed: bool = False
    #: Why a side checked less than it set out to (cut by a deadline or a signal, cases not run): "" when it
    #: ran whole. Nothing can be vouched unchanged against such a side (:func:`incompleteness`).
    baseline_incomplete: str = ""
    current_incomplete: str = ""

    def metric_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(METRIC_VERDICTS, 0)
        for item in self.metrics:
            counts[item.verdict] += 1
        return counts

    def case_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(CASE_CHANGES, 0)
        for item in self.cases:
            counts[item.change] += 1
        return counts

    def gating_changes(self) -> tuple[str, ...]:
        """The case changes that fail the gate in this comparison."""
        return ("newly_failing",) if self.narrowed else ("newly_failing", *COVERAGE_CHANGES)

    def regressions(self) -> list[str]:
        """What ``--fail-on-regression`` prints: one line per slower metric and per gating case change (at
        most :data:`GATE_LIST_LIMIT` of each kind, then how many more), each kind's count first."""
        lines = [m.one_line() for m in self.metrics if m.verdict == "slower"]
        for side, why in (("the baseline", self.baseline_incomplete), ("this run", self.current_incomplete)):
            if why:
                lines.append(f"{side} is {why}: nothing can be vouched unchanged against it")
        for change in self.gating_changes():
            items = [c for c in self.cases if c.change == change]
            if not items:
                continue
            why = " (not in this run; if it is a deliberate subset, compare with --narrowed)"
            head = f"{len(items)} case(s) {CASE_CHANGE_LABELS[change]}" + (why if change == "lost" else "")
            lines.append(head)
            lines += [c.one_line() for c in items[:GATE_LIST_LIMIT]]
            if len(items) > GATE_LIST_LIMIT:
                lines.append(f"… and {len(items) - GATE_LIST_LIMIT} more {CASE_CHANGE_LABELS[change]}")
        return lines

    @property
    def verdict(self) -> str:
        """regression > incomplete > ambiguous > improved > unchanged: the first that applies."""
        metrics, cases = self.metric_counts(), self.case_counts()
        if metrics["slower"] or any(cases[change] for change in self.gating_changes()):
            return "regression"
        if self.baseline_incomplete or self.current_incomplete:
            return "incomplete"
        if metrics["ambiguous"]:
            return "ambiguous"
        if metrics["faster"] or cases["newly_passing"]:
            return "improved"
        return "unchanged"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        """The inverse of ``to_dict``; raises KeyError/TypeError on anything else."""
        # Stored before "lost" and ``narrowed`` existed: "removed" was lost's name, and neither it nor a
        # newly skipped case gated; read as narrowed, so a verdict in the history stays what it was.
        cases = [
            CaseChange(**{**item, "change": _RENAMED.get(item["change"], item["change"])})
            for item in data["cases"]
        ]
        return cls(
            baseline_run_id=str(data["baseline_run_id"]),
            baseline_started_at=str(data["baseline_started_at"]),
            threshold_pct=float(data["threshold_pct"]),
            metrics=[MetricComparison(**item) for item in data["metrics"]],
            cases=[c for c in cases if c.change in CASE_CHANGES],
            narrowed=bool(data.get("narrowed", True)),
            baseline_incomplete=str(data.get("baseline_incomplete", "")),
            current_incomplete=str(data.get("current_incomplete", "")),
        )


_RENAMED = {"removed": "lost"}


def compare_runs(
    current: RunResult,
    baseline: RunResult,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    *,
    narrowed: bool = False,
) -> Comparison:
    metrics: list[MetricComparison] = []
    for section in ("benchmarks", "traffic"):
        base = metric_index(section, getattr(baseline, section))
        for key, metric in metric_index(section, getattr(current, section)).items():
            if key in base:
                metrics.append(compare_metric(key, base[key], metric, threshold_pct))
    return Comparison(
        baseline_run_id=baseline.run_id,
        baseline_started_at=baseline.started_at,
        threshold_pct=threshold_pct,
        metrics=metrics,
        cases=compare_cases(current.cases, baseline.cases),
        narrowed=narrowed,
        baseline_incomplete=incompleteness(baseline),
        current_incomplete=incompleteness(current),
    )


def incompleteness(run: RunResult) -> str:
    """Why ``run`` checked less than it set out to, in words ("" when it ran whole): cut before its end (a
    deadline, a signal, a crash of the run), or cases recorded as not run."""
    not_run = sum(case.outcome == Outcome.NOT_RUN for case in run.cases)
    why = [] if run.complete else ["cut before its end (INCOMPLETE)"]
    why += [f"{not_run} case(s) not run"] if not_run else []
    return "incomplete: " + ", ".join(why) if why else ""


MetricKey = tuple[str, str, str, str]


def metric_index(section: str, records: Iterable[Mapping[str, Any]]) -> dict[MetricKey, Mapping[str, Any]]:
    """(section, suite, name, metric) → the metric's dict; a repeated suite+name gets ``#2``, ``#3``."""
    index: dict[MetricKey, Mapping[str, Any]] = {}
    records = list(records)
    for record, (suite, name) in zip(records, record_keys(records), strict=True):
        metrics = record.get("metrics")
        if not isinstance(metrics, Mapping):
            continue
        for metric_name, metric in metrics.items():
            if isinstance(metric, Mapping):
                index[(section, suite, name, str(metric_name))] = metric
    return index


def record_keys(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(suite, name) per record, in order; the second record with the same pair is named ``name#2``."""
    keys: list[tuple[str, str]] = []
    seen: dict[tuple[str, str], int] = {}
    for record in records:
        suite, name = str(record.get("suite", "")), str(record.get("name", ""))
        seen[(suite, name)] = seen.get((suite, name), 0) + 1
        keys.append((suite, name if seen[(suite, name)] == 1 else f"{name}#{seen[(suite, name)]}"))
    return keys


def compare_metric(
    key: MetricKey, baseline: Mapping[str, Any], current: Mapping[str, Any], threshold_pct: float
) -> MetricComparison:
    section, suite, name, metric_name = key
    b, c = number(baseline.get("value")), number(current.get("value"))
    sb, sc = _spread(baseline), _spread(current)
    unit, better = str(current.get("unit", "")), _better(current)

    def result(verdict: str, change: float | None, note: str = "") -> MetricComparison:
        return MetricComparison(
            section, suite, name, metric_name, unit, better, b, sb, c, sc, change, verdict, note
        )

    if b is None or c is None:
        return result("n/a", None, "no numeric value in " + ("the baseline" if b is None else "this run"))
    if str(baseline.get("unit", "")) != unit:
        return result("n/a", None, f"unit changed from {baseline.get('unit')!r} to {unit!r}")
    return result(metric_verdict(b, sb, c, sc, better, threshold_pct), relative_change_pct(b, c))


def metric_verdict(
    baseline: float, baseline_spread: float, current: float, current_spread: float,
    better: str | None, threshold_pct: float,
) -> str:  # fmt: skip
    """The rule in the module docstring, on plain numbers."""
    change = relative_change_pct(baseline, current)
    if abs(change) < threshold_pct:
        return "same"
    # Closed intervals: touching counts as overlapping, since the spread is only an estimate.
    apart = (
        current - current_spread > baseline + baseline_spread
        or baseline - baseline_spread > current + current_spread
    )
    if not apart:
        return "ambiguous"
    if better == "lower":
        return "slower" if current > baseline else "faster"
    if better == "higher":
        return "slower" if current < baseline else "faster"
    return "changed"


def relative_change_pct(baseline: float, current: float) -> float:
    if baseline == 0:
        return 0.0 if current == 0 else math.copysign(math.inf, current)
    return (current - baseline) / abs(baseline) * 100.0


def case_change(baseline: str | None, current: str | None) -> str | None:
    """The change (one of :data:`CASE_CHANGES`) from one outcome of a case to another; None: none worth
    reporting. None for an outcome means the run lacks the case."""
    if baseline is None:
        return "new" if current is not None else None
    if current is None:
        return "lost"
    if baseline in OK and is_failing(current):
        return "newly_failing"
    if baseline in OK and current in NOT_CHECKING:
        return "newly_skipped"
    if is_failing(baseline) and current in OK:
        return "newly_passing"
    return None


def compare_cases(current: Iterable[CaseResult], baseline: Iterable[CaseResult]) -> list[CaseChange]:
    """Every case change, grouped in :data:`CASE_CHANGES` order, by case id within a group."""
    now, before = _outcomes_by_id(current), _outcomes_by_id(baseline)
    buckets: dict[str, list[CaseChange]] = {change: [] for change in CASE_CHANGES}
    for case_id in sorted(now.keys() | before.keys()):
        chapter, outcome = now.get(case_id, (None, None))
        old_chapter, old = before.get(case_id, (None, None))
        change = case_change(old, outcome)
        if change is not None:
            buckets[change].append(CaseChange(case_id, chapter or old_chapter or "", change, old, outcome))
    return [item for change in CASE_CHANGES for item in buckets[change]]


def _outcomes_by_id(cases: Iterable[CaseResult]) -> dict[str, tuple[str, str]]:
    result: dict[str, tuple[str, str]] = {}
    for case in cases:
        case_id = current_case_id(case.id)  # an older run's ids as today's (harness/case_ids.py)
        known = result.get(case_id)
        if known is None or severity(case.outcome) > severity(known[1]):
            result[case_id] = (case.chapter, case.outcome)
    return result


def _spread(metric: Mapping[str, Any]) -> float:
    # A missing or nonsensical spread means "no noise figure": the intervals shrink to points.
    spread = number(metric.get("spread"))
    return abs(spread) if spread is not None else 0.0


def _better(metric: Mapping[str, Any]) -> str | None:
    better = metric.get("better")
    return better if better in ("lower", "higher") else None


# ---------------------------------------------------------------------------------------------- side by side

#: Groups of a side-by-side comparison of two runs (usually two backends), in the order a page shows them.
SIDE_BY_SIDE_GROUPS: tuple[str, ...] = (
    "only_a_fails", "only_b_fails", "different", "only_in_a", "only_in_b", "same",
)  # fmt: skip


@dataclass(frozen=True)
class SideBySideCase:
    """One case id in two runs: its case in each (None where the run lacks it) and its group."""

    id: str
    chapter: str
    group: str
    a: CaseResult | None
    b: CaseResult | None


def side_by_side_group(a_outcome: str | None, b_outcome: str | None) -> str:
    """``only_a_fails`` / ``only_b_fails``: one run fails it (:func:`is_failing`), the other does not;
    ``different``: both fail it differently, or neither fails and the outcomes differ (passed
    vs skipped, should-failed, coverage ...); ``same``; ``only_in_a`` / ``only_in_b``."""
    if a_outcome is None or b_outcome is None:
        if a_outcome is None and b_outcome is None:
            raise ValueError("a case must be in at least one of the runs")
        return "only_in_b" if a_outcome is None else "only_in_a"
    if a_outcome == b_outcome:
        return "same"
    a_bad, b_bad = is_failing(a_outcome), is_failing(b_outcome)
    if a_bad and not b_bad:
        return "only_a_fails"
    if b_bad and not a_bad:
        return "only_b_fails"
    return "different"


def side_by_side(a_cases: Iterable[CaseResult], b_cases: Iterable[CaseResult]) -> list[SideBySideCase]:
    """Every case id of either run, grouped (``SIDE_BY_SIDE_GROUPS`` order), by chapter and id within."""
    rows = []
    for row in align_cases(a_cases, b_cases):
        one, other = row.cases
        group = side_by_side_group(one.outcome if one else None, other.outcome if other else None)
        rows.append(SideBySideCase(row.id, row.chapter, group, one, other))
    rank = {group: i for i, group in enumerate(SIDE_BY_SIDE_GROUPS)}
    return sorted(rows, key=lambda r: (rank[r.group], r.chapter, r.id))


@dataclass(frozen=True)
class AlignedCase:
    """One case id across several runs: each run's case for it, in run order (None where a run lacks it)."""

    id: str
    chapter: str
    cases: tuple[CaseResult | None, ...]

    @property
    def outcomes(self) -> tuple[str | None, ...]:
        return tuple(case.outcome if case else None for case in self.cases)

    @property
    def agree(self) -> bool:
        """Every run has the case, with one outcome."""
        return None not in self.outcomes and len(set(self.outcomes)) == 1


def align_cases(*runs: Iterable[CaseResult]) -> list[AlignedCase]:
    """Every case id of any run, by id, with each run's case (the worst of its shards) for it: the rows
    of a side-by-side comparison of two runs and of several."""
    by_id = [_worst_case_by_id(cases) for cases in runs]
    rows = []
    for case_id in sorted(set().union(*by_id)):
        cases = tuple(run.get(case_id) for run in by_id)
        chapter = next(case.chapter for case in cases if case is not None)
        rows.append(AlignedCase(case_id, chapter, cases))
    return rows


def _worst_case_by_id(cases: Iterable[CaseResult]) -> dict[str, CaseResult]:
    result: dict[str, CaseResult] = {}
    for case in cases:
        case_id = current_case_id(case.id)  # an older run's ids as today's (harness/case_ids.py)
        known = result.get(case_id)
        if known is None or severity(case.outcome) > severity(known.outcome):
            result[case_id] = case
    return result


if __name__ == "__main__":  # ``python -m reports.compare``: the terminal table, reports/compare_cli.py's
    import runpy

    runpy.run_module("reports.compare_cli", run_name="__main__", alter_sys=True)
