"""A long run is never silent (harness/progress.py), and its end says first which rules failed, how often."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.formatting import show_duration
from harness.progress import ProgressReporter, heartbeat
from tests.chapter_runner import ChapterRun

ROOT = Path(__file__).resolve().parents[2]


def test_show_duration_reads_like_a_clock() -> None:
    assert [show_duration(s) for s in (4.25, 45, 130.2, 3601)] == [
        "4.2 s",
        "45 s",
        "2 min 10 s",
        "60 min 01 s",
    ]
    assert show_duration(None) == "n/a"


def test_the_progress_line_counts_estimates_and_names_the_longest_running_case() -> None:
    reporter = ProgressReporter(SimpleNamespace(pluginmanager=None), 30.0)  # type: ignore[arg-type]
    reporter.start = 0.0
    assert reporter.line(now=45.0) == (
        "progress: 45 s in, no case finished yet (starting: preflight, collection)"
    )
    reporter.total, reporter.cases_start = 100, 10.0
    reporter.counts.update({"done": 25, "passed": 20, "failed": 2, "skipped": 3})
    reporter.running = {"conformance/test_x.py::test_slow[a]": 40.0, "conformance/test_x.py::test_b": 100.0}
    assert reporter.line(now=110.0) == (
        "progress: 25/100 cases (25%) in 1 min 50 s — 20 passed, 2 failed, 3 skipped; "
        "ETA ≈ 5 min 00 s at this pace (no recorded case times); longest running: test_slow[a] (1 min 10 s)"
    )


def test_the_eta_comes_from_the_recorded_case_times_and_says_when_it_is_unsure() -> None:
    """Issue 48 item 6: with ``--case-seconds`` the ETA is what is left of each case's recorded time over the
    workers, scaled by how this run's finished cases compare with their records; far from the records
    (a cold run) it says it is unsure."""
    reporter = ProgressReporter(SimpleNamespace(pluginmanager=None), 30.0)  # type: ignore[arg-type]
    reporter.start, reporter.cases_start, reporter.workers = 0.0, 0.0, 2
    reporter.ids = [f"t::c{i}" for i in range(10)]
    reporter.total = 10
    reporter.expected = {i: 10.0 for i in reporter.ids}
    for i in reporter.ids[:4]:  # four finished, each as recorded
        reporter.finished.add(i)
        reporter.took[i] = 10.0
    reporter.counts.update({"done": 4, "passed": 4})
    reporter.running = {"t::c4": 95.0}  # 5 s into its 10
    line = reporter.line(now=100.0)
    # (5 not started x 10 s + 5 s left of the running one) / 2 workers = 27.5 s
    assert "ETA ≈ 28 s from the recorded case times;" in line, line
    for i in reporter.ids[:4]:  # the same cases took three times their records: a cold run
        reporter.took[i] = 30.0
    assert "ETA ≈ 1 min 22 s from the recorded case times (unsure: this run so far takes 3.0x" in (
        reporter.line(now=100.0)
    )


def test_the_eta_counts_the_phases_still_to_run() -> None:
    """Issue 48 item 6: the shared phase's ETA adds the later phases' recorded seconds (``--then-phases``,
    ``case_seconds.json``'s phases), and counts those it has no record of rather than guessing them."""
    reporter = ProgressReporter(SimpleNamespace(pluginmanager=None), 30.0)  # type: ignore[arg-type]
    reporter.start, reporter.cases_start, reporter.total = 0.0, 0.0, 10
    reporter.counts.update({"done": 5, "passed": 5})
    reporter.then = {"-exclusive": 14.7}
    assert "ETA ≈ 10 s at this pace (no recorded case times), then 1 later phase ≈ 15 s as recorded" in (
        reporter.line(now=10.0)
    )
    reporter.then = {"-exclusive": 14.7, "-multi-gpu": None}
    assert ", then 2 later phases ≈ 15 s as recorded (1 with no recorded time)" in reporter.line(now=10.0)
    reporter.then = {"-exclusive": None}
    assert reporter.line(now=10.0).endswith(", then 1 later phase (no recorded time)")


def test_the_later_phases_come_from_the_option_and_the_recorded_file(tmp_path: Path) -> None:
    from harness.case_order import write_seconds
    from harness.progress import _later_phases, _recorded

    seconds = tmp_path / "s.json"
    write_seconds({"t::a": 3.0}, seconds, "test", {"": 38.8, "-exclusive": 14.7})
    options = {"--then-phases": "-exclusive,-multi-gpu", "--case-seconds": str(seconds)}
    config = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))
    assert _later_phases(config, _recorded(config)[1]) == {"-exclusive": 14.7, "-multi-gpu": None}  # type: ignore[arg-type]
    options["--case-seconds"] = str(tmp_path / "missing.json")
    assert _later_phases(config, _recorded(config)[1]) == {"-exclusive": None, "-multi-gpu": None}  # type: ignore[arg-type]


def test_a_case_whose_worker_died_is_done_and_no_longer_running() -> None:
    """pytest-xdist reports a crashed case once, in phase "???": it must leave "longest running" (a torch_aoti
    run named a crashed case there for 13 minutes) and count as done and crashed."""
    reporter = ProgressReporter(SimpleNamespace(pluginmanager=None), 30.0)  # type: ignore[arg-type]
    reporter.start, reporter.total = 0.0, 2
    case = "conformance/test_x.py::test_crashes"
    reporter.pytest_runtest_logstart(case)
    crash = pytest.TestReport(case, ("conformance/test_x.py", None, case), {}, "failed", "worker died", "???")
    reporter.pytest_runtest_logreport(crash)
    assert reporter.running == {}
    assert (reporter.counts["done"], reporter.counts["crashed"]) == (1, 1)


def test_heartbeat_speaks_while_a_step_is_silent() -> None:
    lines: list[str] = []
    with heartbeat("preflight [cpu]", interval=0.05, write=lines.append):
        time.sleep(0.3)
    assert len(lines) >= 3
    assert lines[0].startswith("preflight [cpu]: still running (")
    count = len(lines)
    time.sleep(0.15)
    assert len(lines) == count  # stopped with the step


CHAPTER = """
import time

import pytest

from conformance.common.checks import fail


def test_slow(backend):
    time.sleep(1.5)


@pytest.mark.rules("lowering/lower")
def test_breaks_a_rule(backend):
    fail("lowering/lower", "lower(add_mul)", "boom")


@pytest.mark.rules("lowering/lower")
def test_breaks_it_again(backend):
    fail("lowering/lower", "lower(add)", "boom")


def test_crashes(backend):
    raise RuntimeError("no rule id here")
"""


@pytest.mark.proof  # a chapter run in a real pytest (tests/chapter_runner.py): 15-19 s on two cores
def test_a_run_prints_progress_and_ends_with_the_failed_rules_first(tmp_path: Path) -> None:
    chapter = tmp_path / "test_some_chapter.py"
    chapter.write_text(CHAPTER)
    log = tmp_path / "output.txt"
    args = [str(chapter), "-p", "conformance.conftest", "--backend=tests.minimal_backends:full", "-q"]
    # -s: a line written while a case runs in this process would be captured with its output; the front door
    # runs the cases in xdist workers, where the process that prints is never captured.
    args += ["-p", "no:cacheprovider", "--no-preflight", "--progress-every=0.4", "-s"]
    code = ChapterRun(args, ROOT, {**os.environ, "PYTHONPATH": str(ROOT)}, log).wait(timeout=300)
    output = log.read_text()
    assert code == 1, output
    assert "progress: " in output, output
    assert "longest running: test_slow" in output, output
    rules = output.index("failed rules: 2 (3 cases)")
    assert output.index("    2  [lowering/lower]", rules) > rules
    assert "    1  (no rule id: a crash or an error outside the checks)" in output
    assert rules < output.index("short test summary info"), output
