"""Where the reports gather (the pytest-xdist controller, or the single pytest process): every case gets
an outcome and the run always ends with its artifacts.

* A worker that died while running a case (pytest-xdist's "crash") is judged by what its watchdog left
  (``harness/watchdog.py``): ``timeout`` with every thread's stack, ``device-fault`` with the CUDA error,
  or, with nothing left, ``crashed`` as before. The crash report is reshaped so that the terminal, JUnit
  and the result file all say so (JUnit: a ``<failure>`` for a timeout, an ``<error>`` on teardown for a
  device fault; the evidence in its text).
* The deadline (``--run-deadline``), SIGTERM and SIGINT end the run through ``harness/run_control.py``:
  the workers are ended at once, every case that did not finish gets a ``not-run`` report with the reason
  (so JUnit lists it as skipped and the result file records it), the files are written and the exit code
  says what happened. The same reports cover cases a ``-x`` or a stopped pytest-xdist never ran.
* Without pytest-xdist a timeout or device fault stops the run (``EXIT_STOPPED_BY_FAULT``); if the stuck
  main thread cannot even take the stop, the artifacts are written from another thread and the process
  ends (``emergency``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness import run_control
from harness.case_limits import MARKER, OPTION, CaseLimitError, parse_rules
from harness.device_probe import DEFAULT_PROBE, load_probe
from harness.finalize import drop_repeated_testcases
from harness.outcomes import FAULTS, FINAL, Outcome
from harness.run_control import EXIT_DEADLINE, EXIT_STOPPED_BY_FAULT, RunControl
from harness.watchdog import (
    CASE_RESULT_ATTR,
    DIR_KEY,
    OVERHEAD_KEY,
    CaseWatchdog,
    FaultRepr,
    Verdict,
    WatchdogFiles,
    set_case_result,
)

#: Outcomes the terminal shows with a letter of their own: pytest's (category, letter, word), plain strings.
_STATUS = {
    Outcome.TIMEOUT: (Outcome.TIMEOUT.value, "T", "TIMEOUT"),
    Outcome.DEVICE_FAULT: (Outcome.DEVICE_FAULT.value, "D", "DEVICE-FAULT"),
    Outcome.NOT_RUN: (Outcome.NOT_RUN.value, "N", "NOT-RUN"),
}
LIST_LIMIT = 20
_RUN_END_KEY = pytest.StashKey["RunEnd"]()
#: The name the case watchdog is registered under, in the processes that run cases.
WATCHDOG_PLUGIN = "harness-case-watchdog"


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("run-end", "time limits, device faults and the end of a run")
    group.addoption(
        OPTION,
        action="append",
        default=[],
        metavar="RULE",
        help="a case's time limit: SECONDS (the default), chapter:NAME=SECONDS, marker:NAME=SECONDS or "
        "case:GLOB=SECONDS; repeatable, over the ini option case_timeouts; 0: no limit",
    )
    group.addoption(
        run_control.DEADLINE_OPTION,
        type=float,
        default=None,
        metavar="SECONDS",
        help="end the run cleanly after SECONDS: unfinished cases are not-run, every file is written, exit "
        f"code {EXIT_DEADLINE}",
    )
    group.addoption(
        "--device-probe",
        default=DEFAULT_PROBE,
        metavar="MODULE:FUNCTION",
        help="after each case, the check that the device is still usable (returns the error or None); "
        "'none' turns it off (default: %(default)s)",
    )
    group.addoption(
        "--stop-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a main thread stuck in C gets to take a stop (deadline, signal, a timeout without "
        "pytest-xdist) before the files are written from another thread (default: %(default)s)",
    )
    group.addoption(
        "--native-stacks",
        choices=("auto", "off"),
        default="auto",
        help="add every thread's native frames (gdb, where installed) to a timeout's evidence",
    )
    parser.addini(
        "case_timeouts",
        type="linelist",
        default=[],
        help="case time limits, one rule a line: SECONDS, chapter:NAME=SECONDS, marker:NAME=SECONDS",
    )


_SUITE_RULES_KEY = pytest.StashKey[tuple[str, ...]]()


def set_suite_rules(config: pytest.Config, rules: Sequence[str]) -> None:
    """A suite's own case time limits (rules as ``--case-timeout`` takes them), under the ini's and the
    command line's; call it from a ``pytest_configure`` that runs first (``tryfirst``)."""
    config.stash[_SUITE_RULES_KEY] = tuple(rules)


def role(config: pytest.Config) -> str:
    """``worker`` (an xdist worker), ``controller`` (xdist's controller) or ``single``."""
    if hasattr(config, "workerinput"):
        return "worker"
    if config.getoption("dist", "no") != "no" and not config.getoption("collectonly"):
        return "controller"
    return "single"


def configure(config: pytest.Config, results_path: Path | None) -> None:
    """Register the watchdog and the run's end for this process's role (from harness/pytest_plugin.py)."""
    config.addinivalue_line("markers", f"{MARKER}(seconds): this case's own time limit (0: none)")
    try:
        suite = config.stash.get(_SUITE_RULES_KEY, ())
        limits = parse_rules(config.getini("case_timeouts"), config.getoption(OPTION), suite)
        probe = load_probe(config.getoption("--device-probe"))
        deadline = config.getoption(run_control.DEADLINE_OPTION)
        if deadline is not None:
            run_control.parse_seconds(str(deadline))
    except (CaseLimitError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from exc
    native = config.getoption("--native-stacks") == "auto"
    here = role(config)
    if here == "worker":
        # The controller ends the run; a signal to the whole process group must not kill a worker mid-case
        # (it would read as a crash of that case).
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        directory = Path(config.workerinput[DIR_KEY])  # type: ignore[attr-defined]
        files = WatchdogFiles(directory, config.workerinput["workerid"])  # type: ignore[attr-defined]
        watchdog = CaseWatchdog(config, files, limits, probe, native)
        config.pluginmanager.register(watchdog, WATCHDOG_PLUGIN)
        return
    if deadline is not None and deadline <= 0 and here == "controller":
        # Nothing will run: no workers to start; the cases are collected here and all recorded not-run.
        config.option.dist, config.option.numprocesses, here = "no", 0, "single"
    _raise_worker_restarts(config)
    end = RunEnd(config, here, _watchdog_dir(results_path), deadline, config.getoption("--stop-grace"))
    config.stash[_RUN_END_KEY] = end
    config.pluginmanager.register(end, "harness-run-end")
    if here == "single" and not config.getoption("collectonly"):
        files = WatchdogFiles(end.directory, "main")
        watchdog = CaseWatchdog(
            config, files, limits, probe, native, end.on_verdict, extra_margin_s=end.control.grace_s + 5
        )
        end.watchdog = watchdog
        config.pluginmanager.register(watchdog, WATCHDOG_PLUGIN)


def run_end(config: pytest.Config) -> RunEnd | None:
    return config.stash.get(_RUN_END_KEY, None)


def case_files(config: pytest.Config) -> WatchdogFiles | None:
    """The files of this process's case watchdog (its directory, its name in it), where it runs cases: an
    xdist worker or the single process; None in a controller or outside a recorded run."""
    watchdog = config.pluginmanager.get_plugin(WATCHDOG_PLUGIN)
    return watchdog.files if isinstance(watchdog, CaseWatchdog) else None


def _watchdog_dir(results_path: Path | None) -> Path:
    """Beside the result file when there is one (``harness.finalize`` finds it there after a hard death)."""
    if results_path is not None:
        directory = Path(str(results_path) + ".watchdog")
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.iterdir():
            with contextlib.suppress(OSError):
                stale.unlink()
        return directory
    return Path(tempfile.mkdtemp(prefix="case-watchdog-"))


def _raise_worker_restarts(config: pytest.Config) -> None:
    """pytest-xdist stops replacing crashed workers after 4 per worker by default; a faulty backend may
    time out or fault the device in more cases than that, each of which ends a worker on purpose."""
    workers = getattr(config.option, "numprocesses", None)
    if getattr(config.option, "maxworkerrestart", "") is None and isinstance(workers, int) and workers > 0:
        config.option.maxworkerrestart = str(max(100, 4 * workers))


class _Seen:
    """What arrived of one case: the phases reported, and its last report (for the reshaped crash)."""

    def __init__(self) -> None:
        self.whens: list[str] = []
        self.last: pytest.TestReport | None = None
        self.call: pytest.TestReport | None = None
        self.done = False


class RunEnd:
    """The plugin (controller or single process)."""

    def __init__(
        self, config: pytest.Config, here: str, directory: Path, deadline: float | None, grace_s: float
    ) -> None:
        self.config = config
        self.role = here
        self.directory = directory
        self.control = RunControl(deadline, grace_s, on_unanswered=self.emergency)
        self.watchdog: CaseWatchdog | None = None
        self.collected: list[str] = []
        self.locations: dict[str, tuple[str, int | None, str]] = {}
        self.user_properties: dict[str, list[tuple[str, object]]] = {}
        self.seen: dict[str, _Seen] = {}
        self.crashed: set[str] = set()
        self.verdicts: dict[str, Verdict] = {}  # single process: a timeout waiting for its report
        self.faults: list[tuple[str, str, str]] = []  # (outcome, case, first line) for the terminal
        self.overheads: list[dict[str, float]] = []  # each worker's watchdog cost
        #: Called with the reason at an emergency end, to write the result file (the recorder adds itself).
        self.writers: list[Callable[[str], None]] = []
        self.session: pytest.Session | None = None
        self._finished = False

    # -- set up -----------------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session
        self.control.install()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.control.uninstall()
        _one_testcase_per_case(config)
        if self.watchdog is not None:
            self.watchdog.close()
        if self._finished:  # the files are written: nothing is left for harness.finalize to read
            shutil.rmtree(self.directory, ignore_errors=True)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        overhead = (getattr(node, "workeroutput", None) or {}).get(OVERHEAD_KEY)
        if isinstance(overhead, dict):
            self.overheads.append(overhead)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[DIR_KEY] = str(self.directory)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.role == "single":
            self.collected = [item.nodeid for item in session.items]
            for item in session.items:
                self.locations[item.nodeid] = item.location
                self.user_properties[item.nodeid] = list(item.user_properties)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        if not self.collected:
            self.collected = list(ids)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        self.control.release()  # a stop that came during collection ends the run here, files written
        remaining = self.control.remaining()
        if remaining is not None and remaining <= 0:
            self.control.stop = (self.control.deadline_reason(), EXIT_DEADLINE)
            return True  # run nothing; sessionfinish records every case not-run
        return None

    # -- reports ----------------------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        seen = self.seen.setdefault(report.nodeid, _Seen())
        seen.whens.append(report.when)
        seen.last = report
        if report.when == "call":
            seen.call = report
        result = getattr(report, CASE_RESULT_ATTR, None)
        outcome = result.get("outcome") if isinstance(result, dict) else None
        if outcome in FAULTS:
            self.faults.append((outcome, report.nodeid, str(result.get("message") or "").split("\n")[0]))
        if report.when == "teardown" or report.nodeid in self.crashed or outcome in FINAL:
            seen.done = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        result = getattr(report, CASE_RESULT_ATTR, None)
        outcome = result.get("outcome") if isinstance(result, dict) else None
        if outcome in _STATUS and (report.when != "teardown" or outcome == Outcome.DEVICE_FAULT):
            return _STATUS[outcome]
        return None

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: object) -> None:
        """A worker died while running ``crashitem``: what its watchdog left says how the case ended."""
        seen = self.seen.get(crashitem)
        if seen is not None and "teardown" in seen.whens:
            # Its reports all came; the worker died before telling pytest-xdist the case was complete (a
            # CI system's SIGTERM in that instant): nothing crashed, and the case keeps its one result.
            report.outcome, report.when, report.longrepr = "passed", "teardown", None  # type: ignore[assignment]
            setattr(report, CASE_RESULT_ATTR, {"outcome": None, "note": "late report of a finished case"})
            return
        self.crashed.add(crashitem)
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        verdict = WatchdogFiles(self.directory, str(worker)).read_verdict(crashitem) if worker else None
        if verdict is not None:
            shape_crash_report(report, verdict, self.seen.get(crashitem))

    # -- a verdict where no fresh process can take over (single process) ---------------------------------

    def on_verdict(self, verdict: Verdict, from_timer: bool) -> None:
        reason = (
            f"the run stopped after {verdict.case} ended in {verdict.outcome}: without pytest-xdist no fresh "
            "process can take over"
        )
        if from_timer:
            self.verdicts[verdict.case] = verdict
            self.control.request_stop(reason, EXIT_STOPPED_BY_FAULT)
            return
        # A device fault, found in the main thread after the case's teardown: its report carries it, and
        # the run stops before the next case.
        with contextlib.suppress(Exception):
            self.control.stop = self.control.stop or (reason, EXIT_STOPPED_BY_FAULT)
        if self.session is not None:
            self.session.shouldstop = reason

    # -- the end ----------------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.finish(session, exitstatus)

    def finish(self, session: pytest.Session, exitstatus: int = 0) -> None:
        """Every unfinished case reported not-run (or timeout), workers ended on a stop, exit code set."""
        if self._finished or self.config.getoption("collectonly"):
            return
        self._finished = True
        self.control.begin_finishing()  # a signal from now on must not cut the files short
        stop = self.control.stop
        if stop is not None and self.role == "controller":
            self._end_workers()
        reason = self._reason(session, stop, exitstatus)
        for case in self.collected:
            seen = self.seen.get(case)
            if seen is not None and seen.done:
                continue
            verdict = self.verdicts.get(case)
            for report in self._closing_reports(case, seen, verdict, reason):
                self.config.hook.pytest_runtest_logreport(report=report)
        if stop is not None:
            session.exitstatus = stop[1]

    def watchdog_cost(self) -> dict[str, float] | None:
        """The cases watched and what the watchdog cost them (its per-case timers, files and device
        probe), summed over the workers that ended normally; the result file's ``case_watchdog``."""
        parts = [*self.overheads, *([self.watchdog.overhead()] if self.watchdog is not None else [])]
        cases = int(sum(part.get("cases", 0) for part in parts))
        seconds = float(sum(part.get("seconds", 0.0) for part in parts))
        if not cases:
            return None
        return {"cases": cases, "seconds": round(seconds, 6), "per_case_us": round(seconds / cases * 1e6, 1)}

    def _reason(self, session: pytest.Session, stop: tuple[str, int] | None, exitstatus: int) -> str:
        if stop is not None:
            return stop[0]
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            return "the run was interrupted"
        dsession = self.config.pluginmanager.get_plugin("dsession")
        xdist_summary = getattr(dsession, "_summary_report", None)
        for why in (session.shouldfail, session.shouldstop, xdist_summary):
            if why:
                return f"the run stopped early: {why}"
        return "the run ended before this case ran"

    def _closing_reports(
        self, case: str, seen: _Seen | None, verdict: Verdict | None, reason: str
    ) -> list[pytest.TestReport]:
        """The reports that end a case the run did not finish: its timeout (a verdict), or not-run."""
        location = self.locations.get(case) or (case.split("::", 1)[0], None, case.split("::", 1)[-1])
        started = seen is not None and "setup" in seen.whens
        last = seen.last if seen is not None else None
        props = self.user_properties.get(case, list(getattr(last, "user_properties", []) or []))
        if verdict is not None:
            when = verdict.phase if verdict.phase in ("setup", "call") else "call"
            main = _report(case, location, "failed", when, _longrepr(verdict), props, last)
            set_case_result(main, verdict)
        else:
            when = "while this case was running" if started else "before this case started"
            message = f"not run: {reason} ({when})"
            main = _report(case, location, "skipped", "call" if started else "setup", None, props, last)
            main.longrepr = (location[0], location[1] or 0, message)
            setattr(main, CASE_RESULT_ATTR, {"outcome": Outcome.NOT_RUN.value, "message": message})
        main.user_properties = [*props, ("conformance:outcome", getattr(main, CASE_RESULT_ATTR)["outcome"])]
        teardown = _report(case, location, "passed", "teardown", None, main.user_properties, last)
        return [main, teardown]

    def _end_workers(self) -> None:
        """On a stop, end the workers now (their current cases are not-run): pytest-xdist would wait up to
        10 s for each before killing it, time a CI system's kill grace does not give."""
        for case_file in self.directory.glob("*.case.json"):
            pid = WatchdogFiles(self.directory, case_file.name.removesuffix(".case.json")).pid()
            if pid is not None and _is_our_worker(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        if self.faults:
            terminalreporter.section(f"timeouts and device faults: {len(self.faults)}", red=True)
            for outcome, case, first in self.faults[:LIST_LIMIT]:
                write(f"{outcome.upper()} {case} — {first}")
            if len(self.faults) > LIST_LIMIT:
                write(f"… and {len(self.faults) - LIST_LIMIT} more (all of them are in the result file)")
        stop = self.control.stop
        if stop is not None:
            terminalreporter.section("run stopped", yellow=True)
            write(f"{stop[0]}; exit code {stop[1]} ({run_control.EXIT_CODES.get(stop[1], '')})")

    # -- when the main thread cannot take the stop -------------------------------------------------------

    def emergency(self, reason: str, code: int) -> None:
        """From the signal-watch thread: the main thread is stuck in C and did not take the stop. Report
        every unfinished case from here, write the result file and JUnit, and end the process."""
        sys.stderr.write(f"\n{reason}; the main thread is stuck: the artifacts are written from another\n")
        with contextlib.suppress(Exception):
            if self.session is not None:
                self.finish(self.session)
            for write in self.writers:
                write(reason)
            _write_junit_now(self.config)
            _one_testcase_per_case(self.config)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _longrepr(verdict: Verdict) -> FaultRepr:
    return FaultRepr(verdict.message, verdict.evidence)


def shape_crash_report(report: pytest.TestReport, verdict: Verdict, seen: _Seen | None) -> None:
    """pytest-xdist's crash report (phase "???", "worker crashed") made into the report of what happened."""
    whens = seen.whens if seen is not None else []
    if verdict.outcome is None:  # replaced after an out-of-memory: the case ends as its reports say
        report.outcome, report.when, report.longrepr = "passed", "teardown", None  # type: ignore[assignment]
        setattr(report, CASE_RESULT_ATTR, {"outcome": None, "note": verdict.message})
        return
    if verdict.outcome == Outcome.DEVICE_FAULT or "call" in whens:
        report.when = "teardown"  # type: ignore[assignment]
    else:
        report.when = "call" if "setup" in whens else "setup"  # type: ignore[assignment]
    report.outcome = "failed"
    report.longrepr = _longrepr(verdict)
    report.user_properties = [("conformance:outcome", Outcome(verdict.outcome).value)]
    set_case_result(report, verdict)
    call = seen.call if seen is not None else None
    if call is not None and call.failed:
        # JUnit pairs a failed call with an error in teardown by these (pytest's "double fail" case).
        for attr in ("item_index", "worker_id"):
            if hasattr(call, attr):
                setattr(report, attr, getattr(call, attr))


def _report(
    case: str,
    location: tuple[str, int | None, str],
    outcome: str,
    when: str,
    longrepr: object,
    props: list[tuple[str, object]],
    like: pytest.TestReport | None,
) -> pytest.TestReport:
    report = pytest.TestReport(
        nodeid=case,
        location=location,
        keywords={},
        outcome=outcome,  # type: ignore[arg-type]
        longrepr=longrepr,  # type: ignore[arg-type]
        when=when,  # type: ignore[arg-type]
        user_properties=list(props),
    )
    # pytest-xdist's reports carry their worker; JUnit keys a case's reports by it.
    for attr in ("node", "worker_id", "item_index"):
        if like is not None and hasattr(like, attr):
            setattr(report, attr, getattr(like, attr))
    return report


def _is_our_worker(pid: int) -> bool:
    """Whether ``pid`` is a child of this process, or of its child the fork server (harness/forkserver.py),
    as its workers are: a pid file may outlive its process and be reused."""
    parent = _parent(pid)
    return parent == os.getpid() or (parent is not None and _parent(parent) == os.getpid())


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _write_junit_now(config: pytest.Config) -> None:
    """JUnit from pytest's own writer, as at a normal end (only the emergency path calls it)."""
    try:
        from _pytest.junitxml import xml_key  # no public handle on the writer
    except ImportError:
        return
    xml = config.stash.get(xml_key, None)
    if xml is not None:
        xml.pytest_sessionfinish()


def _one_testcase_per_case(config: pytest.Config) -> None:
    """pytest's JUnit writer opens a second ``testcase`` for a report that comes after its case's teardown
    (a dead worker's item): the file keeps the first, as the result file does."""
    path = getattr(config.option, "xmlpath", None)
    if path and not hasattr(config, "workerinput"):
        with contextlib.suppress(OSError, ValueError):
            drop_repeated_testcases(Path(path))
