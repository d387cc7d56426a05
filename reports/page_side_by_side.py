"""The side-by-side page's view model: run A and run B case by case, grouped (only A fails, only B fails,
different outcome, only in A, only in B, same outcome), and B's metrics against A's. Its run header
(:func:`side_run`) and cell (:func:`side_cell`) are also the columns and cells of the page of three runs
or more (``reports.page_compare_many``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from harness.formatting import show_quantity
from harness.outcomes import NOT_CHECKING
from harness.results import CaseResult
from reports.compare import (
    SIDE_BY_SIDE_GROUPS,
    MetricComparison,
    SideBySideCase,
    compare_runs,
    side_by_side,
)
from reports.inputs import LoadedRun
from reports.page_common import VERDICT_ORDER, gpu_summary, outcome_counts, run_backend, show_time

SIDE_BY_SIDE_LABELS = {
    "only_a_fails": "only A fails",
    "only_b_fails": "only B fails",
    "different": "different outcome",
    "only_in_a": "only in A",
    "only_in_b": "only in B",
    "same": "same outcome",
}


@dataclass(frozen=True)
class SideRun:
    """One side's header: which backend, which run, how it went."""

    side: str  # "A" or "B"
    backend: str
    name: str
    version: str
    run_id: str
    href: str  # its run page on this site, "" when it has none
    started: str
    gpus: str
    total: int
    counts: list[tuple[str, int]]
    complete: bool


@dataclass(frozen=True)
class SideCell:
    outcome: str  # "" where the run lacks the case
    message: str  # first line, for the cell's title
    duration: str
    rule: str = ""  # the rule id the case names (its failure's, or its known failure's)
    note: str = ""  # why it checked nothing or failed as known: a skip's reason, a known failure's reason


@dataclass(frozen=True)
class SideRow:
    id: str
    chapter: str
    a: SideCell
    b: SideCell


@dataclass(frozen=True)
class SideGroup:
    key: str
    label: str
    anchor: str
    rows: list[SideRow]
    open: bool


@dataclass(frozen=True)
class SideBySidePage:
    a: SideRun
    b: SideRun
    total: int
    groups: list[SideGroup]
    group_counts: list[tuple[str, str, int]]  # (key, label, count), every group, zeros included
    metrics: list[MetricComparison]  # B against A, per metric both runs have


def side_by_side_page(a: LoadedRun, b: LoadedRun, a_href: str = "", b_href: str = "") -> SideBySidePage:
    """Run A and run B case by case (``reports.compare.side_by_side``), and B's metrics against A's."""
    rows = side_by_side(a.run.cases, b.run.cases)
    by_group: dict[str, list[SideBySideCase]] = {key: [] for key in SIDE_BY_SIDE_GROUPS}
    for row in rows:
        by_group[row.group].append(row)
    groups = [
        SideGroup(
            key=key,
            label=SIDE_BY_SIDE_LABELS[key],
            anchor=key.replace("_", "-"),
            rows=[SideRow(r.id, r.chapter, side_cell(r.a), side_cell(r.b)) for r in items],
            open=key != "same" or len(items) <= 50,
        )
        for key, items in by_group.items()
        if items
    ]
    metrics = compare_runs(b.run, a.run).metrics
    rank = {verdict: i for i, verdict in enumerate(VERDICT_ORDER)}
    return SideBySidePage(
        a=side_run("A", a, a_href),
        b=side_run("B", b, b_href),
        total=len(rows),
        groups=groups,
        group_counts=[(k, SIDE_BY_SIDE_LABELS[k], len(by_group[k])) for k in SIDE_BY_SIDE_GROUPS],
        metrics=sorted(metrics, key=lambda m: rank[m.verdict]),
    )


def side_run(side: str, loaded: LoadedRun, href: str) -> SideRun:
    """The header of one run (``side``: its letter) of a side-by-side page."""
    run = loaded.run
    backend = run.metadata.get("backend")
    backend = backend if isinstance(backend, Mapping) else {}
    return SideRun(
        side=side,
        backend=run_backend(run),
        name=str(backend.get("name") or ""),
        version=str(backend.get("version") or ""),
        run_id=run.run_id,
        href=href,
        started=show_time(run.started_at),
        gpus=gpu_summary(run),
        total=len(run.cases),
        counts=outcome_counts(run),
        complete=run.complete,
    )


def side_cell(case: CaseResult | None) -> SideCell:
    """One run's outcome of one case, as a side-by-side page shows it."""
    if case is None:
        return SideCell("", "", "")
    lines = case.message.strip().splitlines()
    first = lines[0] if lines else ""
    known = case.known_failure if isinstance(case.known_failure, Mapping) else {}
    note = str(known.get("reason") or "") or (first if case.outcome in NOT_CHECKING else "")
    return SideCell(case.outcome, first, show_quantity(case.duration_s, "s"), case_rule(case), note)


def case_rule(case: CaseResult) -> str:
    """The rule id a case names: its failure's (or coverage gap's), else its known failure entry's."""
    if case.rule:
        return case.rule
    known = case.known_failure if isinstance(case.known_failure, Mapping) else {}
    return str(known.get("rule") or "")
