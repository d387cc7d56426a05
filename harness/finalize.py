"""Artifacts for a run whose pytest process ended without writing them (killed, or ended by the last-resort
watchdog in a run without pytest-xdist):

    python -m harness.finalize RESULT.json [--junit RESULT.junit.xml] [--reason TEXT]

From the journal beside ``RESULT.json``: every case it recorded; the case each process was running when
it ended, judged by what its watchdog left (``RESULT.json.watchdog/``): ``timeout`` with the stacks the
C watchdog dumped, else ``crashed``; every other collected case ``not-run``. Writes the result file
(``complete: false`` with the reason) and, where none was written, a JUnit file with one ``testcase`` per
case. Does nothing when the result file exists. The front door (``nox -s conformance``) runs it for every
shard; the reports read a journal on their own, so the page never needs it.

Standard library, ``harness.results`` and ``harness.outcomes`` only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from harness import causes
from harness.outcomes import FAILING, SKIP_LIKE, Outcome
from harness.results import (
    CaseResult,
    ResultFileError,
    RunResult,
    atomic_write_text,
    load_results,
    write_results,
)

DEFAULT_REASON = "the pytest process ended before writing its result file"


def finalize(path: Path, junit: Path | None, reason: str = DEFAULT_REASON) -> RunResult | None:
    """The final files from the journal; None when the result file already exists (nothing to do)."""
    if path.exists():
        return None
    run = load_results(path)  # the journal: cases so far, collected but unrecorded ones not-run
    _judge_running(run, Path(str(path) + ".watchdog"))
    run.complete = False
    run.metadata["incomplete_reason"] = reason
    write_results(path, run)
    if junit is not None and not junit.exists():
        write_junit(junit, run)
    return run


def _judge_running(run: RunResult, directory: Path) -> None:
    """The case each process was running when it ended: timeout (its stacks dumped) or crashed."""
    if not directory.is_dir():
        return
    by_id = {case.id: n for n, case in enumerate(run.cases)}
    for case_file in sorted(directory.glob("*.case.json")):
        try:
            running = json.loads(case_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        case_id = running.get("case")
        index = by_id.get(case_id) if isinstance(case_id, str) else None
        if index is None or run.cases[index].outcome != Outcome.NOT_RUN:
            continue  # it finished, or it is not one of this run's
        stacks_file = case_file.with_name(case_file.name.removesuffix(".case.json") + ".stacks")
        stacks = stacks_file.read_text(encoding="utf-8", errors="replace") if stacks_file.exists() else ""
        if stacks.strip():
            limit = running.get("limit_s")
            message = (
                f"timeout: the case outlived its time limit of {limit} s ({running.get('source')}); the "
                "last-resort watchdog ended its process. Every thread's Python stack is in the evidence."
            )
            change = {"outcome": Outcome.TIMEOUT, "message": message, "evidence": stacks[-60_000:]}
        else:
            message = "its process ended while running it, with no word"
            change = {"outcome": Outcome.CRASHED, "message": message}
        run.cases[index] = dataclasses.replace(run.cases[index], **change)


def write_junit(path: Path, run: RunResult) -> None:
    """One ``testsuite``, one ``testcase`` per case, each with its outcome as property
    ``conformance:outcome`` (pytest's own writer is used at every normal end)."""
    # How each outcome appears in JUnit: a failure (FAILING), a skip (SKIP_LIKE), or a plain pass.
    failures = sum(case.outcome in FAILING for case in run.cases)
    skipped = sum(case.outcome in SKIP_LIKE for case in run.cases)
    suite = ET.Element(
        "testsuite",
        name="conformance",
        tests=str(len(run.cases)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{sum(case.duration_s for case in run.cases):.3f}",
    )
    properties = causes.junit_properties(run.cases)
    if properties:  # where pytest's writer puts them: the suite's first child
        listed = ET.SubElement(suite, "properties")
        for name, value in properties:
            ET.SubElement(listed, "property", name=name, value=value)
    for case in run.cases:
        suite.append(_testcase(case))
    root = ET.Element("testsuites")
    root.append(suite)
    atomic_write_text(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")


def drop_repeated_testcases(path: Path) -> int:
    """Keep the first ``testcase`` of each case (classname and name) in a JUnit file, recount its suites'
    ``tests``, ``failures``, ``errors`` and ``skipped``; how many were dropped (the file is rewritten only
    then). Raises ``ValueError`` (``ET.ParseError``) for a file that is not XML."""
    root = ET.parse(path).getroot()
    dropped = 0
    for suite in root.iter("testsuite"):
        seen: set[tuple[str | None, str | None]] = set()
        for element in list(suite.findall("testcase")):
            key = (element.get("classname"), element.get("name"))
            if key in seen:
                suite.remove(element)
                dropped += 1
            seen.add(key)
        kept = suite.findall("testcase")
        suite.set("tests", str(len(kept)))
        for attribute, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
            suite.set(attribute, str(sum(element.find(tag) is not None for element in kept)))
    if dropped:
        atomic_write_text(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    return dropped


def _testcase(case: CaseResult) -> ET.Element:
    path, _, name = case.id.partition("::")
    classname = path.removesuffix(".py").replace("/", ".")
    element = ET.Element("testcase", classname=classname, name=name or path, time=f"{case.duration_s:.3f}")
    props = ET.SubElement(element, "properties")
    ET.SubElement(props, "property", name="conformance:outcome", value=str(case.outcome))
    first = case.message.splitlines()[0] if case.message else case.outcome
    if case.outcome in FAILING:
        failure = ET.SubElement(element, "failure", message=f"{case.outcome}: {first}")
        failure.text = "\n\n".join(part for part in (case.message, case.evidence) if part)
    elif case.outcome in SKIP_LIKE:
        ET.SubElement(element, "skipped", type="pytest.skip", message=f"{case.outcome}: {first}")
    return element


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("result", type=Path, help="the result file the run should have written")
    parser.add_argument("--junit", type=Path, default=None, help="write this JUnit file if it is missing")
    parser.add_argument("--reason", default=DEFAULT_REASON, help="why the run is incomplete")
    args = parser.parse_args(argv)
    try:
        run = finalize(args.result, args.junit, args.reason)
    except ResultFileError as exc:
        print(f"harness.finalize: {exc}", file=sys.stderr)
        return 1
    if run is None:
        print(f"harness.finalize: {args.result} exists; nothing to do")
    else:
        counts = {k: v for k, v in run.summary()["outcomes"].items() if v}
        print(f"harness.finalize: wrote {args.result} from its journal ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
