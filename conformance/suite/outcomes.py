"""What a failed check means for the run: rule levels, coverage gaps and declared known failures.

A pytest plugin (registered by ``conformance/conftest.py``) that looks at every setup and call report
where the case ran (each pytest-xdist worker, or the single process) and decides its outcome:

* a failure naming a *must* rule stays a failure (``failed``; ``error`` in setup);
* a failure naming a *should* rule (``conformance/common/rules.py``) becomes ``should-failed``:
  reported apart, and failing the run only with ``--strict-should``;
* ``checks.CoverageGap`` becomes ``coverage``: counted, never a failure;
* a failure matching a declared known failure (``conformance/suite/known_failures.py``) becomes ``xfailed``
  with the entry's reason and link; a matching case that passes fails with ``known-failures/stale``;
* a case declared to kill its process (an entry with ``crash = true``) whose pytest-xdist worker died while
  running it becomes ``xfailed`` the same way; only the controller sees that (``pytest_handlecrashitem``),
  so only a run under pytest-xdist survives the crash to record it; a generated case's crash that the crash
  search found again (``conformance/suite/crash_replay.py``) carries the crashing call's rule, which an
  entry's ``rule`` must match;
* a failure naming a rule its case does not declare (``conformance/common/declared_rules.py``) is the suite's
  error, not the backend's: outcome ``error`` under rule ``suite/undeclared-rule``, counted with the suite's
  self-checks (``suite_check``), whatever the rule's level or a known-failure entry says;
* an ``AttributeError`` for a protocol attribute the backend lacks (a case reached a part it did not ask
  for) becomes a skip naming the part (``conformance/common/parts.py``): optional parts never fail a case.

Converted reports look to pytest like xfails (``outcome = "skipped"`` plus ``wasxfail``), so the exit
status, ``-x`` and JUnit treat them as not failed: JUnit gets ``<skipped type="pytest.xfail"
message="should: [rule] ...">`` (``coverage: ...``, ``known failure: ...``). Every decided case also
carries JUnit properties ``conformance:outcome``, ``conformance:rule``, ``conformance:level`` (and
``known_failure:reason`` / ``known_failure:link``). The outcome itself rides on the report as
``case_result`` (``harness.pytest_plugin.CASE_RESULT_ATTR``), a plain dict that survives xdist's report
serialisation, for the result file and for the controller's counts; on xdist's crash report too, where
the result recorder records it in place of ``crashed``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest

from conformance.common import declared_rules
from conformance.common.checks import CoverageGap
from conformance.common.generation import replay_note
from conformance.common.parts import missing_part_reason
from conformance.common.rules import Level, level_of, rule_of
from conformance.suite.known_failures import STALE_RULE, KnownFailure, case_matches, first_match
from harness.outcomes import SUITE_CHECK_MARKER, SUITE_DECIDED, Outcome, is_suite_check
from harness.pytest_plugin import CASE_RESULT_ATTR
from harness.run_end import role

PROPERTY_PREFIX = "conformance:"
#: pytest's category (its counts, its one-letter progress) for a passed suite self-check.
SUITE_CHECK_CATEGORY = "suite self-check passed"
WORKER_OUTPUT_KEY = "conformance_known_failures_matched"
#: Where a summary stops listing cases one by one.
LIST_LIMIT = 20
_EXCEPTION_PREFIX = re.compile(r"^[\w.]+: (?=\[)")


def add_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--strict-should",
        action="store_true",
        default=False,
        help="failures of *should* rules (policy, optimisation, performance; see `python -m "
        "conformance.common.rules`) fail the run too; by default they are reported as should-failed",
    )
    group.addoption(
        "--known-failures",
        metavar="FILE",
        action="append",
        default=[],
        help="TOML (or .json) file of declared known failures: [[known_failures]] case = glob, rule = "
        "glob (optional), reason, link, crash = true or device_fault = true (optional: the case kills its "
        "process, or breaks its CUDA context; recorded only under pytest-xdist; a crash entry's rule names "
        "the crashing call's rule that the crash search found); repeatable (see "
        "conformance/suite/known_failures.py)",
    )


def case_result(report: pytest.TestReport | pytest.CollectReport) -> dict[str, Any] | None:
    value = getattr(report, CASE_RESULT_ATTR, None)
    return value if isinstance(value, dict) else None


class CaseOutcomes:
    """The plugin. ``entries``: the known failures in force; ``sources``: where they came from."""

    def __init__(
        self,
        config: pytest.Config,
        entries: Sequence[KnownFailure],
        sources: Sequence[str],
        backend: object = None,
    ):
        self.config = config
        self.backend = backend
        self.entries = list(entries)
        self.sources = list(sources)
        self.strict_should = bool(config.getoption("--strict-should"))
        self.matched: set[int] = set()  # indices of the entries that match a collected case
        self.collected = False  # whether any collection was seen: a run stopped before it knows nothing
        self.decided: dict[Outcome, list[pytest.TestReport]] = {outcome: [] for outcome in SUITE_DECIDED}
        self.stale: list[pytest.TestReport] = []
        #: Crash entries for cases selected in a run without pytest-xdist, where a crash ends the run.
        self.single_process_crashes: list[KnownFailure] = []
        #: Cases whose call passed and that only device-fault entries declare: stale unless the teardown
        #: brings the watchdog's device fault.
        self.awaiting_fault: set[str] = set()

    # -- where the case runs ---------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
        if call.when == "setup" and item.get_closest_marker(SUITE_CHECK_MARKER) is not None:
            item.user_properties.append((PROPERTY_PREFIX + "suite_check", "true"))  # JUnit: the suite's own
        report: pytest.TestReport = yield
        if report.failed and "@reproduce_failure" in str(report.longrepr):  # the suite's option, not an edit
            report.longrepr = replay_note(str(report.longrepr))
        if report.when in ("setup", "call") and not hasattr(report, "wasxfail"):
            if report.failed and call.excinfo is not None:
                self._decide_failure(item, call.excinfo, report)
            elif report.passed and report.when == "call":
                self._check_stale(item, report)
        elif report.when == "teardown" and item.nodeid in self.awaiting_fault:
            self.awaiting_fault.discard(item.nodeid)
            if not report.failed and case_result(report) is None:  # no device fault came after the call
                self._check_stale(item, report, after_teardown=True)
        return report

    def _decide_failure(
        self, item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException], report: pytest.TestReport
    ) -> None:
        exc = excinfo.value
        missing = missing_part_reason(self.backend, exc) if self.backend is not None else None  # type: ignore[arg-type]
        if missing is not None:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {missing}")
            return
        message = _failure_text(report, exc)
        text = str(exc).strip() if isinstance(exc, (AssertionError, CoverageGap)) else message
        first = text.splitlines()[0] if text else type(exc).__name__
        rule = rule_of(str(exc)) if isinstance(exc, AssertionError) else None
        case_rule = getattr(exc, "case_rule", None)  # a contract monitor's failure: the case's own rule
        gap_rule = exc.rule if isinstance(exc, CoverageGap) else None
        undeclared = declared_rules.undeclared(item, (rule, case_rule, gap_rule))
        if undeclared is not None:
            self._suite_error(item, report, f"{undeclared}\nthe failure: {message}")
            return
        if isinstance(exc, CoverageGap):
            self._convert(item, report, Outcome.COVERAGE, f"coverage: {first}", message, exc.rule, None, None)
            return
        level = level_of(rule) if rule else Level.MUST
        known = first_match(self.entries, item.nodeid, rule)
        if known is None and case_rule is not None:
            known = first_match(self.entries, item.nodeid, case_rule)
        if known is not None:
            shown = f"{_known_why(known)} — {first}"
            self._convert(item, report, Outcome.XFAILED, shown, message, rule, level, known)
        elif level is Level.SHOULD:
            self._convert(item, report, Outcome.SHOULD_FAILED, f"should: {first}", message, rule, level, None)
        else:
            outcome = Outcome.FAILED if report.when == "call" else Outcome.ERROR
            self._annotate(item, report, outcome, None, rule, level, None)

    def _suite_error(self, item: pytest.Item, report: pytest.TestReport, message: str) -> None:
        """The case failed under a rule it does not declare: its declaration is wrong (or its check names
        the wrong rule), so the verdict is not the backend's. Still a failing report (the run fails), shown
        as an error and recorded with the suite's self-checks."""
        item.add_marker(SUITE_CHECK_MARKER)  # the reports still to come (teardown) say so too
        report.keywords[SUITE_CHECK_MARKER] = 1  # type: ignore[index]
        report.longrepr = f"{message}\n\n{report.longrepr}"
        item.user_properties.append((PROPERTY_PREFIX + "suite_check", "true"))
        self._annotate(item, report, Outcome.ERROR, message, declared_rules.UNDECLARED, Level.MUST, None)

    def _check_stale(
        self, item: pytest.Item, report: pytest.TestReport, after_teardown: bool = False
    ) -> None:
        matches = case_matches(self.entries, item.nodeid)
        if not matches:
            return
        if not after_teardown and all(e.device_fault for e in matches):
            # The watchdog finds a device fault after the call passed (its probe, then the teardown):
            # only a teardown without one makes the entry stale.
            self.awaiting_fault.add(item.nodeid)
            return
        entry = matches[0]
        link = f" ({entry.link})" if entry.link else ""
        what = {None: "a known failure", "crash": "a known crash", "device_fault": "a known device fault"}
        message = (
            f"[{STALE_RULE}] {item.nodeid}: passed, but {entry.source} declares it {what[entry.ends_as]}: "
            f"{entry.reason}{link}; remove or narrow the entry ({entry.case!r})"
        )
        report.outcome = "failed"
        report.longrepr = message
        self._annotate(item, report, Outcome.FAILED, message, STALE_RULE, Level.MUST, entry)

    def _convert(
        self,
        item: pytest.Item,
        report: pytest.TestReport,
        outcome: Outcome,
        shown: str,
        message: str,
        rule: str | None,
        level: Level | None,
        known: KnownFailure | None,
    ) -> None:
        """Make pytest see a non-failing, xfail-like report; the recorded outcome is ``outcome``."""
        _xfail_like(report, shown)
        self._annotate(item, report, outcome, message, rule, level, known)

    def _annotate(
        self,
        item: pytest.Item,
        report: pytest.TestReport,
        outcome: Outcome,
        message: str | None,
        rule: str | None,
        level: Level | None,
        known: KnownFailure | None,
    ) -> None:
        props = _set_case_result(report, outcome, message, rule, level, known)
        # Properties set here ride on the teardown report, which is where JUnit XML reads them.
        item.user_properties.extend(props)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
        if report.when == "call" and report.passed and is_suite_check(report):
            # The suite's own check passed: pytest's counts say so apart, never as the backend's "passed".
            return SUITE_CHECK_CATEGORY, ",", ("SUITE-CHECK", {"green": True})
        result = case_result(report)
        if result is None or report.when not in ("setup", "call"):
            return None
        if result["outcome"] == Outcome.ERROR and result["rule"] == declared_rules.UNDECLARED:
            return "error", "E", ("SUITE ERROR", {"red": True})  # pytest's errors: never "FAILED"
        if result["outcome"] == Outcome.SHOULD_FAILED:
            return Outcome.SHOULD_FAILED.value, "S", ("SHOULD-FAIL", {"yellow": True})
        if result["outcome"] == Outcome.COVERAGE:
            return Outcome.COVERAGE.value, "C", ("COVERAGE", {"cyan": True})
        return None

    # -- where reports gather (the controller, or the single process) ----------------------------------

    @pytest.hookimpl(optionalhook=True, trylast=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: object) -> None:
        """A pytest-xdist worker died while running ``crashitem`` (the controller's hook; xdist then logs
        ``report``). trylast: the run's end (``harness/run_end.py``, tryfirst) has judged the crash from
        the worker's watchdog files first, and a crash it explained (a timeout, or no crash at all: its
        ``case_result`` is set) keeps that verdict. A plain crash that a ``crash = true`` entry declares, or
        a device fault that a ``device_fault = true`` entry declares, becomes that known failure: an
        xfail-like report carrying the case result, which the result recorder (``harness/pytest_plugin.py``)
        records in place of ``crashed`` / ``device-fault``."""
        explained = case_result(report)
        rule = None
        if explained is None:
            known = first_match(self.entries, crashitem, None, crash=True)
            message = str(report.longrepr)  # pytest-xdist's "worker 'gw0' crashed while running '<case>'"
            evidence = None
        elif explained.get("outcome") == Outcome.CRASHED.value:  # found again and shrunk (crash_replay.py)
            rule = explained.get("rule")
            known = first_match(self.entries, crashitem, rule, crash=True)
            message, evidence = str(explained.get("message")), explained.get("evidence")
        elif explained.get("outcome") == Outcome.DEVICE_FAULT.value:  # the watchdog's verdict, declared?
            known = first_match(self.entries, crashitem, None, device_fault=True)
            message, evidence = str(explained.get("message")), explained.get("evidence")
        else:
            return
        if known is None:
            return
        _xfail_like(report, f"{_known_why(known)} — {message}")
        # The case's last report, with no phase of its own ("???"): as a teardown, JUnit reads its properties.
        report.when = "teardown"  # type: ignore[assignment]
        # A device fault keeps the CUDA error in full, as the watchdog's verdict had it.
        props = _set_case_result(report, Outcome.XFAILED, message, rule, Level.MUST, known, evidence)
        if explained is not None and explained.get("repro"):  # the shrunk crash's own repro
            case_result(report)["repro"] = explained["repro"]  # type: ignore[index]
        report.user_properties = [*report.user_properties, *props]

    @pytest.hookimpl(trylast=True)
    def pytest_report_collectionfinish(
        self, config: pytest.Config, items: Sequence[pytest.Item]
    ) -> list[str]:
        """In one process, say up front that a declared crash will end the run (see ``crash_warnings``)."""
        self.single_process_crashes = [
            e for e in self.entries if e.ends_process and any(e.matches_case(item.nodeid) for item in items)
        ]
        return [f"warning: {line}" for line in self.crash_warnings()]

    def crash_warnings(self) -> list[str]:
        if role(self.config) != "single" or self.config.getoption("collectonly"):
            return []
        return [
            f"known-failures: {entry.describe()} declares that the case ends its process: only a run under "
            "pytest-xdist (-n) survives that and records it xfailed; in this single process it ends the run"
            for entry in self.single_process_crashes
        ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # tryfirst: before -k, -m and --dtype deselect anything, so an entry for another cell still counts.
        self._match([item.nodeid for item in items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        # The controller hears each worker's selection at the start: a run stopped before its workers end
        # (a deadline, a signal) never gets their matches below, and must not call every entry unmatched.
        self._match(ids)

    def _match(self, ids: Sequence[str]) -> None:
        self.collected = True
        self.matched.update(n for n, e in enumerate(self.entries) if any(e.matches_case(i) for i in ids))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        # The controller of an xdist run collects nothing itself: each worker sends what it matched.
        output = getattr(node, "workeroutput", None) or {}
        self.matched.update(int(n) for n in output.get(WORKER_OUTPUT_KEY, []))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        result = case_result(report)
        if result is None:
            return
        if result["outcome"] in self.decided:
            self.decided[result["outcome"]].append(report)
        elif result.get("rule") == STALE_RULE:
            self.stale.append(report)

    def unmatched(self) -> list[KnownFailure]:
        """Entries that match no collected case (counted before any deselection); none when the run was
        stopped before anything was collected (nothing is known then)."""
        return [e for n, e in enumerate(self.entries) if n not in self.matched] if self.collected else []

    def warnings(self) -> list[str]:
        unmatched = [f"known-failures: {e.describe()} matches no collected case" for e in self.unmatched()]
        return unmatched + self.crash_warnings()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            self.config.workeroutput[WORKER_OUTPUT_KEY] = sorted(self.matched)  # type: ignore[attr-defined]
            return
        if self.config.pluginmanager.hasplugin("harness.pytest_plugin"):
            from harness.pytest_plugin import add_run_metadata

            add_run_metadata(self.config, "strict_should", self.strict_should)
            if self.entries:
                add_run_metadata(
                    self.config,
                    "known_failures",
                    {
                        "sources": self.sources,
                        "entries": [e.to_dict() for e in self.entries],
                        "unmatched": [e.to_dict() for e in self.unmatched()],
                    },
                )
            warnings = self.warnings()
            if warnings:
                add_run_metadata(self.config, "warnings", warnings)
        should_failed = self.decided[Outcome.SHOULD_FAILED]
        if self.strict_should and should_failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if hasattr(self.config, "workerinput"):
            return
        write = terminalreporter.write_line
        should = self.decided[Outcome.SHOULD_FAILED]
        if should:
            verdict = (
                "they fail this run (--strict-should)"
                if self.strict_should
                else "they do not fail this run; --strict-should makes them"
            )
            terminalreporter.section(f"should-level failures: {len(should)}; {verdict}", yellow=True)
            _list_reports(write, should)
        coverage = self.decided[Outcome.COVERAGE]
        if coverage:
            terminalreporter.section(f"coverage gaps: {len(coverage)} (never a failure)", cyan=True)
            _list_reports(write, coverage)
        known = self.decided[Outcome.XFAILED]
        if known or self.stale or self.entries:
            terminalreporter.section("known failures", bold=True)
            write(
                f"{len(self.entries)} declared ({', '.join(self.sources) or 'none'}): {len(known)} failed as "
                f"declared (xfailed), {len(self.stale)} stale (passed: failed with {STALE_RULE})"
            )
            for report in known:
                entry = (case_result(report) or {}).get("known_failure") or {}
                link = f" {entry['link']}" if entry.get("link") else ""
                write(f"XFAIL {report.nodeid} — {entry.get('reason', '')}{link}")
            for report in self.stale:
                write(f"STALE {report.nodeid}")
        for line in self.warnings():
            terminalreporter.write_line(f"warning: {line}", yellow=True)


def _known_why(known: KnownFailure) -> str:
    """How an xfail-like report of a declared known failure begins (JUnit's message, the terminal)."""
    return f"known failure: {known.reason}" + (f" ({known.link})" if known.link else "")


def _xfail_like(report: pytest.TestReport, shown: str) -> None:
    """pytest's xfail: not a failure to the exit status, ``-x`` and JUnit (``<skipped type="pytest.xfail"
    message=shown>``)."""
    report.outcome = "skipped"
    report.wasxfail = shown  # type: ignore[attr-defined]


def _set_case_result(
    report: pytest.TestReport,
    outcome: Outcome,
    message: str | None,
    rule: str | None,
    level: Level | None,
    known: KnownFailure | None,
    evidence: str | None = None,
) -> list[tuple[str, object]]:
    """The recorded outcome on ``report`` (``case_result``); returns the JUnit properties that say it."""
    # Plain strings: the report crosses pytest-xdist's serialiser, which takes no str subclass.
    result: dict[str, Any] = {
        "outcome": outcome.value,
        "message": message,
        "rule": rule,
        "level": level.value if level else None,
        "known_failure": known.to_dict() if known else None,
    }
    if evidence:
        result["evidence"] = evidence
    setattr(report, CASE_RESULT_ATTR, result)
    props: list[tuple[str, object]] = [(PROPERTY_PREFIX + "outcome", outcome.value)]
    props += [(PROPERTY_PREFIX + "rule", rule)] if rule else []
    props += [(PROPERTY_PREFIX + "level", level.value)] if level else []
    if known is not None:
        props += [("known_failure:reason", known.reason), ("known_failure:link", known.link)]
    return props


def _list_reports(write: Any, reports: Sequence[pytest.TestReport]) -> None:
    for report in reports[:LIST_LIMIT]:
        lines = str((case_result(report) or {}).get("message") or "").strip().splitlines()
        # "conformance.common.checks.CheckFailure: [rule] ..." -> "[rule] ...": the rule id says enough.
        first = _EXCEPTION_PREFIX.sub("", lines[0]) if lines else ""
        write(f"{report.nodeid} — {first}")
    if len(reports) > LIST_LIMIT:
        write(f"… and {len(reports) - LIST_LIMIT} more (all of them are in the result file)")


def _failure_text(report: pytest.TestReport, exc: BaseException) -> str:
    """The failure as the result file records failures: pytest's crash line (``Type: message``)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    return replay_note(str(message) if message else f"{type(exc).__name__}: {exc}")
