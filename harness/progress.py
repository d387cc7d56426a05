"""A long run is never silent: a line at least every :data:`INTERVAL_S` seconds with how far it got and an
estimate of what is left.

* :class:`ProgressReporter` — a pytest plugin for the process that gathers reports (the xdist controller,
  or the single process): cases done of selected, outcomes so far, elapsed, an ETA at the pace so far, and
  the case that has been running longest. ``conformance/conftest.py`` registers it; ``--progress-every S``
  sets the interval (0: off).
* :func:`heartbeat` — for one long step (the toolchain preflight's compile): ``<label>: still running
  (N s)`` every interval until the step ends.

A daemon thread prints, so a line comes even while no case finishes (a long compile, a stuck case).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from harness.formatting import show_duration as duration
from harness.outcomes import Outcome
from harness.ticker import Ticker

INTERVAL_S = 30.0
# pytest's report outcomes, with a failed setup counted apart as an error (decided outcomes come later).
PROGRESS_OUTCOMES = (Outcome.PASSED, Outcome.FAILED, Outcome.ERROR, Outcome.SKIPPED)


def _ticker(interval: float, emit: Callable[[], None]) -> Ticker:
    """``emit`` every ``interval`` seconds, the first after one interval; an error in it is dropped (a
    progress line must never break a run)."""

    def step() -> bool:
        with contextlib.suppress(Exception):
            emit()
        return True

    return Ticker("progress", interval, step, wait_first=True)


@contextlib.contextmanager
def heartbeat(
    label: str, interval: float = INTERVAL_S, write: Callable[[str], None] | None = None
) -> Iterator[None]:
    """``<label>: still running (N s)`` every ``interval`` seconds while the block runs."""
    start = time.monotonic()
    out = write or (lambda line: print(line, file=sys.stdout, flush=True))
    ticker = _ticker(interval, lambda: out(f"{label}: still running ({duration(time.monotonic() - start)})"))
    ticker.start()
    try:
        yield
    finally:
        ticker.stop()


class ProgressReporter:
    """The pytest plugin (see the module docstring)."""

    def __init__(self, config: pytest.Config, interval: float) -> None:
        self.config = config
        self.interval = interval
        self.start = time.monotonic()
        self.cases_start: float | None = None
        self.total: int | None = None
        self.counts: Counter[str] = Counter()
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.ticker = _ticker(interval, self.emit)
        #: The collected case ids, what each took in this run so far, and what each took when recorded
        #: (``--case-seconds``: the run's ``case_seconds.json``), for the ETA.
        self.ids: list[str] = []
        self.took: Counter[str] = Counter()
        self.finished: set[str] = set()
        self.expected, phases = _recorded(config)
        self.workers = _workers(config)
        #: The phases the front door runs after this one (``--then-phases``), with their recorded seconds
        #: (None: not recorded): the ETA is the run's, not only this phase's.
        self.then = _later_phases(config, phases)

    def _write(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            print(line, flush=True)
            return
        reporter.ensure_newline()
        # pytest-xdist writes its dots without the reporter's bookkeeping: start a line of our own.
        if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
            reporter.write("\n")
        reporter.write_line(line)
        reporter.flush()

    # -- what the run has selected and done -------------------------------------------------------------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        self.ids = [item.nodeid for item in session.items]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.total = len(ids)
        self.ids = list(ids)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self.lock:
            self.running[nodeid] = time.monotonic()
            if self.cases_start is None:
                self.cases_start = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # pytest-xdist reports a case whose worker died once, with phase "???": it ends the case too.
        crashed = report.when not in ("setup", "call", "teardown")
        with self.lock:
            self.took[report.nodeid] += float(getattr(report, "duration", 0.0) or 0.0)
        if report.when == "teardown" or crashed:
            with self.lock:
                self.running.pop(report.nodeid, None)
                self.counts["done"] += 1
                self.finished.add(report.nodeid)
        if report.when == "call" or (report.when == "setup" and not report.passed) or crashed:
            outcome = Outcome.ERROR if report.when == "setup" and report.failed else report.outcome
            with self.lock:
                self.counts[Outcome.CRASHED if crashed else outcome] += 1

    def pytest_sessionfinish(self) -> None:
        self.ticker.stop()

    # -- the line -----------------------------------------------------------------------------------

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        with self.lock:
            done, counts, running = self.counts["done"], dict(self.counts), dict(self.running)
            cases_start = self.cases_start
        elapsed = now - self.start
        if cases_start is None:
            return f"progress: {duration(elapsed)} in, no case finished yet (starting: preflight, collection)"
        shown = ", ".join(f"{counts.get(o, 0)} {o}" for o in PROGRESS_OUTCOMES if counts.get(o, 0))
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        text = f"progress: {done}{of} cases{pct} in {duration(elapsed)}" + (f" — {shown}" if shown else "")
        if self.total and done:
            text += "; " + (self.recorded_eta(now, running) or self.pace_eta(now, cases_start, done))
            text += self.later_words()
        if running:
            nodeid, since = min(running.items(), key=lambda item: item[1])
            text += f"; longest running: {nodeid.split('::', 1)[-1]} ({duration(now - since)})"
        return text

    def pace_eta(self, now: float, cases_start: float, done: int) -> str:
        pace = (now - cases_start) / done
        return f"ETA ≈ {duration(pace * ((self.total or done) - done))} at this pace (no recorded case times)"

    def recorded_eta(self, now: float, running: dict[str, float]) -> str | None:
        """The ETA from the recorded case times (``--case-seconds``): what is left of each case not finished,
        over the workers, scaled by how this run's finished cases compare with their records; unsure where
        that scale is far from 1 (a cold run compiles what a warm one found cached) or little is done yet.
        None without records."""
        if not self.expected or not self.ids:
            return None
        with self.lock:
            finished, took = set(self.finished), dict(self.took)
        expect = lambda nodeid: self.expected.get(nodeid, UNRECORDED_S)  # noqa: E731
        left = sum(expect(i) for i in self.ids if i not in finished and i not in running)
        left += sum(max(0.0, expect(i) - (now - since)) for i, since in running.items())
        done_expected = sum(expect(i) for i in finished)
        scale = sum(took.get(i, 0.0) for i in finished) / done_expected if done_expected >= 1.0 else 1.0
        eta = f"ETA ≈ {duration(left * scale / self.workers)} from the recorded case times"
        if done_expected < 0.05 * (done_expected + left) or not 0.5 <= scale <= 2.0:
            eta += f" (unsure: this run so far takes {scale:.1f}x the recorded times)"
        return eta

    def later_words(self) -> str:
        """``, then ≈ 15 s for 1 later phase (recorded)``; unrecorded phases are counted, not guessed."""
        if not self.then:
            return ""
        known = [s for s in self.then.values() if s is not None]
        unknown = len(self.then) - len(known)
        count = len(self.then)
        text = f", then {count} later phase{'s' if count > 1 else ''}"
        if known:
            text += f" ≈ {duration(sum(known))} as recorded"
        if unknown:
            text += f" ({unknown} with no recorded time)" if known else " (no recorded time)"
        return text

    def emit(self) -> None:
        self._write(self.line())


#: A case the recorded times do not name (they keep only cases of 0.5 s and more): a short one.
UNRECORDED_S = 0.1


def _recorded(config: pytest.Config) -> tuple[dict[str, float], dict[str, float]]:
    """The run's recorded case and phase times (``--case-seconds``, read once), or none (a run without the
    option, a bad file)."""
    from harness.case_order import load_recorded

    getoption = getattr(config, "getoption", None)
    path = getoption("--case-seconds", None) if getoption is not None else None
    try:
        return load_recorded(Path(path)) if path else ({}, {})
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return {}, {}


def _later_phases(config: pytest.Config, recorded: Mapping[str, float]) -> dict[str, float | None]:
    """``--then-phases``' shard suffixes, each with its seconds in ``recorded`` or None."""
    getoption = getattr(config, "getoption", None)
    names = getoption("--then-phases", "") if getoption is not None else ""
    return {name: recorded.get(name) for name in str(names or "").split(",") if name}


def _workers(config: pytest.Config) -> int:
    workers = getattr(getattr(config, "option", None), "numprocesses", None)
    return workers if isinstance(workers, int) and workers > 0 else 1


def add_option(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--progress-every",
        type=float,
        default=INTERVAL_S,
        metavar="S",
        help="print a progress line (cases done, ETA, the longest-running case) every S seconds; 0: never "
        "(default: %(default)s)",
    )
    group.addoption(
        "--then-phases",
        default="",
        metavar="SUFFIXES",
        help="the front door's phases after this one, by shard suffix (-exclusive): the ETA adds their "
        "seconds recorded in --case-seconds",
    )


def register(config: pytest.Config) -> None:
    """Register the reporter where reports gather (not in xdist workers), unless switched off."""
    interval = float(config.getoption("--progress-every"))
    if interval > 0 and not hasattr(config, "workerinput") and not config.getoption("collectonly"):
        reporter = ProgressReporter(config, interval)
        config.pluginmanager.register(reporter, "harness-progress")
        reporter.ticker.start()  # now: the preflight (session start) is already a long step
