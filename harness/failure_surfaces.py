"""Where a CI user looks first, for a red run: each failed case's repro command (a JUnit property on the
case, and a terminal section), and the likely cause at the JUnit file's top (``harness.causes``). Both
read the run the results recorder keeps (``harness.pytest_plugin.ResultRecorder``), so they say what the
result file says."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from _pytest import junitxml  # its stash key: where a plugin adds testsuite properties

from harness import causes
from harness.outcomes import FAILING, Outcome

if TYPE_CHECKING:
    from harness.pytest_plugin import ResultRecorder


class ReproOnFailures:
    """Where a CI user looks first, each failed case's repro command (``--backend``, ``--backend-path`` and
    the generated cases' options included, as the result file has it): a JUnit property ``repro`` on the case,
    and a terminal section after the run listing the command of every failed case."""

    #: Failed cases listed in the terminal section; the result file and the JUnit file have them all.
    LISTED = 30

    def __init__(self, recorder: ResultRecorder) -> None:
        self.recorder = recorder
        self.failed: dict[str, str] = {}

    @pytest.hookimpl(tryfirst=True)  # before JUnit XML reads the teardown report's properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and report.when in ("setup", "call"):
            self.failed[report.nodeid] = self.recorder.repro_of(report.nodeid)
        elif report.when == "teardown" and report.nodeid in self.failed:
            report.user_properties = [*report.user_properties, ("repro", self.failed[report.nodeid])]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        # The run's final outcomes decide: a dead worker's case that a known failure declares is xfailed.
        final = {case.id: case.outcome for case in self.recorder.run.cases}
        failed = [cmd for nodeid, cmd in self.failed.items() if final.get(nodeid, Outcome.FAILED) in FAILING]
        if not failed:
            return
        terminalreporter.section(f"repro commands ({len(failed)} failed)", red=True)
        for command in failed[: self.LISTED]:
            terminalreporter.write_line(command)
        if len(failed) > self.LISTED:
            terminalreporter.write_line(f"... and {len(failed) - self.LISTED} more (the result file has all)")


class CausesInJunit:
    """The JUnit file opens with the likely cause (``harness.causes.junit_properties``): testsuite
    properties, added before pytest's writer writes the file at its own sessionfinish."""

    def __init__(self, recorder: ResultRecorder) -> None:
        self.recorder = recorder

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        xml = self.recorder.config.stash.get(junitxml.xml_key, None)
        for name, value in causes.junit_properties(self.recorder.run.cases) if xml is not None else ():
            xml.add_global_property(name, value)
