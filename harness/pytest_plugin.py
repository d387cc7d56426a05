"""pytest plugin (``-p harness.pytest_plugin``): records every case into the versioned result file.

Params are attached to each item as ``user_properties`` (``param:<name>``) where the test runs, so they
travel through pytest-xdist and into JUnit XML. Recording happens only in the controller (or the single
process): each case is journaled as soon as its teardown report arrives, and the final JSON is written
atomically when the session ends. A worker that dies mid-test is recorded as ``crashed``.

Another plugin may decide a case's recorded outcome where pytest has no word for it: it sets
``report.case_result`` (``CASE_RESULT_ATTR``) on the setup or call report to a JSON-serialisable dict with
``outcome`` (a ``harness.outcomes.Outcome``'s value, as a plain ``str``) and optionally ``message``,
``rule``, ``level``, ``known_failure`` and ``evidence``. It is a plain report attribute, so it survives
pytest-xdist's report serialisation (which takes no ``str`` subclass: hence ``Outcome.X.value``). The
conformance suite uses it for ``should-failed``, ``coverage`` and declared known failures; the watchdog
and the run's end (``harness/watchdog.py``, ``harness/run_end.py``, registered here too) for ``timeout``,
``device-fault`` and ``not-run`` (``harness.outcomes.FINAL``), on any phase's report.

A worker's death is explained the same way: a plugin that knows why sets ``case_result`` on pytest-xdist's
crash report in ``pytest_handlecrashitem`` (the run's end from the watchdog's verdict; the conformance suite
for a case declared to kill its process, as ``xfailed``), and the case is recorded with that outcome, its
``known_failure`` and the report's ``user_properties`` added to those of the case's earlier reports; a crash
report without one is ``crashed``.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import case_order, run_end, start_gate, worker_exit
from harness.device_probe import sanitizer_repro
from harness.environment import capture_environment
from harness.failure_surfaces import CausesInJunit, ReproOnFailures
from harness.outcomes import FAILING, FINAL, Outcome, count_words, is_suite_check
from harness.phases import TIMELINE_KEY, Timeline
from harness.results import (
    LEVELS,
    OUTCOMES,
    CaseResult,
    ResultJournal,
    RunResult,
    chapter_of,
    new_run,
    utc_now,
    write_results,
)
from harness.watchdog import CASE_RESULT_ATTR

PARAM_PREFIX = "param:"
MESSAGE_LIMIT = 4000
__all__ = ["CASE_RESULT_ATTR", "add_run_metadata", "chapter_of", "repro_command", "set_case_params"]

_METADATA_KEY = pytest.StashKey[dict[str, Any]]()
_RECORDER_KEY = pytest.StashKey["ResultRecorder"]()

# Before the conftest imports torch: the handler registered first runs last (harness/worker_exit.py).
worker_exit.install()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("results", "conformance result file")
    group.addoption(
        "--results-json",
        metavar="PATH",
        default=None,
        help="write every case to this versioned JSON result file (journaled to PATH.journal.jsonl)",
    )
    group.addoption(
        "--repro-prefix",
        metavar="STR",
        default="python -m pytest",
        help="command that starts each case's one-line repro (default: %(default)r)",
    )
    run_end.add_options(parser)
    case_order.add_options(parser)


# ---------------------------------------------------------------------------------------------- public API


def add_run_metadata(config: pytest.Config, key: str, value: Any) -> None:
    """Store JSON-serialisable run metadata (e.g. ``backend``); it lands in ``RunResult.metadata``.

    The key ``repro_args`` (a list of str) is appended to every repro command, e.g. ``["--backend", spec]``.
    """
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"run metadata {key!r} must be JSON-serialisable: {exc}") from exc
    if key == "repro_args" and not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
        raise TypeError("run metadata 'repro_args' must be a list of str")
    config.stash.setdefault(_METADATA_KEY, {})[key] = value
    recorder = config.stash.get(_RECORDER_KEY, None)
    if recorder is not None:
        recorder.metadata_added(key, value)


def set_case_params(item: pytest.Item, params: dict[str, Any]) -> None:
    """Set (or override) the recorded params of one case; call it where the item lives (collection/setup)."""
    props = item.user_properties
    for name, value in params.items():
        prop = PARAM_PREFIX + name
        props[:] = [p for p in props if p[0] != prop]
        props.append((prop, stringify_param(value)))


def stringify_param(value: Any) -> str:
    """Readable param values: ``float16`` for torch dtypes, ``257x129x65`` for shapes, else ``str``."""
    kind = type(value)
    if kind.__module__ == "torch" and kind.__name__ == "dtype":
        return str(value).removeprefix("torch.")
    if isinstance(value, (tuple, list)) and value and all(type(v) is int for v in value):
        return "x".join(str(v) for v in value)
    return str(value)


def repro_command(prefix: str, nodeid: str, extra_args: list[str] | None = None) -> str:
    parts = [prefix, shlex.quote(nodeid), *(shlex.quote(arg) for arg in extra_args or [])]
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------- hooks


def pytest_itemcollected(item: pytest.Item) -> None:
    # Runs wherever collection happens (each xdist worker): the params then ride on every report.
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        set_case_params(item, dict(callspec.params))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    case_order.configure_node(node)  # pytest-xdist's controller, for each worker it starts


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    case_order.reorder(config, items)  # last: after any plugin's deselection


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    # A phase the front door started early (harness/start_gate.py) waits here, collected, before any
    # fixture or case runs: in each xdist worker, or in the single process.
    if session.config.getoption("collectonly"):
        return
    try:
        modules = {item.module.__name__ for item in session.items if getattr(item, "module", None)}
        start_gate.wait_for_gate(setup=start_gate.held_setup(modules), config=session.config)
    except start_gate.FrontDoorGone as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)


_SESSION_KEY = pytest.StashKey[pytest.Session]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION_KEY] = session  # its final exit status, read at unconfigure


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker's session is over: no teardown at its exit
        worker_exit.session_over()
    elif config.pluginmanager.has_plugin("dsession") and worker_exit.is_the_process_session(config):
        # An xdist controller: its files are written and its output shown; it leaves with its status.
        session = config.stash.get(_SESSION_KEY, None)
        if session is not None:
            worker_exit.session_over(int(session.exitstatus))


def pytest_configure(config: pytest.Config) -> None:
    case_order.check_option(config)
    if hasattr(config, "workerinput"):
        worker_exit.skip_final_collection(config)
    path = config.getoption("--results-json")
    run_end.configure(config, Path(path) if path and not hasattr(config, "workerinput") else None)
    if not path or hasattr(config, "workerinput"):
        return  # nothing asked for, or an xdist worker: the controller records
    recorder = ResultRecorder(config, Path(path), config.getoption("--repro-prefix"))
    end = run_end.run_end(config)
    if end is not None:  # its emergency end (a stuck main thread) writes the result file through this
        end.writers.append(recorder.write_final)
    config.stash[_RECORDER_KEY] = recorder
    config.pluginmanager.register(recorder, "harness-results-recorder")
    config.pluginmanager.register(ReproOnFailures(recorder), "harness-repro-on-failures")
    config.pluginmanager.register(CausesInJunit(recorder), "harness-causes-in-junit")


def recorded_run(config: pytest.Config) -> RunResult | None:
    """The run the recorder wrote (its outcomes final), where this process records one; else None."""
    recorder = config.stash.get(_RECORDER_KEY, None)
    return recorder.run if recorder is not None else None


class _Pending:
    """The reports of one case seen so far (setup, call, teardown)."""

    def __init__(self) -> None:
        self.reports: dict[str, pytest.TestReport] = {}
        self.user_properties: list[tuple[str, object]] = []
        self.duration = 0.0
        self.worker: str | None = None
        self.start: float | None = None  # epoch seconds of the earliest report's start (setup)
        self.suite_check = False  # a suite_check case: the suite's own check, no backend involved


class ResultRecorder:
    """Controller-side plugin: turns reports into CaseResults, journals them, writes the final file."""

    def __init__(self, config: pytest.Config, path: Path, repro_prefix: str) -> None:
        self.config = config
        self.path = path
        self.repro_prefix = repro_prefix
        self.run: RunResult = new_run(capture_environment())
        self.journal = ResultJournal(path)
        self._pending: dict[str, _Pending] = {}
        self._crashed: set[str] = set()
        self._recorded_tests = 0
        self._recorded_ids: set[str] = set()
        self._summary_line: str | None = None
        #: The session's start, its cases' window and its end: where its wall went (and cases' ``started_s``).
        self._timeline = Timeline(time.time())
        self._collected_journaled = False
        self._written = False

    @property
    def metadata(self) -> dict[str, Any]:
        return self.config.stash.setdefault(_METADATA_KEY, {})

    def metadata_added(self, key: str, value: Any) -> None:
        if self.journal.is_open:
            self.journal.add_metadata(key, value)

    # -- session -----------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # A stale final file from an earlier run would hide this run's journal if this run is killed.
        self.path.unlink(missing_ok=True)
        self.run.metadata = dict(self.metadata)
        self._timeline = Timeline(time.time())
        self.journal.start(self.run)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # A module that fails to import has no test reports at all; record it so the chapter is not silent.
        if report.failed:
            self._record(
                CaseResult(
                    id=report.nodeid,
                    chapter=chapter_of(report.nodeid),
                    params={},
                    outcome=Outcome.ERROR,
                    message="collection failed: " + _failure_text(report),
                    repro=self.repro_of(report.nodeid),
                    duration_s=0.0,
                    worker=None,
                )
            )

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: object) -> None:
        self._crashed.add(crashitem)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.config.getoption("collectonly"):
            self._journal_collected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._timeline.collected(time.time())
        self._journal_collected(list(ids))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self._timeline.workers_done = time.time()

    def _journal_collected(self, ids: list[str]) -> None:
        # What the run will run, once: a journal rebuilt after a hard death lists the rest as not-run.
        if not self._collected_journaled and self.journal.is_open:
            self._collected_journaled = True
            self.journal.add_collected(ids)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        pending = self._pending.setdefault(report.nodeid, _Pending())
        pending.duration += float(getattr(report, "duration", 0.0) or 0.0)
        pending.worker = pending.worker or worker_of(report)
        pending.suite_check = pending.suite_check or is_suite_check(report)
        start = getattr(report, "start", None)
        if isinstance(start, float) and (pending.start is None or start < pending.start):
            pending.start = start
        self._timeline.case_ran(start, getattr(report, "stop", None))
        if _is_crash_report(report, self._crashed):
            # What explained the crash (its outcome's properties) adds to what the case's reports carried.
            pending.user_properties += [p for p in report.user_properties if p not in pending.user_properties]
            self._finish(report.nodeid, crash=report)
            return
        if report.user_properties:
            pending.user_properties = list(report.user_properties)
        pending.reports[report.when] = report
        if report.when == "teardown":
            self._finish(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.write_final(self._incomplete_reason(session, exitstatus))
        if session.exitstatus == pytest.ExitCode.TESTS_FAILED and self.run.complete and not self.fails_run():
            # pytest counted a report that failed before its case's outcome was decided: a device fault or
            # a dead worker that a known failure declares is xfailed in the result file. The exit status
            # says what the result file says (a GPU run exited 1 beside "0 failed").
            session.exitstatus = pytest.ExitCode.OK
        if session.exitstatus == pytest.ExitCode.OK and self.run.cases and not self.run.exercised():
            # Green must mean "the backend was checked": skips, coverage gaps and the suite's own checks
            # say nothing about it. pytest's "no tests" status: the front door reads it per phase.
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
            self._summary_line = f"{self._summary_line}\n{nothing_exercised_line(self.run)}"

    def fails_run(self) -> bool:
        """Whether a recorded case fails the run: a failing outcome (``FAILING``), or a should-level
        failure under ``--strict-should``."""
        strict = self.run.metadata.get("strict_should") is True
        failing = {*FAILING, Outcome.SHOULD_FAILED} if strict else FAILING
        return any(case.outcome in failing for case in self.run.cases)

    def write_final(self, reason: str | None) -> None:
        """The final result file (once), the journal then discarded."""
        if self._written:
            return
        self._written = True
        for nodeid in list(self._pending):
            self._finish(nodeid)  # interrupted mid-case: keep what its reports say
        self.run.metadata = dict(self.metadata)
        end = run_end.run_end(self.config)
        cost = end.watchdog_cost() if end is not None else None
        if cost is not None:
            self.run.metadata["case_watchdog"] = cost
        if reason:
            self.run.metadata["incomplete_reason"] = reason
        self.run.metadata[TIMELINE_KEY] = self._timeline.to_json(final_write=time.time())
        self.run.complete = reason is None
        self.run.finished_at = utc_now()
        write_results(self.path, self.run)
        self.journal.discard()
        self._summary_line = summary_line(self.path, self.run)
        if reason:
            self._summary_line += f" INCOMPLETE: {reason}"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._summary_line:
            terminalreporter.write_line(self._summary_line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.journal.close()  # keeps the journal if sessionfinish never wrote the final file

    # -- helpers -----------------------------------------------------------------------------------

    def _incomplete_reason(self, session: pytest.Session, exitstatus: int) -> str | None:
        end = run_end.run_end(self.config)
        if end is not None and end.control.stop is not None:
            return end.control.stop[0]
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            return "interrupted"
        if exitstatus == pytest.ExitCode.INTERNAL_ERROR:
            return "pytest internal error"
        if exitstatus == pytest.ExitCode.USAGE_ERROR:
            return "pytest usage error"
        collected = int(getattr(session, "testscollected", 0) or 0)
        if self._recorded_tests < collected and not self.config.getoption("collectonly"):
            return f"{collected - self._recorded_tests} of {collected} collected tests have no result"
        not_run = [case for case in self.run.cases if case.outcome == Outcome.NOT_RUN]
        if not_run:  # e.g. after -x, or once pytest-xdist stopped replacing crashed workers
            return f"{len(not_run)} of {len(self.run.cases)} cases not run: {not_run[0].message}"
        return None

    def repro_of(self, nodeid: str) -> str:
        """The command that runs case ``nodeid`` again, as this run ran it."""
        extra = self.metadata.get("repro_args")
        return repro_command(self.repro_prefix, nodeid, extra if isinstance(extra, list) else None)

    def _finish(self, nodeid: str, crash: pytest.TestReport | None = None) -> None:
        pending = self._pending.pop(nodeid, None) or _Pending()
        if nodeid in self._recorded_ids:  # a late report of a recorded case (a stop mid-run can bring one
            return  # after its teardown): one case, one result
        details: dict[str, Any] = {}
        crash_result = _override(crash) if crash is not None else None
        note = getattr(crash, CASE_RESULT_ATTR, None) if crash is not None else None
        if crash is not None and crash_result is None and not (isinstance(note, dict) and "note" in note):
            outcome, message = Outcome.CRASHED, _failure_text(crash)
        elif crash_result is not None:  # a crash explained: the watchdog's verdict, or a declared crash
            outcome, message = crash_result["outcome"], _override_message(crash_result, crash)
            details = _case_details({"call": crash}, outcome)
        else:
            outcome, message = _outcome(pending.reports)
            details = _case_details(pending.reports, outcome)
            if isinstance(note, dict) and note.get("note"):  # a worker replaced after this case: why
                message = _truncate(f"{message}\n({note['note']})" if message else f"({note['note']})")
        repro = self.repro_of(nodeid)
        if crash_result is not None and crash_result.get("repro"):  # a crash found again: its own replay
            repro = str(crash_result["repro"])
        if outcome == Outcome.DEVICE_FAULT:
            repro = sanitizer_repro(repro)
        duration = pending.duration
        if crash is not None and pending.start is not None:  # a hung or dead case: until its end was known
            duration = max(duration, time.time() - pending.start)
        params = {
            str(name).removeprefix(PARAM_PREFIX): str(value)
            for name, value in pending.user_properties
            if str(name).startswith(PARAM_PREFIX)
        }
        started = None if pending.start is None else round(pending.start - self._timeline.session_start, 3)
        self._recorded_tests += 1
        self._record(
            CaseResult(
                id=nodeid,
                chapter=chapter_of(nodeid),
                params=params,
                outcome=outcome,
                message=message,
                repro=repro,
                duration_s=round(duration, 6),
                worker=pending.worker,
                started_s=started,
                suite_check=pending.suite_check,
                **details,
            )
        )

    def _record(self, case: CaseResult) -> None:
        self._recorded_ids.add(case.id)
        self.run.cases.append(case)
        end = run_end.run_end(self.config)
        with end.control.critical() if end is not None else _nothing():
            self.journal.add_case(case)


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def summary_line(path: Path, run: RunResult) -> str:
    """``results: PATH (N passed, N failed, N skipped, N crashed)``, plus any other outcome that occurred,
    then the suite's own checks apart (``; suite self-checks: 56 passed``)."""
    summary = run.summary()
    counts = summary["outcomes"]
    always = (Outcome.PASSED, Outcome.FAILED, Outcome.SKIPPED, Outcome.CRASHED)
    parts = [f"{counts[name]} {name}" for name in always]
    parts += [f"{count} {name}" for name, count in counts.items() if name not in always and count]
    return f"results: {path} ({', '.join(parts)}{suite_checks_words(summary['suite_checks'])})"


def suite_checks_words(counts: dict[str, int]) -> str:
    """``; suite self-checks: 56 passed`` (the suite's own checks, never the backend's), or nothing."""
    shown = count_words(counts)
    return f"; suite self-checks: {shown}" if shown else ""


def nothing_exercised_line(run: RunResult) -> str:
    """The one line of a run in which no case checked the backend under test."""
    summary = run.summary()
    outcomes = count_words(summary["outcomes"]) or "none"
    suite = sum(summary["suite_checks"].values())
    return (
        f"no case exercised the backend under test ({outcomes}; {suite} suite self-checks, which involve "
        "no backend): nothing here says it works, so the run is not green (exit 5); see the skip reasons"
    )


def _is_crash_report(report: pytest.TestReport, crashed: set[str]) -> bool:
    # xdist builds the crash report itself with when="???" and a plain-string longrepr.
    if report.nodeid in crashed:
        return True
    unknown_phase = report.when not in ("setup", "call", "teardown")
    return unknown_phase and " crashed while running " in str(report.longrepr)


def worker_of(report: pytest.TestReport) -> str | None:
    """The xdist worker (``gw3``) a report came from; None in a run without workers."""
    worker = getattr(report, "worker_id", None)  # set on reports deserialised from an xdist worker
    if worker:
        return str(worker)
    gateway = getattr(getattr(report, "node", None), "gateway", None)  # xdist's own crash report
    return str(gateway.id) if gateway is not None else None


def _override(report: pytest.TestReport | None) -> dict[str, Any] | None:
    """The ``case_result`` another plugin set on a report, when it names a known outcome."""
    value = getattr(report, CASE_RESULT_ATTR, None)
    if isinstance(value, dict) and value.get("outcome") in OUTCOMES:
        return value
    return None


def _override_message(override: dict[str, Any], report: pytest.TestReport | None) -> str:
    message = override.get("message")
    if message is None:  # the plugin kept pytest's verdict: the message is the usual one
        return _failure_text(report) if report is not None and report.longrepr else ""
    return _truncate(str(message))


def _case_details(reports: dict[str, pytest.TestReport], outcome: str) -> dict[str, Any]:
    """``rule``, ``level``, ``known_failure`` and ``evidence`` from a ``case_result``, when the outcome still
    is its."""
    for when in ("teardown", "setup", "call") if outcome in FINAL else ("setup", "call"):
        override = _override(reports.get(when))
        if override is not None:
            if override["outcome"] != outcome and outcome == Outcome.ERROR:
                return {}  # a teardown failure turned it into an error: the details no longer apply
            known = override.get("known_failure")
            return {
                "rule": str(override["rule"]) if override.get("rule") else None,
                "level": str(override["level"]) if override.get("level") in LEVELS else None,
                "known_failure": dict(known) if isinstance(known, dict) else None,
                "evidence": str(override["evidence"]) if override.get("evidence") else None,
            }
    return {}


def _outcome(reports: dict[str, pytest.TestReport]) -> tuple[str, str]:
    """One outcome per case from its phase reports: setup problems first, then call, then teardown."""
    setup, call, teardown = reports.get("setup"), reports.get("call"), reports.get("teardown")
    for report in (teardown, call, setup):  # a timeout, device fault or not-run ends the case, whatever else
        fault = _override(report)
        if fault is not None and fault["outcome"] in FINAL:
            return fault["outcome"], _override_message(fault, report)
    setup_override = _override(setup)
    if setup_override is not None:
        return setup_override["outcome"], _override_message(setup_override, setup)
    if setup is not None and setup.failed:
        return Outcome.ERROR, _failure_text(setup)
    if setup is not None and setup.skipped:
        return _skip_outcome(setup)
    if call is None:
        return Outcome.ERROR, "the test did not run to completion (interrupted before its call phase ended)"
    call_override = _override(call)
    if call_override is not None:
        outcome, message = call_override["outcome"], _override_message(call_override, call)
    elif call.skipped:
        outcome, message = _skip_outcome(call)
    elif call.failed:
        outcome, message = Outcome.FAILED, _failure_text(call)
    elif hasattr(call, "wasxfail"):
        outcome, message = Outcome.XPASSED, str(call.wasxfail)
    else:
        outcome, message = Outcome.PASSED, ""
    if teardown is not None and teardown.failed:
        teardown_override = _override(teardown)
        if teardown_override is not None and outcome == Outcome.PASSED:  # a verdict only a teardown can give
            return teardown_override["outcome"], _override_message(teardown_override, teardown)
        teardown_text = _failure_text(teardown)
        if outcome == Outcome.FAILED:
            return outcome, _truncate(f"{message}\n(teardown also failed: {teardown_text})")
        return Outcome.ERROR, "teardown failed: " + teardown_text
    return outcome, message


def _skip_outcome(report: pytest.TestReport) -> tuple[str, str]:
    if hasattr(report, "wasxfail"):
        return Outcome.XFAILED, str(report.wasxfail)
    longrepr = report.longrepr
    # A skip's longrepr is (path, lineno, "Skipped: reason"); xdist may turn the tuple into a list.
    reason = str(longrepr[2]) if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else str(longrepr)
    return Outcome.SKIPPED, _truncate(reason.removeprefix("Skipped: "))


def _failure_text(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if message:
        return _truncate(str(message))
    return _truncate(str(report.longrepr))


def _truncate(text: str) -> str:
    if len(text) <= MESSAGE_LIMIT:
        return text
    return text[:MESSAGE_LIMIT] + f"\n… ({len(text) - MESSAGE_LIMIT} more characters)"
