"""The outcome vocabulary of a case: the one place that names each outcome and what it counts as.

``Outcome`` is a ``str`` enum, so a member *is* its string: it compares and hashes equal to it (a case read
back from a result file, whose outcome is a plain string, matches the member), ``json.dumps`` writes
``"passed"``, and ``str``/``format``/f-strings give the value on every supported Python (``__str__`` is
pinned; a ``(str, Enum)`` would print ``Outcome.PASSED`` from 3.11 on). Only ``repr`` shows the member.

One boundary needs the plain string: anything that rides on a pytest report (``report.case_result``,
``user_properties``) crosses pytest-xdist's execnet serialiser, which accepts ``str`` but no subclass of
it; write ``outcome.value`` there.

pytest's own ``TestReport.outcome`` (``"passed"``, ``"failed"``, ``"skipped"``) is pytest's vocabulary,
not this one: a converted report says ``"skipped"`` to pytest while its recorded outcome is, e.g.,
``should-failed``. Code that sets it keeps pytest's literals.

Standard library only: ``reports`` and ``harness.finalize`` import it without torch or pytest.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class Outcome(str, Enum):
    """How one case ended, as the result file records it (``CaseResult.outcome``).

    The order is the result file's: ``RunResult.summary()`` counts outcomes in it.
    """

    #: The case ran and every check held.
    PASSED = "passed"
    #: A check naming a *must* rule failed (or a declared known failure passed: ``known-failures/stale``).
    FAILED = "failed"
    #: The case was skipped (an optional part missing, no GPU, ...); ``message`` says why.
    SKIPPED = "skipped"
    #: The case could not be run to its verdict: its setup or teardown failed, or collection failed.
    ERROR = "error"
    #: The process running the case died with no word (a pytest-xdist worker crash).
    CRASHED = "crashed"
    #: A declared known failure failing as declared (``known_failure`` says why), or a pytest xfail.
    XFAILED = "xfailed"
    #: A pytest xfail marker's case passed.
    XPASSED = "xpassed"
    #: A *should* rule failed (policy, optimisation, performance): fails the run only with --strict-should.
    SHOULD_FAILED = "should-failed"
    #: The backend does not cover what the case exercises (e.g. an op it does not map); never a failure.
    COVERAGE = "coverage"
    #: The case outlived its time limit; ``evidence`` holds every thread's stack.
    TIMEOUT = "timeout"
    #: The device was unusable after the case (a sticky CUDA error); ``evidence`` holds the error and
    #: ``repro`` runs the case under compute-sanitizer.
    DEVICE_FAULT = "device-fault"
    #: The run stopped before the case ended (deadline, SIGTERM, -x, ...); ``message`` says why.
    NOT_RUN = "not-run"

    def __str__(self) -> str:
        return self.value


#: The backend did something wrong: these fail a run (exit status, JUnit ``<failure>``, the comparison's
#: "newly failing", the dashboard's red and purple).
FAILING: frozenset[Outcome] = frozenset(
    {Outcome.FAILED, Outcome.ERROR, Outcome.CRASHED, Outcome.XPASSED, Outcome.TIMEOUT, Outcome.DEVICE_FAULT}
)
#: Neither a pass nor a failure by default: JUnit ``<skipped>`` (pytest sees an xfail or a skip). Only
#: ``should-failed`` can fail a run, and only under --strict-should.
SKIP_LIKE: frozenset[Outcome] = frozenset(
    {Outcome.SKIPPED, Outcome.XFAILED, Outcome.SHOULD_FAILED, Outcome.COVERAGE, Outcome.NOT_RUN}
)
#: A plain pass. PASSING, FAILING and SKIP_LIKE split the outcomes between them.
PASSING: frozenset[Outcome] = frozenset({Outcome.PASSED})

#: Checked and as expected: a pass, or a declared known failure failing as declared.
OK: frozenset[Outcome] = frozenset({Outcome.PASSED, Outcome.XFAILED})
#: The case no longer checks anything: skipped, a coverage gap, or not run at all.
NOT_CHECKING: frozenset[Outcome] = frozenset({Outcome.SKIPPED, Outcome.COVERAGE, Outcome.NOT_RUN})
#: What the case watchdog finds (``harness/watchdog.py``): a case that hung or broke the device.
FAULTS: frozenset[Outcome] = frozenset({Outcome.TIMEOUT, Outcome.DEVICE_FAULT})
#: The case's process ended it abnormally: a crash or a watchdog fault (the matrix's "crash" cells).
CRASH_LIKE: frozenset[Outcome] = FAULTS | {Outcome.CRASHED}
#: Final whatever phase's report carries them: a ``case_result`` with one of these ends the case over
#: what its other reports say (the watchdog's faults and the run's end).
FINAL: frozenset[Outcome] = FAULTS | {Outcome.NOT_RUN}
#: The pytest marker of a case that checks the test suite itself (its oracles, its meter), with no backend
#: involved: recorded as the suite's (``CaseResult.suite_check``), never counted as the backend's.
SUITE_CHECK_MARKER = "suite_check"
#: What the conformance suite's outcome plugin makes of a failed check, besides ``failed``
#: (``conformance/suite/outcomes.py``): pytest sees an xfail, the result file records the outcome.
SUITE_DECIDED: frozenset[Outcome] = frozenset({Outcome.SHOULD_FAILED, Outcome.COVERAGE, Outcome.XFAILED})


def is_suite_check(report: object) -> bool:
    """Whether a test report (a worker's, serialised, or the process's own) is of a ``suite_check`` case."""
    return SUITE_CHECK_MARKER in (getattr(report, "keywords", None) or {})


def count_words(counts: Mapping[str, int]) -> str:
    """``2 passed, 1 skipped``: the counts that are not zero, in the mapping's order."""
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items() if n)
