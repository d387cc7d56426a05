"""The rule coverage table written beside a run (``runner.report.RuleCoverage``), with real
processes standing in for ``python -m tests.rule_coverage --json``: in place once done, a failure or a hang
only warns (and leaves no stale table), and a run its arguments' check stops leaves results/ as it was."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from runner import run
from runner.plan import SuiteRun
from runner.report import RuleCoverage
from tests.runner.run_phases_fakes import Failed, FakeConsole, front_door_signals_restored

#: Writes its ``--output=FILE`` argument after ``sys.argv[1]`` seconds, then exits with ``sys.argv[2]``.
TABLE = (
    "import sys, time\n"
    "time.sleep(float(sys.argv[1]))\n"
    "out = next(a for a in sys.argv if a.startswith('--output=')).partition('=')[2]\n"
    "open(out, 'w').write('[]\\n')\n"
    "print('a warning on stderr', file=sys.stderr)\n"
    "sys.exit(int(sys.argv[2]))\n"
)


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """The front door installs its own (harness/run_control.py): as they were after each test."""
    with front_door_signals_restored():
        yield


def _command(delay_s: float = 0.0, code: int = 0) -> list[str]:
    return [sys.executable, "-c", TABLE, str(delay_s), str(code)]


class _Console(FakeConsole):
    """The fake console, starting background commands as real processes (the pytest phases' starts are
    the fake's own)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(gpus=0, **kwargs)  # type: ignore[arg-type]

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str], output: Path):  # type: ignore[override]
        if "-c" not in cmd:
            return super().start(cmd, env=env, output=output)
        self.calls.append(("started", list(cmd)))
        with open(output, "wb") as out:
            return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


def _results(tmp_path: Path, old_table: bool = True) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    if old_table:
        (results / "rule-coverage.json").write_text("last run's\n")
    return results


def test_the_table_is_put_in_place_once_done(tmp_path: Path) -> None:
    console, results = _Console(), _results(tmp_path)
    coverage = RuleCoverage(results).start(console, _command())
    coverage.finish(console)
    assert (results / "rule-coverage.json").read_text() == "[]\n"  # stderr went to the log, not the table
    assert sorted(p.name for p in results.iterdir()) == ["rule-coverage.json"]
    assert console.of("log") == [f"rule coverage table: {results / 'rule-coverage.json'}"]


def test_a_failed_table_only_warns_and_leaves_no_stale_one(tmp_path: Path) -> None:
    console, results = _Console(), _results(tmp_path)
    RuleCoverage(results).start(console, _command(code=3)).finish(console)
    assert not (results / "rule-coverage.json").exists()
    log = results / "rule-coverage.log"
    assert log.read_text() == "a warning on stderr\n"
    assert console.of("warn") == [
        f"rule coverage table not written (exit 3; see {log}); the dashboard will have no coverage page"
    ]


def test_a_table_that_does_not_end_is_stopped_and_only_warns(tmp_path: Path) -> None:
    console, results = _Console(), _results(tmp_path)
    coverage = RuleCoverage(results).start(console, _command(delay_s=60))
    started = time.monotonic()
    coverage.finish(console, wait_s=0.2)
    assert time.monotonic() - started < 5
    assert coverage.process is not None
    assert coverage.process.poll() is not None
    assert not (results / "rule-coverage.json").exists()
    assert "not done after 0.2 s more" in str(console.of("warn"))


def test_a_run_its_arguments_check_stops_leaves_results_as_they_were(tmp_path: Path) -> None:
    """The table is started beside the check; the check fails: the table's process is ended and the last
    run's table is still there."""
    console, results = _Console(check_args=4), _results(tmp_path)
    suite = SuiteRun(tmp_path, "conformance", ("conformance",), sys.executable, coverage=tuple(_command(0.5)))
    with pytest.raises(Failed):
        run.run_suite(console, suite)
    (started,) = console.of("started")
    assert started[:2] == [sys.executable, "-c"]  # type: ignore[index]
    time.sleep(1.0)  # past the moment the killed process would have written its table
    assert (results / "rule-coverage.json").read_text() == "last run's\n"
    assert not (results / "rule-coverage.json.new").exists()


def test_a_run_writes_the_table_before_its_report(tmp_path: Path) -> None:
    """Started before the arguments' check, finished before the page is rendered (the dashboard reads it)."""
    console, results = _Console(), _results(tmp_path, old_table=False)
    suite = SuiteRun(tmp_path, "conformance", ("conformance",), sys.executable, coverage=tuple(_command()))
    run.run_suite(console, suite)
    kinds = [kind for kind, _ in console.calls]
    assert kinds.index("started") < kinds.index("check_args")
    table_logged = console.calls.index(("log", f"rule coverage table: {results / 'rule-coverage.json'}"))
    page = next(i for i, (k, v) in enumerate(console.calls) if k == "run" and "reports" in v)  # type: ignore[operator]
    assert table_logged < page
    assert (results / "rule-coverage.json").read_text() == "[]\n"


def test_without_a_command_no_table_is_started(tmp_path: Path) -> None:
    console = _Console()
    run.run_suite(console, SuiteRun(tmp_path, "conformance", ("conformance",), sys.executable))
    assert console.of("started") == []
