"""Finding and loading the result files a dashboard is built from, and grouping shards into runs.

A bench run that measured nothing (every suite skipped, e.g. ``nox -s bench --allow-empty`` on a machine
without what the suites need) is not a run: it is left out with a notice giving the skip reasons.

A directory contributes its ``*.json`` files plus any journal (``X.json.journal.jsonl``) whose final file
is missing — a run that was killed. Explicitly named files are read as given; ``*.junit.xml`` and other
non-JSON files are skipped with a notice, so ``results/*`` works from a shell. A rule coverage table
(``rule-coverage.json``, see ``reports.coverage``) is not a result file: it is set aside in ``coverage``.

Errors never stop the loading: every unreadable file becomes one line naming it, and the caller decides
(the dashboard renders what could be read and still exits 2).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.outcomes import Outcome
from harness.results import JOURNAL_SUFFIX, ResultFileError, RunResult, load_results, merge_runs
from reports.coverage import COVERAGE_FILE


@dataclass
class LoadedRun:
    """One dashboard run: a result file, or several shards merged; ``sources`` are the files, in order."""

    run: RunResult
    sources: list[str]


@dataclass
class Inputs:
    runs: list[LoadedRun] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    #: Rule coverage tables found among the inputs (``rule-coverage.json``), in input order.
    coverage: list[Path] = field(default_factory=list)


def find_result_files(paths: Sequence[str | os.PathLike[str]], inputs: Inputs) -> list[Path]:
    """The result files to load, each once: a journal is named by its final file (load_results reads it)."""
    targets: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.name == COVERAGE_FILE:
            inputs.coverage.append(path)
        elif path.is_dir():
            if (path / COVERAGE_FILE).is_file():
                inputs.coverage.append(path / COVERAGE_FILE)
            found = _scan_directory(path)
            if not found:
                inputs.notices.append(f"{path}: no result files (*.json) in this directory")
            targets.extend(found)
        elif path.name.endswith(JOURNAL_SUFFIX):
            targets.append(path.with_name(path.name.removesuffix(JOURNAL_SUFFIX)))
        elif path.suffix == ".json" or not path.exists():
            targets.append(path)  # a missing file is reported by load_results, journal fallback included
        else:
            inputs.notices.append(f"{path}: skipped, not a .json result file")
    unique: dict[str, Path] = {}
    for target in targets:
        unique.setdefault(os.path.normpath(target), target)
    return list(unique.values())


def _scan_directory(directory: Path) -> list[Path]:
    finals = sorted(p for p in directory.glob("*.json") if p.is_file() and p.name != COVERAGE_FILE)
    orphans = sorted(
        p.with_name(p.name.removesuffix(JOURNAL_SUFFIX))
        for p in directory.glob("*" + JOURNAL_SUFFIX)
        if not p.with_name(p.name.removesuffix(JOURNAL_SUFFIX)).exists()
    )
    return finals + orphans


def load_inputs(paths: Sequence[str | os.PathLike[str]], merge_all: bool = False) -> Inputs:
    """Load every result file; shards of one run (same run_id, or all of them with ``merge_all``) merge."""
    inputs = Inputs()
    loaded: list[tuple[str, RunResult]] = []
    for path in find_result_files(paths, inputs):
        try:
            loaded.append((str(path), load_results(path)))
        except ResultFileError as exc:
            inputs.errors.append(str(exc))
    groups = group_shards(loaded, merge_all)
    runs = [merge_shards(group) for group in groups]
    inputs.notices += [line for group in groups for line in repeated_cases(group)]
    inputs.runs = [run for run in runs if not measured_nothing(run.run)]
    for run in runs:
        if measured_nothing(run.run):
            skipped = (
                "; ".join(sorted({c.message.splitlines()[0] for c in run.run.cases if c.message})) or "none"
            )
            inputs.notices.append(
                f"{', '.join(run.sources)}: a bench run that measured nothing is not shown as a run "
                f"(every suite skipped: {skipped})"
            )
    return inputs


def measured_nothing(run: RunResult) -> bool:
    """A bench run with no figure and no suite that ran: all it says is why every suite skipped."""
    return (
        run.metadata.get("kind") == "bench"
        and not run.benchmarks
        and not run.traffic
        and all(case.outcome == Outcome.SKIPPED for case in run.cases)
    )


def group_shards(
    loaded: Sequence[tuple[str, RunResult]], merge_all: bool = False
) -> list[list[tuple[str, RunResult]]]:
    """The shards of each run: by run_id (all of them with ``merge_all``), in first appearance order."""
    groups: dict[str, list[tuple[str, RunResult]]] = {}
    for source, run in loaded:
        groups.setdefault("*" if merge_all else run.run_id, []).append((source, run))
    return list(groups.values())


def repeated_cases(shards: Sequence[tuple[str, RunResult]]) -> list[str]:
    """One notice per pair of shard files that recorded the same case: the shards of one run select
    disjoint cases (phases by marker, CI cells by chapter × dtype), so a repeat means one shard's files
    were gathered twice (two artifact folders, a re-run's copy) and its cases count twice on the page."""
    first_seen: dict[str, str] = {}
    pairs: dict[tuple[str, str], list[str]] = {}
    for source, run in shards:
        for case in run.cases:
            earlier = first_seen.setdefault(case.id, source)
            if earlier != source:
                pairs.setdefault((earlier, source), []).append(case.id)
    return [
        f"{a} and {b} record the same {len(ids)} case(s) (e.g. {ids[0]}): the same shard gathered twice? "
        "Its cases are counted twice"
        for (a, b), ids in pairs.items()
    ]


def merge_shards(shards: Sequence[tuple[str, RunResult]]) -> LoadedRun:
    runs = [run for _, run in shards]
    merged = merge_runs(runs)
    ids = {run.run_id for run in runs}
    if len(runs) > 1 and len(ids) == 1:
        # Shards of one run keep its id rather than merge_runs' "merged:a,a".
        merged = dataclasses.replace(merged, run_id=runs[0].run_id)
    return LoadedRun(merged, [source for source, _ in shards])
