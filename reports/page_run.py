"""The run page's view model (``RunPage``): environment, GPUs, workers, shards, the outcome matrices,
the problems and notable outcomes, skips, where the time went and the comparison with a baseline.

One view model per run feeds both the dashboard's run page and the single-page summary
(``reports.summary``), so the two cannot disagree on what a run's environment or outcomes were.
Templates only lay it out, so every decision (ordering, grouping, formatting) is testable in Python.
The benchmark and traffic tables come from ``reports.suite_tables``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from harness import formatting
from harness.causes import Cause, likely_causes
from harness.formatting import show_bytes, show_quantity
from harness.outcomes import Outcome
from harness.phases import phases_from_metadata, run_wall
from harness.results import CaseResult, RunResult
from reports import charts
from reports.compare import CASE_CHANGE_LABELS, CASE_CHANGES, Comparison, MetricComparison
from reports.inputs import LoadedRun
from reports.matrix import ChapterMatrix, build_matrices
from reports.page_common import (
    VERDICT_ORDER,
    as_list,
    gpu_summary,
    hosts,
    outcome_counts,
    run_backend,
    shard_environments,
    show_time,
    verdict_detail,
)
from reports.suite_tables import SuiteView, suite_views

# Outcomes listed one by one with message and repro: everything that needs a person to look at it.
# Timeouts and device faults first: a hung or faulting case is the likeliest cause of what follows it.
# The failing outcomes (harness.outcomes.FAILING) in the order the page lists them.
PROBLEM_OUTCOMES: tuple[Outcome, ...] = (
    Outcome.TIMEOUT, Outcome.DEVICE_FAULT, Outcome.CRASHED, Outcome.ERROR, Outcome.FAILED, Outcome.XPASSED,
)  # fmt: skip


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

    @property
    def evidence_kind(self) -> str:
        """What the case's ``evidence`` holds: every thread's stack at a timeout, else the error."""
        return "every thread's stack" if self.case.outcome == Outcome.TIMEOUT else "the error"


@dataclass(frozen=True)
class SkipGroup:
    reason: str
    count: int
    chapters: list[tuple[str, int]]  # (chapter, cases of it skipped for this reason), by chapter name
    ids: list[str]


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
    #: The suite's own checks (no backend involved), by outcome: shown apart, never among the cases above.
    suite_checks: list[tuple[str, int]]
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
    #: The failed rules, the one explaining the most failures first (``harness.causes``): the page's headline.
    causes: list[Cause] = field(default_factory=list)


def run_page(loaded: LoadedRun, comparison: Comparison | None) -> RunPage:
    run = loaded.run
    problems = problem_list(run.cases)
    should = outcome_list(run.cases, Outcome.SHOULD_FAILED, "should", len(problems))
    known = outcome_list(run.cases, Outcome.XFAILED, "known", len(problems) + len(should))
    noted = len(problems) + len(should) + len(known)
    coverage = outcome_list(run.cases, Outcome.COVERAGE, "coverage", noted)
    anchors = {id(p.case): p.anchor for p in (*problems, *should, *known, *coverage)}
    verdicts = {m.key: m for m in comparison.metrics} if comparison else {}
    return RunPage(
        run=run,
        backend=run_backend(run),
        started=show_time(run.started_at),
        finished=show_time(run.finished_at),
        duration=duration(run),
        gpus=gpu_summary(run),
        total=run.summary()["total"],
        counts=outcome_counts(run),
        suite_checks=[(o, n) for o, n in run.summary()["suite_checks"].items() if n],
        incomplete_reasons=incomplete_reasons(run),
        facts=environment_facts(run),
        gpu_rows=gpu_rows(run),
        workers=worker_rows(run),
        shards=shard_views(loaded),
        matrices=build_matrices([c for c in run.cases if not c.suite_check], anchors),
        problems=problems,
        should_failures=should,
        known_failures=known,
        coverage_gaps=coverage,
        warnings=run_warnings(run),
        strict_should=run.metadata.get("strict_should") is True,
        skips=skip_groups(run.cases),
        not_run=skip_groups(run.cases, Outcome.NOT_RUN),
        benchmarks=suite_views("benchmarks", run.benchmarks, verdicts),
        traffic=suite_views("traffic", run.traffic, verdicts),
        comparison=comparison_view(comparison),
        charts_available=charts.available(),
        time=time_view(run),
        causes=likely_causes(run.cases),
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

    add("Suite commit", env.get("suite_commit"))
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
    if env.get("cores_bound_by"):  # the run was sized from fewer cores than the host has, and why
        add("Cores the run may use", f"{env.get('usable_cores')} ({env['cores_bound_by']})")
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
        for gpu in as_list(env.get("gpus")):
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
    shard_metas = [m if isinstance(m, dict) else {} for m in as_list(run.metadata.get("shards"))]
    environments = shard_environments(run)
    rows = []
    for worker, n in sorted(counts.items()):
        shard, _, name = worker.rpartition("/")
        index = int(shard.removeprefix("shard")) - 1 if shard.startswith("shard") else -1
        meta = shard_metas[index] if 0 <= index < len(shard_metas) else run.metadata
        env = environments[index] if 0 <= index < len(environments) else run.environment
        pinned = meta.get("worker_gpus") if isinstance(meta.get("worker_gpus"), dict) else {}
        target = str(pinned.get(name, "")) if pinned else ""
        gpus = [g for g in as_list(env.get("gpus")) if isinstance(g, dict)]
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
    metas = [m if isinstance(m, dict) else {} for m in as_list(run.metadata.get("shards"))]
    facts = [machine_facts(env) for env in environments]
    shared = set.intersection(*(set(f) for f in facts))
    views = []
    for number, env in enumerate(environments, start=1):
        meta = metas[number - 1] if number <= len(metas) else {}
        names = [
            str(g.get("name", "?")) + (f" {g['uuid']}" if g.get("uuid") else "")
            for g in as_list(env.get("gpus"))
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


def outcome_list(
    cases: Sequence[CaseResult], outcome: Outcome, prefix: str, offset: int = 0
) -> list[Problem]:
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
    lines = [str(w) for w in as_list(run.metadata.get("warnings"))]
    for number, shard in enumerate(as_list(run.metadata.get("shards")), start=1):
        if isinstance(shard, dict):
            lines += [f"shard {number}: {w}" for w in as_list(shard.get("warnings")) if str(w) not in lines]
    return list(dict.fromkeys(lines))


def skip_groups(cases: Sequence[CaseResult], outcome: Outcome = Outcome.SKIPPED) -> list[SkipGroup]:
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


def incomplete_reasons(run: RunResult) -> list[str]:
    reasons = [str(run.metadata["incomplete_reason"])] if run.metadata.get("incomplete_reason") else []
    for number, shard in enumerate(as_list(run.metadata.get("shards")), start=1):
        if isinstance(shard, dict) and shard.get("incomplete_reason"):
            reasons.append(f"shard {number} ({shard.get('run_id', '?')}): {shard['incomplete_reason']}")
    return list(dict.fromkeys(reasons))


def comparison_view(comparison: Comparison | None) -> ComparisonView | None:
    if comparison is None:
        return None
    rank = {verdict: i for i, verdict in enumerate(VERDICT_ORDER)}
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
