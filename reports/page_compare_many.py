"""The view model of the page comparing three or more runs (usually backends) case by case: one column per
run, one row per case id of any run; the rows where the runs disagree first, by rule and chapter, then the
rows with one outcome everywhere; and per rule a failure names, how each run fares on it.

Two runs get the richer pairwise page (``reports.page_side_by_side``), whose run headers and cells this
page shares; the rows come from the same alignment (``reports.compare.align_cases``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.outcomes import Outcome
from harness.results import CaseResult
from reports.compare import AlignedCase, align_cases, is_failing
from reports.inputs import LoadedRun
from reports.page_common import column_letter
from reports.page_side_by_side import SideCell, SideRun, case_rule, side_cell, side_run

#: A rule is in the per-rule table when a case of one of these outcomes names it in some run.
FAILURE_NAMING: frozenset[str] = frozenset({Outcome.SHOULD_FAILED, Outcome.XFAILED})
#: How a run fares on a rule, worst first; ``css`` is the badge class that colours it (an outcome's).
STANDINGS: tuple[tuple[str, str], ...] = (
    ("fails", Outcome.FAILED.value),
    ("should-failed", Outcome.SHOULD_FAILED.value),
    ("known failure", Outcome.XFAILED.value),
    ("passes", Outcome.PASSED.value),
    ("not exercised", "n-a"),
)


@dataclass(frozen=True)
class ManyRow:
    id: str
    chapter: str
    rule: str  # the first rule id a run's case names, "" when none does
    cells: list[SideCell]  # one per run, in column order


@dataclass(frozen=True)
class RuleStanding:
    """One run on one rule: its worst standing, how many of the rule's cases are in it, of how many it
    checked (passed, failed in any way, or failed as known)."""

    status: str  # one of STANDINGS
    css: str
    count: int
    checked: int
    note: str  # a known failure's reason, else the first failing case's message


@dataclass(frozen=True)
class RuleRow:
    rule: str
    level: str
    cases: int  # case ids that name the rule in some run
    standings: list[RuleStanding]  # one per run, in column order


@dataclass(frozen=True)
class CompareManyPage:
    runs: list[SideRun]  # the columns: letters A, B, C ...
    total: int  # case ids in any run
    differ: list[ManyRow]  # the runs disagree (an outcome differs, or a run lacks the case)
    same: list[ManyRow]  # every run has the case, with one outcome
    rules: list[RuleRow]
    #: Case ids that fail in some run without naming a rule (an error, a crash, a timeout ...).
    unnamed_failures: int


def compare_many_page(runs: Sequence[LoadedRun], hrefs: Sequence[str]) -> CompareManyPage:
    """Runs (two or more) case by case; ``hrefs``: each run's page on the site, "" where it has none."""
    if len(runs) < 2:
        raise ValueError("a comparison needs two runs or more")
    rows = align_cases(*(loaded.run.cases for loaded in runs))
    differ = [_row(r) for r in rows if not r.agree]
    differ.sort(key=lambda r: (not r.rule, r.rule, r.chapter, r.id))  # rows naming no rule last
    return CompareManyPage(
        runs=[side_run(column_letter(n), r, h) for n, (r, h) in enumerate(zip(runs, hrefs, strict=True))],
        total=len(rows),
        differ=differ,
        same=sorted((_row(r) for r in rows if r.agree), key=lambda r: (r.chapter, r.id)),
        rules=rule_rows(rows, len(runs)),
        unnamed_failures=sum(
            any(c is not None and is_failing(c.outcome) and not case_rule(c) for c in r.cases) for r in rows
        ),
    )


def _row(row: AlignedCase) -> ManyRow:
    cells = [side_cell(case) for case in row.cases]
    return ManyRow(row.id, row.chapter, next((c.rule for c in cells if c.rule), ""), cells)


def names_failure(case: CaseResult | None) -> bool:
    return case is not None and (is_failing(case.outcome) or case.outcome in FAILURE_NAMING)


def rule_rows(rows: Sequence[AlignedCase], runs: int) -> list[RuleRow]:
    """Per rule id a failure (or should-failure, or known failure) names in some run, by rule id: how
    each run fares on the case ids that name it in any run."""
    named = sorted({case_rule(c) for r in rows for c in r.cases if names_failure(c) and case_rule(c)})
    table = []
    for rule in named:
        mine = [r for r in rows if any(c is not None and case_rule(c) == rule for c in r.cases)]
        level = next((c.level for r in mine for c in r.cases if c and case_rule(c) == rule and c.level), "")
        standings = [standing([r.cases[n] for r in mine]) for n in range(runs)]
        table.append(RuleRow(rule, level or "", len(mine), standings))
    return table


def standing(cases: Sequence[CaseResult | None]) -> RuleStanding:
    """One run on one rule's cases: its worst standing (:data:`STANDINGS` order) and how many are in it."""
    present = [c for c in cases if c is not None]
    by_status: dict[str, list[CaseResult]] = {status: [] for status, _ in STANDINGS}
    for case in present:
        if is_failing(case.outcome):
            by_status["fails"].append(case)
        elif case.outcome == Outcome.SHOULD_FAILED:
            by_status["should-failed"].append(case)
        elif case.outcome == Outcome.XFAILED:
            by_status["known failure"].append(case)
        elif case.outcome == Outcome.PASSED:
            by_status["passes"].append(case)
        else:  # skipped, a coverage gap, not run: nothing checked
            by_status["not exercised"].append(case)
    checked = len(present) - len(by_status["not exercised"])
    status, css = next(((s, css) for s, css in STANDINGS if by_status[s]), STANDINGS[-1])
    return RuleStanding(status, css, len(by_status[status]), checked, _note(by_status[status]))


def _note(cases: Sequence[CaseResult]) -> str:
    if not cases:
        return ""
    cell = side_cell(cases[0])
    return cell.note or cell.message
