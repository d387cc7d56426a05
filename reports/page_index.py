"""The index page's view model: one row per run (newest first), the outcome history chart and the links
to side-by-side pages (two runs or more)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.results import OUTCOMES, RunResult
from reports import charts
from reports.compare import Comparison
from reports.inputs import LoadedRun
from reports.page_common import (
    column_letter,
    gpu_summary,
    hosts,
    outcome_counts,
    run_backend,
    shard_environments,
    short_time,
    show_time,
    verdict_detail,
)

#: The outcome history chart shows this many runs, the newest.
HISTORY_CHART_RUNS = 30


@dataclass(frozen=True)
class IndexRow:
    href: str
    run_id: str
    started: str
    backend: str
    gpus: str
    hosts: str
    shards: int
    total: int
    counts: list[tuple[str, int]]
    complete: bool
    verdict: str
    verdict_detail: str
    is_new: bool


def index_row(loaded: LoadedRun, href: str, comparison: Comparison | None, is_new: bool) -> IndexRow:
    run = loaded.run
    return IndexRow(
        href=href,
        run_id=run.run_id,
        started=show_time(run.started_at),
        backend=run_backend(run),
        gpus=gpu_summary(run),
        hosts=", ".join(hosts(run)),
        shards=len(shard_environments(run)),
        total=len(run.cases),
        counts=outcome_counts(run),
        complete=run.complete,
        verdict=comparison.verdict if comparison else "no baseline",
        verdict_detail=verdict_detail(comparison),
        is_new=is_new,
    )


def history_counts(run: RunResult) -> dict[str, int]:
    counts = run.summary()["outcomes"]
    return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}


def history_chart(runs: Sequence[RunResult]) -> str:
    """The outcome counts of the newest :data:`HISTORY_CHART_RUNS` of ``runs`` (given newest first), drawn
    oldest first."""
    oldest_first = runs[:HISTORY_CHART_RUNS][::-1]
    return charts.outcome_history_chart(
        [short_time(run.started_at) or run.run_id for run in oldest_first],
        [history_counts(run) for run in oldest_first],
    )


@dataclass(frozen=True)
class LinkedRun:
    letter: str  # the run's column on the page: A, B, C ...
    backend: str
    run_id: str


@dataclass(frozen=True)
class SideBySideLink:
    href: str
    runs: list[LinkedRun]


def side_by_side_link(href: str, runs: Sequence[LoadedRun]) -> SideBySideLink:
    """The index's link to the side-by-side page at ``href`` of these runs (two or more), in column order."""
    return SideBySideLink(
        href,
        [LinkedRun(column_letter(n), run_backend(r.run), r.run.run_id) for n, r in enumerate(runs)],
    )
