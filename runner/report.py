"""After the phases of a run, whatever stopped them: every shard's files, the summary page, the phase
table, and the run's verdict (its exit code: README "Exit codes")."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.results import JOURNAL_SUFFIX
from harness.run_control import EXIT_NO_TESTS, EXIT_OK, FrontDoor
from runner.console import Console, Started
from runner.plan import SuiteRun
from runner.record import RunRecord


@dataclass(frozen=True)
class Verdict:
    """How a run that did not pass ends."""

    message: str
    #: The run's own exit code when it was stopped (deadline, signal): the session exits with it after
    #: saying why. None: the session fails as any failed session does.
    exit_code: int | None = None


def report_run(console: Console, run: SuiteRun, record: RunRecord, door: FrontDoor) -> None:
    """The files of every shard the phases started, the page and the table when any shard left a file,
    then the verdict (raises unless the run passed)."""
    finish_shards(console, run, record.shards)
    present = present_files(run, record.shards)
    if present:
        html = run.results / f"{run.name}.html"

        def render() -> str:
            # The phases so far first: the page's "Where the time went" reads them from the files (all
            # but this step's own time, stored with the table below).
            console.run([run.python, "-m", "harness.phases", *present, *record.phase_flags(), "--no-print"])
            console.run([run.python, "-m", "reports", *present, "-o", str(html)])
            return "summary page"

        record.timed("report", render)
        console.run([run.python, "-m", "harness.phases", *present, *record.phase_flags()])
        console.log(f"results: {', '.join(present)}  page: {html}")
    door.uninstall()
    conclude(console, verdict(door.stop, record.exit_codes))


def finish_shards(console: Console, run: SuiteRun, shards: Sequence[str]) -> None:
    """A shard whose pytest died has only a journal: ``harness.finalize`` writes its result file and JUnit."""
    for shard in shards:
        result = run.results / f"{shard}.json"
        if not result.exists() and Path(f"{result}{JOURNAL_SUFFIX}").exists():
            junit = f"--junit={run.results / f'{shard}.junit.xml'}"
            console.run([run.python, "-m", "harness.finalize", str(result), junit], success_codes=(0, 1))


def present_files(run: SuiteRun, shards: Sequence[str]) -> list[str]:
    """The result files of ``shards`` that exist, or whose journal does (the page renders either)."""
    files = [str(run.results / f"{shard}.json") for shard in shards]
    return [f for f in files if Path(f).exists() or Path(f"{f}{JOURNAL_SUFFIX}").exists()]


def verdict(stop: tuple[str, int] | None, exit_codes: Sequence[int]) -> Verdict | None:
    """None for a run that passed. pytest's exit 5 (nothing selected) is fine for a phase, as long as some
    phase ran cases."""
    if stop is not None:
        return Verdict(f"conformance run stopped: {stop[0]} (exit {stop[1]})", stop[1])
    failed = [code for code in exit_codes if code not in (EXIT_OK, EXIT_NO_TESTS)]
    if failed:
        return Verdict(f"conformance run failed: pytest exit code {failed[0]}")
    if exit_codes and all(code == EXIT_NO_TESTS for code in exit_codes):
        return Verdict(
            "conformance run exercised no case of the backend under test (pytest exit code 5 in every "
            "phase): every case it selected was skipped, a coverage gap or one of the suite's self-checks "
            "(see the skip reasons), or -k / -m / the chapter path selected none"
        )
    return None


def conclude(console: Console, outcome: Verdict | None) -> None:
    """End the session as ``outcome`` says: a stopped run exits with its own code (the page written
    first), a failed one fails the session; a run that passed (None) returns."""
    if outcome is None:
        return
    if outcome.exit_code is not None:
        console.log(outcome.message)
        raise SystemExit(outcome.exit_code)
    console.error(outcome.message)


#: How long the report waits for the rule coverage table once the phases are over; it normally ended long
#: before (seconds: pytest's collection of every case, started beside the arguments' check).
COVERAGE_WAIT_S = 60.0


@dataclass
class RuleCoverage:
    """The rule coverage table being written beside the run: ``results/rule-coverage.json`` for the
    dashboard's coverage page, from the front door's command (the broken backends that prove the rules
    are the self-tests', which harness never names). The command writes ``pending``; ``finish`` puts it in
    place, so that a run stopped by its arguments' check leaves results/ as it was."""

    results: Path
    process: Started | None = None

    @property
    def target(self) -> Path:
        return self.results / "rule-coverage.json"

    @property
    def pending(self) -> Path:
        return self.results / "rule-coverage.json.new"

    @property
    def log(self) -> Path:
        return self.results / "rule-coverage.log"

    def start(self, console: Console, command: Sequence[str]) -> RuleCoverage:
        self.results.mkdir(exist_ok=True)
        self.process = console.start([*command, f"--output={self.pending}"], env={}, output=self.log)
        return self

    def finish(self, console: Console, wait_s: float = COVERAGE_WAIT_S) -> None:
        """The table in place, or a warning that says why not (a failure only warns)."""
        assert self.process is not None, "finish() before start()"
        try:
            code = self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.stop()
            why = f"not done after {wait_s:g} s more"
        else:
            why = f"exit {code}"
            if code == 0 and self.pending.exists():
                self.pending.replace(self.target)
                self.log.unlink(missing_ok=True)
                console.log(f"rule coverage table: {self.target}")
                return
        self.target.unlink(missing_ok=True)  # last run's table would not describe this checkout
        no_page = "the dashboard will have no coverage page"
        console.warn(f"rule coverage table not written ({why}; see {self.log}); {no_page}")

    def stop(self) -> None:
        """Ended unfinished (the run stopped before it began): nothing of it stays."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.pending.unlink(missing_ok=True)
