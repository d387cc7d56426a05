"""The rule coverage page's view model: the table ``python -m tests.rule_coverage --json`` prints,
most urgent status first."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from reports.coverage import STATUSES as COVERAGE_STATUSES
from reports.coverage import CoverageRule


@dataclass(frozen=True)
class CoverageRow:
    rule: str
    level: str
    status: str  # proven / proven-gpu / gap / not-checkable / missing
    status_title: str  # the table's own word where it differs (``NO CASE``)
    chapters: str
    cases: int
    broken_backends: list[str]
    reason: str
    anchor: str  # ``status-<status>`` on the first row of each status, else ""


@dataclass(frozen=True)
class CoveragePage:
    """The rule coverage table (``python -m tests.rule_coverage --json``): most urgent status first,
    rule ids in order within a status."""

    source: str
    rows: list[CoverageRow]
    counts: list[tuple[str, int]]  # every status, zeros included, in ``COVERAGE_STATUSES`` order

    @property
    def total(self) -> int:
        return len(self.rows)


def coverage_page(rules: Sequence[CoverageRule], source: str) -> CoveragePage:
    rank = {status: i for i, status in enumerate(COVERAGE_STATUSES)}
    ordered = sorted(rules, key=lambda r: (rank.get(r.status, 0), r.rule))
    rows, seen = [], set()
    for rule in ordered:
        anchor = "" if rule.status in seen else f"status-{rule.status}"
        seen.add(rule.status)
        rows.append(
            CoverageRow(
                rule=rule.rule,
                level=rule.level,
                status=rule.status,
                status_title=rule.raw_status if rule.raw_status != rule.status else "",
                chapters=", ".join(rule.chapters),
                cases=rule.cases,
                broken_backends=list(rule.broken_backends),
                reason=rule.reason,
                anchor=anchor,
            )
        )
    counts = Counter(rule.status for rule in rules)
    return CoveragePage(source, rows, [(status, counts[status]) for status in COVERAGE_STATUSES])
