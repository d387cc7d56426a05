"""``python -m reports.compare [BASELINE [CURRENT]]`` (``nox -s compare``): two runs in the terminal.

What changed between two runs, as ``asv compare`` shows it: the verdict, then newly failing, newly skipped,
lost, fixed and new cases (``reports/compare.py`` defines each), then where the time went — the run's wall
time, each chapter's case-seconds and the cases that slowed down most, as ratios — and the benchmark
metrics that moved.

Without arguments it compares the latest run in ``results/`` with the one before it of the same session
(kept in ``results/runs/<run id>/`` by the front door, see ``harness/run_history.py``); with one, that
baseline against the latest run. A run is named by a result file or directory, by its run id or any
unique part of it, or as ``latest`` / ``previous``. ``--list`` shows the runs there are.

Exit status: 0; 1 with ``--fail-on-regression`` when the verdict is a regression (the dashboard gate's
rules: ``--narrowed`` for a deliberate subset); 2 when a run cannot be found or read.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harness.case_ids import current_case_id
from harness.formatting import show_duration, show_quantity
from harness.outcomes import NOT_CHECKING, count_words
from harness.results import ResultFileError, RunResult
from harness.run_history import RUNS_DIR
from reports.compare import (
    CASE_CHANGE_LABELS,
    CASE_CHANGES,
    DEFAULT_THRESHOLD_PCT,
    CaseChange,
    Comparison,
    compare_runs,
)
from reports.inputs import LoadedRun, load_inputs

EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT = 0, 1, 2
_SHARD_SUFFIX = re.compile(r"-(exclusive|multi-gpu)$")


@dataclass(frozen=True)
class FoundRun:
    """A run found under the results directory: the latest of its session, or a kept earlier one."""

    loaded: LoadedRun
    session: str
    kept: bool

    @property
    def run(self) -> RunResult:
        return self.loaded.run


def session_of(loaded: LoadedRun) -> str:
    """``conformance`` for results/conformance.json and its -exclusive / -multi-gpu shards, ``bench`` ..."""
    stem = Path(loaded.sources[0]).name.removesuffix(".journal.jsonl").removesuffix(".json")
    return _SHARD_SUFFIX.sub("", stem)


def find_runs(results: Path) -> list[FoundRun]:
    """Every readable run under ``results`` (latest ones and ``runs/*``), oldest first."""
    found = (
        [FoundRun(r, session_of(r), False) for r in load_inputs([results]).runs] if results.is_dir() else []
    )
    kept_dir = results / RUNS_DIR
    for directory in sorted(kept_dir.iterdir()) if kept_dir.is_dir() else []:
        inputs = load_inputs([directory], merge_all=True)
        found += [FoundRun(r, session_of(r), True) for r in inputs.runs]
    return sorted(found, key=lambda f: (f.run.started_at, f.run.run_id))


def resolve(name: str, runs: Sequence[FoundRun]) -> LoadedRun:
    """A run by path, run id (or a unique part of one), ``latest`` or ``previous``; or ResultFileError."""
    path = Path(name)
    if path.exists():
        inputs = load_inputs([path], merge_all=True)
        if inputs.errors or not inputs.runs:
            raise ResultFileError(inputs.errors[0] if inputs.errors else f"{name}: no result files")
        return inputs.runs[0]
    if name == "latest" and latest(runs) is not None:
        return latest(runs).loaded  # type: ignore[union-attr]
    if name in ("latest", "previous"):
        pair = default_pair(runs)
        if pair is None:
            raise ResultFileError(f"{name!r}: fewer than two runs of one session are kept here")
        return pair[0]
    matches = [f for f in runs if f.run.run_id == name] or [f for f in runs if name in f.run.run_id]
    if len(matches) != 1:
        ids = ", ".join(f.run.run_id for f in matches) or "none"
        raise ResultFileError(
            f"{name!r} is not a result file or directory, and names {len(matches)} run(s): {ids}"
        )
    return matches[0].loaded


def latest(runs: Sequence[FoundRun]) -> FoundRun | None:
    """The latest ``conformance`` run when there is one, else the latest run of any session."""
    current = [f for f in runs if not f.kept] or list(runs)
    suite = [f for f in current if f.session == "conformance"]
    return (suite or current)[-1] if current else None


def default_pair(runs: Sequence[FoundRun]) -> tuple[LoadedRun, LoadedRun] | None:
    """(previous, latest): :func:`latest` and the run of its session before it."""
    newest = latest(runs)
    if newest is None:
        return None
    same = [f for f in runs if f.session == newest.session and f.run.started_at <= newest.run.started_at]
    same = [f for f in same if f is not newest]
    return (same[-1].loaded, newest.loaded) if same else None


# ---------------------------------------------------------------------------------------------- the table


def describe(run: RunResult) -> str:
    backend = run.metadata.get("backend") if isinstance(run.metadata.get("backend"), dict) else {}
    who = f"{backend.get('name', '?')} {backend.get('version', '')}".strip()
    counts = run.summary()["outcomes"]
    shown = count_words(counts)
    incomplete = "" if run.complete else ", INCOMPLETE"
    return f"{run.run_id}  {who}  started {run.started_at}  {len(run.cases)} cases ({shown}{incomplete})"


def wall_seconds(run: RunResult) -> float | None:
    try:
        start, end = datetime.fromisoformat(run.started_at), datetime.fromisoformat(run.finished_at or "")
    except ValueError:
        return None
    return (end - start).total_seconds()


def ratio(before: float | None, now: float | None) -> str:
    if before is None or now is None:
        return "n/a"
    if before <= 0:
        return "new" if now > 0 else "1.00×"
    return f"{now / before:.2f}×"


def _row(label: str, before: float | None, now: float | None, unit: str = "s") -> str:
    show = show_duration if unit == "wall" else (lambda value: show_quantity(value, unit))
    label = label if len(label) <= 64 else "…" + label[-63:]
    return f"  {label:<64} {show(before):>12} {show(now):>12} {ratio(before, now):>8}"


def timing_lines(baseline: RunResult, current: RunResult, slowest: int = 5) -> list[str]:
    lines = [f"timing{'':<60} {'baseline':>12} {'this run':>12} {'ratio':>8}"]
    lines.append(_row("wall time", wall_seconds(baseline), wall_seconds(current), "wall"))
    per_chapter: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    ran: dict[str, list[bool]] = defaultdict(lambda: [False, False])
    for index, run in enumerate((baseline, current)):
        for case in run.cases:
            per_chapter[case.chapter][index] += case.duration_s
            ran[case.chapter][index] |= case.outcome not in NOT_CHECKING  # no run, no time to compare
    for chapter, (before, now) in sorted(per_chapter.items()):
        did = ran[chapter]
        lines.append(_row(f"{chapter} (case-seconds)", before if did[0] else None, now if did[1] else None))
    # Either run's case ids as today's: an older run's may predate the chapter folders (harness/case_ids.py).
    before_by_id = {current_case_id(c.id): c.duration_s for c in baseline.cases}
    ran_before = {current_case_id(c.id) for c in baseline.cases if c.outcome not in NOT_CHECKING}
    slowed = sorted(
        (
            (c.duration_s - before_by_id[i], c.id, before_by_id[i], c.duration_s)
            for c, i in ((c, current_case_id(c.id)) for c in current.cases)
            if i in before_by_id
            and i in ran_before
            and c.outcome not in NOT_CHECKING
            and c.duration_s - before_by_id[i] > 0.05
        ),
        reverse=True,
    )[:slowest]
    if slowed:
        lines.append("  slowed down most (of the cases in both runs):")
        lines += [_row(f"  {case_id.split('::', 1)[-1]}", before, now) for _, case_id, before, now in slowed]
    return lines


def case_lines(comparison: Comparison, current: RunResult, limit: int) -> list[str]:
    messages = {c.id: (c.rule, c.message) for c in current.cases}
    gating = set(comparison.gating_changes())
    lines = []
    for change in CASE_CHANGES:
        items = [c for c in comparison.cases if c.change == change]
        mark = " (gates)" if change in gating and items else ""
        lines.append(f"{CASE_CHANGE_LABELS[change]}: {len(items)}{mark}")
        shown = items if limit <= 0 else items[:limit]
        lines += [_case_line(c, messages.get(c.id)) for c in shown]
        if len(items) > len(shown):
            lines.append(f"  … and {len(items) - len(shown)} more (--limit 0 lists them all)")
    return lines


def _case_line(change: CaseChange, detail: tuple[str | None, str] | None) -> str:
    before, now = change.baseline_outcome or "absent", change.current_outcome or "absent"
    line = f"  {change.id}  {before} → {now}"
    if detail and change.change == "newly_failing":
        rule, message = detail
        first = (message or "").strip().splitlines()[0][:160] if message else ""
        line += f"  {f'[{rule}] ' if rule and f'[{rule}]' not in first else ''}{first}"
    return line


def metric_lines(comparison: Comparison, limit: int) -> list[str]:
    if not comparison.metrics:
        return []
    counts = ", ".join(f"{n} {v}" for v, n in comparison.metric_counts().items() if n)
    lines = [f"benchmarks: {len(comparison.metrics)} metrics compared ({counts})"]
    moved = [m for m in comparison.metrics if m.verdict not in ("same", "n/a")]
    for metric in moved if limit <= 0 else moved[:limit]:
        where = f"{metric.suite} / {metric.name} / {metric.metric}"
        lines.append(
            f"  {metric.verdict:<9} {where[-60:]:<60} {show_quantity(metric.baseline, metric.unit):>12} "
            f"{show_quantity(metric.current, metric.unit):>12} {ratio(metric.baseline, metric.current):>8}"
        )
    return lines


def render(baseline: LoadedRun, current: LoadedRun, comparison: Comparison, limit: int) -> str:
    verdict = comparison.verdict
    counts = ", ".join(f"{n} {CASE_CHANGE_LABELS[c]}" for c, n in comparison.case_counts().items() if n)
    narrowed = " (narrowed: lost and newly skipped cases do not gate)" if comparison.narrowed else ""
    lines = [
        f"baseline: {describe(baseline.run)}",
        f"this run: {describe(current.run)}",
        f"verdict:  {verdict}{' — ' + counts if counts else ''}{narrowed}",
        *(f"          {line}" for line in comparison.regressions() if "nothing can be vouched" in line),
        "",
        *case_lines(comparison, current.run, limit),
        "",
        *timing_lines(baseline.run, current.run),
    ]
    metrics = metric_lines(comparison, limit)
    return "\n".join([*lines, *(["", *metrics] if metrics else [])])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reports.compare",
        description="two runs in the terminal: case changes, timing ratios, benchmarks",
    )
    parser.add_argument(
        "runs", nargs="*", metavar="RUN", help="BASELINE [CURRENT] (default: previous, latest)"
    )
    parser.add_argument("--results", default="results", help="where runs are kept (default: %(default)s)")
    parser.add_argument("--narrowed", action="store_true", help="CURRENT is a deliberate subset of BASELINE")
    parser.add_argument("--threshold-pct", type=float, default=DEFAULT_THRESHOLD_PCT)
    parser.add_argument("--fail-on-regression", action="store_true", help="exit 1 on a regression")
    parser.add_argument("--limit", type=int, default=20, help="cases listed per change (0: all)")
    parser.add_argument("--list", action="store_true", help="list the runs found, oldest first, and stop")
    args = parser.parse_args(argv)
    if len(args.runs) > 2:
        parser.error("at most two runs: BASELINE [CURRENT]")
    runs = find_runs(Path(args.results))
    if args.list:
        for found in runs:
            where = "kept" if found.kept else "latest"
            print(f"{found.session:<24} {where:<6} {describe(found.run)}")
        return EXIT_OK
    try:
        if not args.runs:
            pair = default_pair(runs)
            if pair is None:
                raise ResultFileError(
                    f"{args.results}: fewer than two runs of one session to compare (run the suite twice, "
                    "or name BASELINE and CURRENT)"
                )
            baseline, current = pair
        else:
            baseline = resolve(args.runs[0], runs)
            current = resolve(args.runs[1], runs) if len(args.runs) == 2 else resolve("latest", runs)
    except ResultFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    comparison = compare_runs(current.run, baseline.run, args.threshold_pct, narrowed=args.narrowed)
    print(render(baseline, current, comparison, args.limit))
    gated = comparison.verdict in ("regression", "incomplete")  # an incomplete side vouches for nothing
    return EXIT_REGRESSION if args.fail_on_regression and gated else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
