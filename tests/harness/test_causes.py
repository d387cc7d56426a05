"""The likely cause first (issue 48 item 1): failures after a broken every-call invariant in their worker
count under it; elsewhere each counts under its own rule; the headline names the rule explaining most."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from harness import causes
from harness.causes import NO_RULE, headline, junit_properties, likely_causes
from harness.finalize import write_junit
from harness.outcomes import Outcome
from harness.results import CaseResult, new_run

INPUTS = "contract/inputs-untouched"


def failure(
    name: str, rule: str | None, worker: str | None, at: float, outcome: str = Outcome.FAILED
) -> CaseResult:
    return CaseResult(name, "c", {}, outcome, "m", "r", 0.1, worker, rule=rule, started_s=at)


def test_failures_after_a_broken_invariant_in_their_worker_count_under_it() -> None:
    ranked = likely_causes(
        [
            failure("a", "program_format/flipped-byte", "gw0", 0.0),  # before the invariant broke: its own
            failure("b", INPUTS, "gw0", 1.0),
            failure("c", "program_format/flipped-byte", "gw0", 2.0),
            failure("d", "bad_inputs/rejected", "gw0", 3.0),
            failure("e", "program_format/flipped-byte", "gw1", 4.0),  # another worker: its own
            failure("f", INPUTS, "gw1", 5.0),
        ]
    )
    assert [(c.rule, c.own, c.after) for c in ranked] == [
        (INPUTS, 2, 2),
        ("program_format/flipped-byte", 2, 0),
    ]
    assert ranked[0].cases == ["b", "c", "d", "f"]
    assert headline(ranked) == f"likely cause: [{INPUTS}] (4 of 6 failures)"
    assert "(2 its own, 2 after it in the same worker)" in ranked[0].words()


def test_order_is_by_time_not_by_arrival_and_only_failing_outcomes_count() -> None:
    ranked = likely_causes(
        [
            failure("late", "program_format/flipped-byte", "gw0", 9.0),
            failure("early", INPUTS, "gw0", 1.0),
            failure("passed", None, "gw0", 0.5, Outcome.PASSED),
            failure("known", "program_format/flipped-byte", "gw0", 0.7, Outcome.XFAILED),
            failure("crash", None, "gw2", 3.0, Outcome.CRASHED),
        ]
    )
    assert [(c.rule, c.explained) for c in ranked] == [(INPUTS, 2), (NO_RULE, 1)]
    assert ranked[1].shown == NO_RULE


def test_without_an_invariant_each_failure_keeps_its_own_rule() -> None:
    ranked = likely_causes([failure(str(i), r, "gw0", float(i)) for i, r in enumerate("abba")])
    assert [(c.rule, c.own, c.after) for c in ranked] == [("a", 2, 0), ("b", 2, 0)]
    assert not likely_causes([])
    assert headline([]) is None
    assert junit_properties([]) == []


def test_a_case_without_a_worker_is_never_attributed_to_another() -> None:
    ranked = likely_causes([failure("x", INPUTS, None, 0.0), failure("y", "r", None, 1.0)])
    assert sorted((c.rule, c.own, c.after) for c in ranked) == [(INPUTS, 1, 0), ("r", 1, 0)]
    assert causes.is_invariant(INPUTS)
    assert not causes.is_invariant("r")
    assert not causes.is_invariant(None)


def test_the_finalized_junit_file_opens_with_the_likely_cause(tmp_path: Path) -> None:
    run = new_run({})

    run.cases = [
        failure("t::a", INPUTS, "gw0", 0.0),
        failure("t::b", "program_format/flipped-byte", "gw0", 1.0),
    ]
    write_junit(tmp_path / "j.xml", run)
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite is not None
    assert suite[0].tag == "properties"
    properties = {p.get("name"): p.get("value") for p in suite[0]}
    assert properties["likely-cause"] == f"likely cause: [{INPUTS}] (2 of 2 failures)"
    assert properties["failed-rules"] == f"2 [{INPUTS}] (1 its own, 1 after it in the same worker)"
