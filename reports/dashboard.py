"""``python -m reports.dashboard [RESULTS ...] [-o site/] [--baseline B] [--fail-on-regression] ...``

Builds the static dashboard: ``index.html`` (run history, newest first) and ``runs/<run>.html`` per run.

Inputs are result files or directories (default: ``results/``; ``*.json`` plus journals of runs that
never finished). Files of the same ``run_id`` are shards of one run and merge; ``--merge`` merges all
inputs into one run (e.g. a conformance file and a benchmark file from the same CI job).

Side by side (backends, case by case): ``--side-by-side B`` (a result file or directory, read as one
run) writes ``compare/<A>--vs--<B>.html`` for every input run A against B: every case id with its
outcome in A and in B, grouped as only A fails / only B fails / different outcome / only in A / only in
B / same outcome, plus B's benchmark figures against A's. ``--side-by-side B,C,...`` (a comma list, each
read as one run) writes ONE page, ``compare/<A>--vs--<B>--vs--<C>.html``, with a column per run: the
input runs, then B, C ... in the order given; the rows where the runs disagree first, and per rule a
failure names, how each run fares. Without the option, a build whose inputs are two runs or more, each
from a different backend (name, version and spec as recorded), gets the page for them too, in input
order. The index links every such page.

Rule coverage: ``--coverage FILE`` (the JSON ``python -m tests.rule_coverage --json`` prints) writes
``coverage.html``, the rule → cases → broken backends table, and sums it up on the index. Without the
option, a ``rule-coverage.json`` in an input directory (or named as an input) is used; it is never read as
a result file. The table reaches the dashboard as that file only: nothing here imports the suite.

Exit status:

* 0 — site written; no regression gate, or nothing regressed.
* 1 — ``--fail-on-regression`` and a metric is "slower", a case newly fails, or a case of the baseline is
  lost (not in this run) or newly skipped — the last two unless ``--narrowed`` says this run is a
  deliberate subset of the baseline (one line each on stdout; ``reports/compare.py`` has the rules).
* 2 — an input (a result file, or the rule coverage file) could not be read: each bad file is named on one
  line on stderr. The readable inputs are still rendered, with the bad files listed on the index page, so
  a CI job keeps a dashboard to look at while the job fails loudly. With no readable input, or an
  unreadable baseline, nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.results import ResultFileError, RunResult
from reports import chart_cache
from reports.compare import DEFAULT_THRESHOLD_PCT, Comparison, compare_runs
from reports.coverage import COVERAGE_FILE, CoverageFileError, load_coverage
from reports.history import HistoryRun, load_history, run_slug, save_to_history
from reports.inputs import LoadedRun, load_inputs
from reports.page_common import column_letter, run_backend
from reports.page_coverage import CoveragePage, coverage_page
from reports.pages import SiteInfo, SiteRun, side_by_side_path
from reports.site import write_site

EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT = 0, 1, 2
DEFAULT_INPUT = "results"
CHART_CACHE = "chart-cache"  # inside --history: SVGs reused by later builds


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reports.dashboard",
        description="Render the conformance/benchmark dashboard (a static site) from result files.",
    )
    p.add_argument("results", nargs="*", help=f"result files or directories (default: {DEFAULT_INPUT}/)")
    p.add_argument("-o", "--output", default="site", help="site directory to write (default: %(default)s)")
    p.add_argument("--baseline", help="result file or directory to compare against (read as one run)")
    p.add_argument(
        "--threshold-pct",
        type=float,
        default=DEFAULT_THRESHOLD_PCT,
        help="relative change below which a metric is 'same' (default: %(default)s)",
    )
    p.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when, against the baseline, a metric is 'slower', a case newly fails, or a baseline "
        "case is lost or newly skipped (see --narrowed)",
    )
    p.add_argument(
        "--narrowed",
        action="store_true",
        help="this run is a deliberate subset of the baseline (a -k or --dtype selection, one chapter, "
        "another machine): lost and newly skipped cases are listed but are not regressions",
    )
    p.add_argument(
        "--side-by-side",
        metavar="B[,C...]",
        help="result file or directory (read as one run) to compare with each input run case by case, "
        "e.g. another backend's run; a comma list of several: one page with the input runs and these, a "
        "column each; automatic when the inputs are runs of different backends",
    )
    p.add_argument(
        "--coverage",
        metavar="FILE",
        help="rule coverage table to show as coverage.html (the JSON `python -m tests.rule_coverage "
        f"--json` prints); default: a {COVERAGE_FILE} among the inputs",
    )
    p.add_argument("--history", help="directory of earlier runs; this build's runs are added to it")
    p.add_argument("--merge", action="store_true", help="merge all inputs into one run (as shards)")
    return p


def _new_site_runs(
    runs: Sequence[LoadedRun], baseline: RunResult | None, threshold_pct: float, *, narrowed: bool
) -> list[SiteRun]:
    """This build's runs, each compared with the baseline when there is one."""
    return [
        SiteRun(
            loaded,
            None
            if baseline is None
            else compare_runs(loaded.run, baseline, threshold_pct, narrowed=narrowed),
            is_new=True,
        )
        for loaded in runs
    ]


def _print_written(
    out: Path,
    site_runs: int,
    new_runs: int,
    coverage: CoveragePage | None,
    compared: Sequence[Sequence[LoadedRun]],
) -> None:
    """One line per page written: the index, the coverage page, each side-by-side page."""
    print(f"wrote {out / 'index.html'}: {site_runs} run(s), {new_runs} from this build")
    if coverage is not None:
        print(f"wrote {out / 'coverage.html'}: {coverage.total} rule(s) from {coverage.source}")
    for runs in compared:
        sides = " vs ".join(f"{column_letter(n)} {run_backend(r.run)}" for n, r in enumerate(runs))
        print(f"wrote {out / side_by_side_path(*runs)}: {sides}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threshold_pct < 0:
        return _fail("--threshold-pct must be zero or more")

    inputs = load_inputs(args.results or [DEFAULT_INPUT], merge_all=args.merge)
    coverage = read_coverage(
        args.coverage or (str(inputs.coverage[-1]) if inputs.coverage else None), inputs.errors
    )
    for line in inputs.notices:
        print(f"note: {line}", file=sys.stderr)
    for line in inputs.errors:
        print(f"error: {line}", file=sys.stderr)
    if not inputs.runs:
        if not inputs.errors:
            where = " ".join(args.results or [DEFAULT_INPUT])
            why = "no run to show (see the notes above)" if inputs.notices else "no result files"
            print(f"error: {why} in {where}", file=sys.stderr)
        return EXIT_BAD_INPUT

    baseline: RunResult | None = None
    if args.baseline:
        try:
            baseline = load_baseline(args.baseline)
        except ResultFileError as exc:
            return _fail(f"baseline: {exc}")
    try:
        compared = side_by_side_sets(inputs.runs, comma_list(args.side_by_side))
    except ResultFileError as exc:
        return _fail(f"side by side: {exc}")

    new_runs = _new_site_runs(inputs.runs, baseline, args.threshold_pct, narrowed=args.narrowed)
    warnings: list[str] = []
    site_runs = new_runs
    if args.history:
        old, warnings = load_history(Path(args.history))
        site_runs = merge_history(new_runs, old)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)

    out = Path(args.output)
    cache = Path(args.history) / CHART_CACHE if args.history else None
    info = SiteInfo(
        load_errors=inputs.errors,
        warnings=warnings,
        baseline=baseline.run_id if baseline else "",
        threshold_pct=args.threshold_pct,
        side_by_side=compared,
        coverage=coverage,
    )
    try:
        with chart_cache.stored_in(cache):
            write_site(out, site_runs, info)
        if args.history:
            for entry in site_runs:
                if entry.is_new:
                    save_to_history(Path(args.history), HistoryRun(entry.loaded, entry.comparison))
    except OSError as exc:
        return _fail(f"cannot write {exc.filename or out}: {exc.strerror or exc}")

    _print_written(out, len(site_runs), len(new_runs), coverage, compared)
    regressions = report_regressions(new_runs)
    for entry in new_runs:  # the verdict and its baseline, whether or not the gate fails
        if entry.comparison is not None:
            print(
                f"gate: {entry.loaded.run.run_id}: verdict {entry.comparison.verdict} against baseline "
                f"{entry.comparison.baseline_run_id}"
            )
    if inputs.errors:
        return EXIT_BAD_INPUT
    if args.fail_on_regression and regressions:
        return EXIT_REGRESSION
    return EXIT_OK


def read_coverage(path: str | None, errors: list[str]) -> CoveragePage | None:
    """The coverage page for ``path`` (None: no page); an unreadable file is one more line in ``errors``."""
    if path is None:
        return None
    try:
        return coverage_page(load_coverage(path), path)
    except CoverageFileError as exc:
        errors.append(str(exc))
        return None


def load_baseline(path: str) -> RunResult:
    """All files under the baseline path are read as shards of one run; any unreadable one is an error."""
    return load_one_run(path).run


def load_one_run(path: str) -> LoadedRun:
    """Every file under ``path`` as shards of one run; any unreadable one is an error."""
    loaded = load_inputs([path], merge_all=True)
    if loaded.errors:
        raise ResultFileError(loaded.errors[0])
    if not loaded.runs:
        raise ResultFileError(f"{path}: no result files")
    return loaded.runs[0]


def comma_list(value: str | None) -> list[str]:
    """``a.json,b/`` → the paths; a path that holds a comma cannot be named this way."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def side_by_side_sets(runs: Sequence[LoadedRun], others: Sequence[str]) -> list[tuple[LoadedRun, ...]]:
    """The runs to compare case by case, one page per tuple. One other run: every input run against it
    (a pair each). Several: one page of the input runs and them, in that order (a run named twice, once).
    None: the input runs, when there are two or more and each is from a different backend."""
    side = [load_one_run(path) for path in others]
    if len(side) == 1:
        return [(a, side[0]) for a in runs]
    if side:
        unique: dict[str, LoadedRun] = {}
        for loaded in [*runs, *side]:
            unique.setdefault(loaded.run.run_id, loaded)
        return [tuple(unique.values())] if len(unique) > 1 else []
    if len(runs) >= 2 and len({run_backend(r.run) for r in runs}) == len(runs):
        return [tuple(runs)]
    return []


def merge_history(new_runs: Sequence[SiteRun], old: Sequence[HistoryRun]) -> list[SiteRun]:
    """This build's runs replace history entries of the same run; a re-render without a baseline keeps
    the verdict recorded earlier."""
    kept = {run_slug(h.loaded.run.run_id): h for h in old}
    merged: list[SiteRun] = []
    for entry in new_runs:
        earlier = kept.pop(entry.slug, None)
        if entry.comparison is None and earlier is not None:
            entry = SiteRun(entry.loaded, earlier.comparison, is_new=True)
        merged.append(entry)
    merged.extend(SiteRun(h.loaded, h.comparison, is_new=False) for h in kept.values())
    return merged


def report_regressions(runs: Sequence[SiteRun]) -> list[str]:
    """Print one line per regression of this build's runs (whether or not they gate the exit status)."""
    lines: list[str] = []
    for entry in runs:
        comparison: Comparison | None = entry.comparison
        if comparison is None:
            continue
        for line in comparison.regressions():
            lines.append(f"REGRESSION [{entry.loaded.run.run_id} vs {comparison.baseline_run_id}] {line}")
    for line in lines:
        print(line)
    return lines


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
