"""View models for every page: everything a template shows, computed here as plain data.

One view model per run (``RunPage``) feeds both the dashboard's run page and the single-page summary
(``reports.summary``), so the two cannot disagree on what a run's environment or outcomes were.
Templates only lay these out, so every decision (ordering, grouping, formatting) is testable in Python.
Strings taken from result files stay untouched here; the autoescaping templates escape them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from harness import formatting
from harness.formatting import ShownValue, show_bytes, show_metric, show_quantity
from harness.phases import phases_from_metadata, run_wall
from harness.records import BETTER
from harness.results import OUTCOMES, CaseResult, RunResult
from reports import charts
from reports.compare import (
    CASE_CHANGE_LABELS,
    CASE_CHANGES,
    COVERAGE_CHANGES,
    SIDE_BY_SIDE_GROUPS,
    Comparison,
    MetricComparison,
    SideBySideCase,
    compare_runs,
    record_keys,
    side_by_side,
)
from reports.coverage import STATUSES as COVERAGE_STATUSES
from reports.coverage import CoverageRule
from reports.inputs import LoadedRun
from reports.matrix import ChapterMatrix, build_matrices

_RECORD_KEYS = frozenset({"suite", "name", "params", "primary", "metrics", "conditions"})
_VERDICT_ORDER = ("slower", "ambiguous", "changed", "faster", "n/a", "same")


# Outcomes listed one by one with message and repro: everything that needs a person to look at it.
# Timeouts and device faults first: a hung or faulting case is the likeliest cause of what follows it.
PROBLEM_OUTCOMES = ("timeout", "device-fault", "crashed", "error", "failed", "xpassed")


# ---------------------------------------------------------------------------------------------- shared


def backend_label(backend: object) -> str:
    """``name version (spec)`` from ``{"name", "version", "spec"}`` metadata; a plain string as is."""
    if isinstance(backend, dict):
        name = " ".join(str(backend[key]) for key in ("name", "version") if backend.get(key))
        spec = backend.get("spec")
        label = f"{name} ({spec})" if name and spec else name or str(spec or "")
        return label or "not recorded"
    if backend:
        return str(backend)
    return "not recorded"


def run_backend(run: RunResult) -> str:
    """The backend label; merged shards that disagree list each distinct backend."""
    if run.metadata.get("backend"):
        return backend_label(run.metadata["backend"])
    labels = [backend_label(s.get("backend")) for s in run.metadata.get("shards", []) if isinstance(s, dict)]
    distinct = list(dict.fromkeys(label for label in labels if label != "not recorded"))
    return " + ".join(distinct) if distinct else "not recorded"


def _list(value: object) -> list[Any]:
    # Result files are validated only down to the top-level types; anything deeper may be odd.
    return value if isinstance(value, list) else []


def shard_environments(run: RunResult) -> list[dict[str, Any]]:
    shards = run.environment.get("shards")
    if isinstance(shards, list) and shards:
        return [s if isinstance(s, dict) else {} for s in shards]
    return [run.environment]


def gpu_summary(run: RunResult) -> str:
    """``2× NVIDIA H200`` over all shards; ``CPU only`` when no shard saw a GPU."""
    names: Counter[str] = Counter()
    seen: set[str] = set()
    for number, env in enumerate(shard_environments(run)):
        for position, gpu in enumerate(_list(env.get("gpus"))):
            name = str(gpu.get("name", "unknown GPU")) if isinstance(gpu, dict) else str(gpu)
            # Shards of one machine list the same GPUs: count each physical GPU (by UUID) once.
            uuid = gpu.get("uuid") if isinstance(gpu, dict) else None
            identity = str(uuid) if uuid else f"{env.get('hostname')}|{number}|{position}"
            if identity not in seen:
                seen.add(identity)
                names[name] += 1
    if not names:
        return "CPU only"
    return ", ".join(f"{count}× {name}" if count > 1 else name for name, count in names.items())


def hosts(run: RunResult) -> list[str]:
    return list(dict.fromkeys(str(env.get("hostname") or "unknown host") for env in shard_environments(run)))


def show_time(stamp: str | None) -> str:
    """``2025-01-01 12:00 UTC`` for an ISO 8601 stamp; anything else as given."""
    if not stamp:
        return ""
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    zone = "UTC" if moment.utcoffset() is not None and not moment.utcoffset() else moment.strftime("%z")
    return f"{moment:%Y-%m-%d %H:%M} {zone}".strip()


def short_time(stamp: str) -> str:
    """``06-02 09:30`` for a chart axis; empty when the stamp is not ISO 8601."""
    try:
        return f"{datetime.fromisoformat(stamp):%m-%d %H:%M}"
    except ValueError:
        return ""


def sort_key_time(stamp: str) -> float:
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return float("-inf")
    return moment.timestamp()


def duration(run: RunResult) -> str:
    if not run.finished_at:
        return ""
    try:
        seconds = (
            datetime.fromisoformat(run.finished_at) - datetime.fromisoformat(run.started_at)
        ).total_seconds()
    except (ValueError, TypeError):
        return ""
    if seconds < 0:  # clocks of different machines, or a hand-edited file: no honest duration
        return ""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def outcome_counts(run: RunResult) -> list[tuple[str, int]]:
    return [(outcome, count) for outcome, count in run.summary()["outcomes"].items() if count]


def incomplete_reasons(run: RunResult) -> list[str]:
    reasons = [str(run.metadata["incomplete_reason"])] if run.metadata.get("incomplete_reason") else []
    for number, shard in enumerate(_list(run.metadata.get("shards")), start=1):
        if isinstance(shard, dict) and shard.get("incomplete_reason"):
            reasons.append(f"shard {number} ({shard.get('run_id', '?')}): {shard['incomplete_reason']}")
    return list(dict.fromkeys(reasons))


# ---------------------------------------------------------------------------------------------- index


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


def verdict_detail(comparison: Comparison | None) -> str:
    if comparison is None:
        return ""
    parts = [f"{n} {v}" for v, n in comparison.metric_counts().items() if n and v != "same"]
    parts += [f"{n} {CASE_CHANGE_LABELS[c]}" for c, n in comparison.case_counts().items() if n]
    if comparison.narrowed and any(comparison.case_counts()[c] for c in COVERAGE_CHANGES):
        parts.append("narrowed: lost and newly skipped cases do not gate")
    return ", ".join(parts) or "no changes beyond the threshold"


# ---------------------------------------------------------------------------------------------- run page


@dataclass(frozen=True)
class GpuRow:
    shard: str
    host: str
    index: str
    name: str
    memory: str
    capability: str
    uuid: str
    error: str


@dataclass(frozen=True)
class ShardView:
    number: int
    source: str
    run_id: str
    host: str
    gpus: str
    #: The environment facts this shard does not share with every other (e.g. another runner's torch).
    own: str
    complete: bool
    reason: str


@dataclass(frozen=True)
class KnownFailureView:
    """A declared known failure as a page shows it; ``href`` only for an http(s) link."""

    reason: str
    link: str
    href: str
    pattern: str
    rule: str
    source: str


@dataclass(frozen=True)
class Problem:
    anchor: str
    case: CaseResult
    params: list[tuple[str, str]]
    known: KnownFailureView | None = None


@dataclass(frozen=True)
class SkipGroup:
    reason: str
    count: int
    chapters: list[tuple[str, int]]  # (chapter, cases of it skipped for this reason), by chapter name
    ids: list[str]


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


@dataclass(frozen=True)
class ComparisonView:
    comparison: Comparison
    verdict: str
    detail: str
    changed_metrics: list[MetricComparison]
    same_metrics: list[MetricComparison]
    case_groups: list[tuple[str, list[Any]]]


@dataclass(frozen=True)
class PhaseRow:
    name: str
    start: str
    wall: str
    share: str  # of the run's end-to-end time
    detail: str


@dataclass(frozen=True)
class ChapterTime:
    chapter: str
    cases: int
    seconds: str  # case-seconds: its cases' durations summed (over workers, so phases may overlap)
    share: str  # of all case-seconds of the run


@dataclass(frozen=True)
class TimeView:
    """Where a run's time went: its phases (``metadata["phases"]``, written by ``nox -s conformance``)
    and the case-seconds of each chapter."""

    phases: list[PhaseRow]
    total: str  # end to end: the last phase's end
    chapters: list[ChapterTime]
    case_seconds: str


@dataclass(frozen=True)
class RunPage:
    run: RunResult
    backend: str
    started: str
    finished: str
    duration: str
    gpus: str
    total: int
    counts: list[tuple[str, int]]
    incomplete_reasons: list[str]
    facts: list[tuple[str, str]]
    gpu_rows: list[GpuRow]
    workers: list[WorkerRow]
    shards: list[ShardView]
    matrices: list[ChapterMatrix]
    problems: list[Problem]
    should_failures: list[Problem]
    known_failures: list[Problem]
    coverage_gaps: list[Problem]
    warnings: list[str]
    strict_should: bool
    skips: list[SkipGroup]
    not_run: list[SkipGroup]  # cases the run stopped before, grouped by why
    benchmarks: list[SuiteView]
    traffic: list[SuiteView]
    comparison: ComparisonView | None
    charts_available: bool
    time: TimeView | None = None


def run_page(loaded: LoadedRun, comparison: Comparison | None) -> RunPage:
    run = loaded.run
    problems = problem_list(run.cases)
    should = outcome_list(run.cases, "should-failed", "should", len(problems))
    known = outcome_list(run.cases, "xfailed", "known", len(problems) + len(should))
    coverage = outcome_list(run.cases, "coverage", "coverage", len(problems) + len(should) + len(known))
    anchors = {id(p.case): p.anchor for p in (*problems, *should, *known, *coverage)}
    verdicts = {m.key: m for m in comparison.metrics} if comparison else {}
    return RunPage(
        run=run,
        backend=run_backend(run),
        started=show_time(run.started_at),
        finished=show_time(run.finished_at),
        duration=duration(run),
        gpus=gpu_summary(run),
        total=len(run.cases),
        counts=outcome_counts(run),
        incomplete_reasons=incomplete_reasons(run),
        facts=environment_facts(run),
        gpu_rows=gpu_rows(run),
        workers=worker_rows(run),
        shards=shard_views(loaded),
        matrices=build_matrices(run.cases, anchors),
        problems=problems,
        should_failures=should,
        known_failures=known,
        coverage_gaps=coverage,
        warnings=run_warnings(run),
        strict_should=run.metadata.get("strict_should") is True,
        skips=skip_groups(run.cases),
        not_run=skip_groups(run.cases, "not-run"),
        benchmarks=suite_views("benchmarks", run.benchmarks, verdicts),
        traffic=suite_views("traffic", run.traffic, verdicts),
        comparison=comparison_view(comparison),
        charts_available=charts.available(),
        time=time_view(run),
    )


def show_seconds(seconds: float) -> str:
    """Seconds through the one formatter; zero is ``0 s``, not ``0 ns``."""
    return show_quantity(seconds, "s") if seconds else "0 s"


def show_share(part: float, whole: float) -> str:
    """``38 %`` (two significant figures); ``—`` when there is no whole to share."""
    return f"{formatting.significant(100 * part / whole, 2)} %" if whole > 0 else "—"


def time_view(run: RunResult) -> TimeView | None:
    """The phase table and case-seconds per chapter; None for a run without phases (a plain pytest run)."""
    phases = phases_from_metadata(run.metadata)
    if not phases:
        return None
    total = run_wall(phases)
    seconds: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for case in run.cases:
        seconds[case.chapter] = seconds.get(case.chapter, 0.0) + (formatting.number(case.duration_s) or 0.0)
        counts[case.chapter] += 1
    case_total = sum(seconds.values())
    return TimeView(
        phases=[
            PhaseRow(
                p.name, show_seconds(p.start_s), show_seconds(p.wall_s), show_share(p.wall_s, total), p.detail
            )
            for p in phases
        ],
        total=show_seconds(total),
        chapters=[
            ChapterTime(chapter, counts[chapter], show_seconds(value), show_share(value, case_total))
            for chapter, value in sorted(seconds.items(), key=lambda item: (-item[1], item[0]))
        ],
        case_seconds=show_seconds(case_total),
    )


def environment_facts(run: RunResult) -> list[tuple[str, str]]:
    """Label/value pairs; for merged shards, the facts they share (the rest is in the shard table)."""
    rows = [("Host", ", ".join(hosts(run))), ("GPUs", gpu_summary(run))]
    return [row for row in rows if row[1]] + machine_facts(run.environment)


def machine_facts(env: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Label/value pairs of one environment record beyond its host and GPUs: the same rows for the run's
    shared facts and for what one shard has of its own (shards from different CI runners)."""
    rows: list[tuple[str, str]] = []

    def add(label: str, value: object) -> None:
        if value is not None and value != "":
            rows.append((label, str(value)))

    add("Driver", env.get("driver_version"))
    add("torch", env.get("torch"))
    if "torch" in env:
        add("torch CUDA", env.get("torch_cuda") or "none (CPU build)")
    if "cuda_available" in env:  # why a CPU run skipped the GPU chapters
        add("CUDA available", "yes" if env["cuda_available"] else "no")
    add("Python", " ".join(str(env[k]) for k in ("python", "python_implementation") if env.get(k)))
    add("Platform", env.get("platform"))
    cpu, cores = env.get("cpu"), env.get("cpu_count")
    add("CPU", f"{cpu} ({cores} cores)" if cpu and cores else cpu)
    for key in ("torch_error", "gpu_error"):
        add(key.replace("_", " "), env.get(key))
    variables = env.get("env")
    if isinstance(variables, Mapping):
        for name, value in variables.items():
            add(f"${name}", "(unset)" if value is None else value)
    return rows


def gpu_rows(run: RunResult) -> list[GpuRow]:
    rows = []
    environments = shard_environments(run)
    for number, env in enumerate(environments, start=1):
        shard = str(number) if len(environments) > 1 else ""
        for gpu in _list(env.get("gpus")):
            gpu = gpu if isinstance(gpu, dict) else {"name": str(gpu)}
            rows.append(
                GpuRow(
                    shard=shard,
                    host=str(env.get("hostname") or ""),
                    index=str(gpu.get("index", "")),
                    name=str(gpu.get("name", "")),
                    memory=show_bytes(gpu.get("total_memory_bytes")),
                    capability=str(gpu.get("capability") or ""),
                    uuid=str(gpu.get("uuid") or ""),
                    error=str(gpu.get("error") or ""),
                )
            )
    return rows


@dataclass(frozen=True)
class WorkerRow:
    worker: str
    pinned_to: str
    gpu: str
    cases: int


def worker_rows(run: RunResult) -> list[WorkerRow]:
    """Which pytest-xdist worker ran on which GPU, and how many cases each ran (one worker per GPU)."""
    counts = Counter(case.worker for case in run.cases if case.worker)
    if not counts:
        return []
    shard_metas = [m if isinstance(m, dict) else {} for m in _list(run.metadata.get("shards"))]
    environments = shard_environments(run)
    rows = []
    for worker, n in sorted(counts.items()):
        shard, _, name = worker.rpartition("/")
        index = int(shard.removeprefix("shard")) - 1 if shard.startswith("shard") else -1
        meta = shard_metas[index] if 0 <= index < len(shard_metas) else run.metadata
        env = environments[index] if 0 <= index < len(environments) else run.environment
        pinned = meta.get("worker_gpus") if isinstance(meta.get("worker_gpus"), dict) else {}
        target = str(pinned.get(name, "")) if pinned else ""
        gpus = [g for g in _list(env.get("gpus")) if isinstance(g, dict)]
        if target.isdigit() and int(target) < len(gpus):
            gpu = gpus[int(target)]
            label = f"{gpu.get('name', '?')} {gpu.get('uuid', '')}".strip()
        elif not gpus:
            label = "CPU only"
        else:
            label = target or "every visible GPU"
        rows.append(WorkerRow(worker, f"CUDA_VISIBLE_DEVICES={target}" if target else "not pinned", label, n))
    return rows


def shard_views(loaded: LoadedRun) -> list[ShardView]:
    run = loaded.run
    environments = shard_environments(run)
    if len(environments) < 2:
        return []
    metas = [m if isinstance(m, dict) else {} for m in _list(run.metadata.get("shards"))]
    facts = [machine_facts(env) for env in environments]
    shared = set.intersection(*(set(f) for f in facts))
    views = []
    for number, env in enumerate(environments, start=1):
        meta = metas[number - 1] if number <= len(metas) else {}
        names = [
            str(g.get("name", "?")) + (f" {g['uuid']}" if g.get("uuid") else "")
            for g in _list(env.get("gpus"))
            if isinstance(g, dict)
        ]
        views.append(
            ShardView(
                number=number,
                source=loaded.sources[number - 1] if number <= len(loaded.sources) else "",
                run_id=str(meta.get("run_id", "")),
                host=str(env.get("hostname") or "unknown host"),
                gpus="; ".join(names) or "no GPU",
                own="; ".join(
                    f"{label} {value}" for label, value in facts[number - 1] if (label, value) not in shared
                ),
                complete=not meta.get("incomplete_reason"),
                reason=str(meta.get("incomplete_reason") or ""),
            )
        )
    return views


def problem_list(cases: Sequence[CaseResult]) -> list[Problem]:
    """Timeouts, device faults, crashes, errors, failures, unexpected passes: in that order, run order
    within each."""
    rank = {outcome: i for i, outcome in enumerate(PROBLEM_OUTCOMES)}
    chosen = sorted((c for c in cases if c.outcome in rank), key=lambda c: rank[c.outcome])
    return [Problem(f"case-{n}", c, sorted(c.params.items())) for n, c in enumerate(chosen, start=1)]


def outcome_list(cases: Sequence[CaseResult], outcome: str, prefix: str, offset: int = 0) -> list[Problem]:
    """The cases of one non-failing but notable outcome (should-failed, xfailed, coverage), in run order;
    anchors are ``<prefix>-N`` so they never collide with the failures' ``case-N``."""
    chosen = [c for c in cases if c.outcome == outcome]
    return [
        Problem(f"{prefix}-{n}", c, sorted(c.params.items()), known_failure_view(c.known_failure))
        for n, c in enumerate(chosen, start=offset + 1)
    ]


def known_failure_view(entry: object) -> KnownFailureView | None:
    if not isinstance(entry, Mapping):
        return None
    link = str(entry.get("link") or "")
    return KnownFailureView(
        reason=str(entry.get("reason") or ""),
        link=link,
        href=link if link.startswith(("https://", "http://")) else "",
        pattern=str(entry.get("case") or ""),
        rule=str(entry.get("rule") or ""),
        source=str(entry.get("source") or ""),
    )


def run_warnings(run: RunResult) -> list[str]:
    """Warnings the run recorded (e.g. known-failure entries that matched no case), shards included."""
    lines = [str(w) for w in _list(run.metadata.get("warnings"))]
    for number, shard in enumerate(_list(run.metadata.get("shards")), start=1):
        if isinstance(shard, dict):
            lines += [f"shard {number}: {w}" for w in _list(shard.get("warnings")) if str(w) not in lines]
    return list(dict.fromkeys(lines))


def skip_groups(cases: Sequence[CaseResult], outcome: str = "skipped") -> list[SkipGroup]:
    """The cases of ``outcome`` (skipped, or not-run) grouped by their reason, largest group first."""
    groups: dict[str, list[CaseResult]] = {}
    for case in cases:
        if case.outcome == outcome:
            groups.setdefault(case.message.strip() or "(no reason given)", []).append(case)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return [
        SkipGroup(
            reason, len(group), sorted(Counter(c.chapter for c in group).items()), [c.id for c in group]
        )
        for reason, group in ordered
    ]


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


def comparison_view(comparison: Comparison | None) -> ComparisonView | None:
    if comparison is None:
        return None
    rank = {verdict: i for i, verdict in enumerate(_VERDICT_ORDER)}
    changed = sorted((m for m in comparison.metrics if m.verdict != "same"), key=lambda m: rank[m.verdict])
    groups = [
        (CASE_CHANGE_LABELS[change], [c for c in comparison.cases if c.change == change])
        for change in CASE_CHANGES
    ]
    return ComparisonView(
        comparison=comparison,
        verdict=comparison.verdict,
        detail=verdict_detail(comparison),
        changed_metrics=changed,
        same_metrics=[m for m in comparison.metrics if m.verdict == "same"],
        case_groups=[(label, items) for label, items in groups if items],
    )


def history_counts(run: RunResult) -> dict[str, int]:
    counts = run.summary()["outcomes"]
    return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}


# ---------------------------------------------------------------------------------------------- side by side

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
            rows=[SideRow(r.id, r.chapter, _side_cell(r.a), _side_cell(r.b)) for r in items],
            open=key != "same" or len(items) <= 50,
        )
        for key, items in by_group.items()
        if items
    ]
    metrics = compare_runs(b.run, a.run).metrics
    rank = {verdict: i for i, verdict in enumerate(_VERDICT_ORDER)}
    return SideBySidePage(
        a=_side_run("A", a, a_href),
        b=_side_run("B", b, b_href),
        total=len(rows),
        groups=groups,
        group_counts=[(k, SIDE_BY_SIDE_LABELS[k], len(by_group[k])) for k in SIDE_BY_SIDE_GROUPS],
        metrics=sorted(metrics, key=lambda m: rank[m.verdict]),
    )


def _side_run(side: str, loaded: LoadedRun, href: str) -> SideRun:
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


def _side_cell(case: CaseResult | None) -> SideCell:
    if case is None:
        return SideCell("", "", "")
    lines = case.message.strip().splitlines()
    return SideCell(case.outcome, lines[0] if lines else "", show_quantity(case.duration_s, "s"))


def side_by_side_backends_differ(a: RunResult, b: RunResult) -> bool:
    """Whether two runs come from different backends (name and version, as recorded)."""
    return run_backend(a) != run_backend(b)


# ---------------------------------------------------------------------------------------------- rule coverage


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
    """The rule coverage table (``python -m conformance.rule_coverage --json``): most urgent status first,
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
