"""Where a reviewer looks first on a CI system: the job summary and one annotation per failing case.

    python -m reports.ci_summary RESULTS... [--baseline B] [--page-url URL] [--summary FILE] [--annotations]

``--summary FILE`` appends Markdown to ``FILE`` (GitHub Actions: ``$GITHUB_STEP_SUMMARY``): the verdict
(against the baseline where one is given), the likely cause (``harness.causes``), the counts by chapter,
the failing cases with their rules and repro commands, the slowest cases and a link to the page.
``--annotations`` prints one workflow command per failing case on stdout (``::error file=...::``), which a
GitHub job turns into an annotation on the chapter's file, with the case's repro command. Without either,
the Markdown goes to stdout. Every figure comes from the result files; exit 0 unless they cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.causes import headline, likely_causes
from harness.device_probe import first_line
from harness.formatting import show_duration
from harness.outcomes import FAILING, Outcome, count_words
from harness.results import CaseResult, ResultFileError, RunResult
from reports.compare import Comparison, compare_runs
from reports.dashboard import load_one_run
from reports.inputs import load_inputs
from reports.page_common import run_backend

#: Failing cases the summary lists one by one (the annotations name every one).
LISTED = 20
#: The slowest cases the summary lists.
SLOWEST = 10
#: The columns of the chapter table, in order.
COLUMNS = (Outcome.PASSED, Outcome.FAILED, Outcome.XFAILED, Outcome.SKIPPED)


def _cell(text: str) -> str:
    """Text inside a Markdown table cell: pipes escaped, one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def failing(run: RunResult) -> list[CaseResult]:
    return [case for case in run.cases if case.outcome in FAILING and not case.suite_check]


def summary_markdown(run: RunResult, comparison: Comparison | None = None, page_url: str = "") -> str:
    """The job summary of ``run``."""
    bad = failing(run)
    counts = run.summary()
    outcomes = ", ".join(f"{n:,} {o}" for o, n in counts["outcomes"].items() if n)
    verdict = f"❌ {len(bad)} failing" if bad else "✅ no failing case"
    if not run.complete:
        verdict += " (incomplete run)"
    lines = [f"## Conformance: {run_backend(run)} — {verdict}", "", f"{outcomes or 'no cases'}."]
    checks = count_words(counts["suite_checks"])
    if checks:
        lines[-1] += f" Besides these, the suite's own self-checks: {checks}."
    if comparison is not None:
        lines += ["", f"Against the baseline `{comparison.baseline_run_id}`: **{comparison.verdict}**."]
    ranked = likely_causes(bad)
    if ranked:
        lines += ["", f"**{headline(ranked)}**", "", "| failures | rule |", "| ---: | --- |"]
        lines += [f"| {c.explained} | `{c.shown}` |" for c in ranked]
    lines += ["", "| chapter | " + " | ".join(COLUMNS) + " |", "| --- |" + " ---: |" * len(COLUMNS)]
    for chapter, row in counts["chapters"].items():  # the suite's own checks left out, as above
        lines.append(f"| {chapter} | " + " | ".join(str(row[o]) for o in COLUMNS) + " |")
    if bad:
        lines += ["", f"### Failing cases ({len(bad)})", ""]
        for case in bad[:LISTED]:
            rule = f"`[{case.rule}]` " if case.rule else ""
            lines += [f"- {rule}`{case.id}` ({case.outcome}): {_cell(first_line(case.message))}"]
            lines += [f"  `{case.repro}`"] if case.repro else []
        if len(bad) > LISTED:
            lines.append(f"- … and {len(bad) - LISTED} more (the result file and the page have all)")
    slowest = sorted(run.cases, key=lambda c: -(c.duration_s or 0.0))[:SLOWEST]
    if slowest:
        lines += ["", "### Slowest cases", "", "| time | case |", "| ---: | --- |"]
        lines += [f"| {show_duration(c.duration_s)} | `{_cell(c.id)}` |" for c in slowest]
    if page_url:
        lines += ["", f"[The run's page]({page_url})"]
    return "\n".join(lines) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotations(run: RunResult) -> list[str]:
    """One GitHub workflow command per failing case: an error on the chapter's file, titled by its rule,
    with the case, its first message line and its repro command."""
    commands = []
    for case in failing(run):
        path = case.id.split("::", 1)[0]
        title = f"[{case.rule}] {case.outcome}" if case.rule else case.outcome
        body = f"{case.id}: {first_line(case.message)}\nrepro: {case.repro}"
        commands.append(
            f"::error file={_escape_property(path)},title={_escape_property(title)}::{_escape_data(body)}"
        )
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reports.ci_summary", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("results", nargs="+", help="result files or directories (one run, shards merged)")
    parser.add_argument("--baseline", help="result file or directory to compare against; a missing one: none")
    parser.add_argument("--page-url", default="", help="where the run's page is published")
    parser.add_argument("--summary", type=Path, help="append the Markdown here ($GITHUB_STEP_SUMMARY)")
    parser.add_argument(
        "--annotations", action="store_true", help="print one ::error command per failing case"
    )
    args = parser.parse_args(argv)
    loaded = load_inputs(args.results, merge_all=True)
    if loaded.errors or not loaded.runs:
        print(f"error: {loaded.errors[0] if loaded.errors else 'no result files'}", file=sys.stderr)
        return 2
    run = loaded.runs[0].run
    comparison = None
    if args.baseline and Path(args.baseline).exists():
        try:
            comparison = compare_runs(run, load_one_run(args.baseline).run)
        except ResultFileError as exc:
            print(f"warning: baseline not read: {exc}", file=sys.stderr)
    markdown = summary_markdown(run, comparison, args.page_url)
    if args.summary is not None:
        with args.summary.open("a", encoding="utf-8") as out:
            out.write(markdown)
    if args.annotations:
        print("\n".join(annotations(run)))
    if args.summary is None and not args.annotations:
        print(markdown, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
