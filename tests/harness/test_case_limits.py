"""The pieces of the watchdog and the run's end that need no process: time-limit rules, the deadline and
the front door's share of it, what a dead worker's watchdog files say, and how the new outcomes render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.case_limits import DEFAULT_S, CaseLimitError, marker_seconds, parse_rules
from harness.results import CaseResult, new_run
from harness.run_control import (
    DEADLINE_ENV,
    EXIT_CODES,
    EXIT_DEADLINE,
    EXIT_FAILED,
    EXIT_SIGTERM,
    REPORT_RESERVE_S,
    FrontDoor,
    parse_seconds,
    split_deadline,
)
from harness.watchdog import Running, Verdict, WatchdogFiles
from reports.matrix import build_matrices
from reports.summary import render_summary

CASE = "conformance/mm_out/test_mm_out.py::test_values[bfloat16-4096x4096x4096]"


def test_a_case_takes_its_own_marker_then_its_id_then_the_largest_marker_rule_then_its_chapter() -> None:
    limits = parse_rules(
        ["default=600", "chapter:mm_out=300", "marker:slow=1200", "marker:timing=900", "# a comment", ""],
        ["120", "case:*bfloat16-4096*=45", "chapter:lowering=0"],
    )
    assert limits.limit("mm_out", ["gpu"], own=7.0, case=CASE) == (7.0, "its own @pytest.mark.case_timeout")
    assert limits.limit("mm_out", ["slow"], case=CASE) == (45.0, "rule case:*bfloat16-4096*")
    assert limits.limit("mm_out", ["slow", "timing"]) == (1200.0, "rule marker:slow")
    assert limits.limit("mm_out", ["gpu"]) == (300.0, "rule chapter:mm_out")
    assert limits.limit("bad_inputs", []) == (120.0, "the default")  # the command line over the ini
    assert limits.limit("lowering", []) == (None, "rule chapter:lowering")  # 0: no limit


def test_without_rules_a_case_has_the_default_limit_and_brackets_in_a_glob_are_literal() -> None:
    limits = parse_rules([], ["case:conformance/mm_out/test_mm_out.py::test_values[bfloat16-*]=9"])
    assert limits.limit("mm_out", [], case=CASE)[0] == 9.0
    assert limits.limit("mm_out", [], case=CASE.replace("bfloat16", "float16"))[0] == DEFAULT_S


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ("chapter=5", "want SECONDS, default=SECONDS, chapter:NAME=SECONDS"),
        ("suite:x=5", "is not a case time limit"),
        ("marker:slow=soon", "'soon' must be a number of seconds ≥ 0"),
        ("-3", "'-3' must be a number of seconds"),
        ("chapter:mm_out=inf", "must be a number of seconds"),
    ],
)
def test_a_bad_rule_is_an_error_naming_the_option_and_the_rule(rule: str, words: str) -> None:
    with pytest.raises(CaseLimitError, match=r"--case-timeout: ") as info:
        parse_rules([], [rule])
    assert words in str(info.value)
    assert rule in str(info.value)


def test_a_bad_case_timeout_marker_is_named() -> None:
    assert marker_seconds((30,), {}, "t") == 30.0
    with pytest.raises(CaseLimitError, match=r"t: @pytest.mark.case_timeout\(SECONDS\) wants seconds ≥ 0"):
        marker_seconds(("soon",), {}, "t")


def test_the_deadline_comes_from_the_arguments_or_the_environment_and_leaves_the_rest() -> None:
    args = ["-k", "mm_out", "--run-deadline", "1800", "--backend=x:Y"]
    assert split_deadline(args, {}) == (1800.0, ["-k", "mm_out", "--backend=x:Y"])
    assert split_deadline(["--run-deadline=90.5"], {DEADLINE_ENV: "10"}) == (90.5, [])
    assert split_deadline(["-x"], {DEADLINE_ENV: " 600 "}) == (600.0, ["-x"])
    assert split_deadline(["-x"], {}) == (None, ["-x"])
    with pytest.raises(ValueError, match=r"--run-deadline: 'soon' is not a number of seconds"):
        split_deadline(["--run-deadline", "soon"], {})
    with pytest.raises(ValueError, match=r"must be a finite number of seconds ≥ 0"):
        parse_seconds("-1")


def test_each_phase_gets_what_is_left_of_the_deadline_less_the_report_reserve() -> None:
    door = FrontDoor(["--run-deadline", "1000", "-k", "x"], {})
    args = door.phase_args()
    assert args[:2] == ["-k", "x"]
    left = float(args[2].removeprefix("--run-deadline="))
    assert 1000 - REPORT_RESERVE_S - 2 <= left <= 1000 - REPORT_RESERVE_S
    assert FrontDoor(["-k", "x"], {}).phase_args() == ["-k", "x"]
    door.phase_ended(EXIT_FAILED)  # failures are the verdict, not a stop
    assert door.stop is None
    door.phase_ended(EXIT_DEADLINE)
    assert door.stop == (EXIT_CODES[EXIT_DEADLINE], EXIT_DEADLINE)
    assert door.go_on  # later phases still run, to record their cases not-run
    assert EXIT_CODES[EXIT_SIGTERM].startswith("stopped by SIGTERM")


def test_a_dead_workers_files_say_how_its_case_ended(tmp_path: Path) -> None:
    files = WatchdogFiles(tmp_path, "gw3")
    files.start_case(Running(CASE, 30.0, "the default"))
    assert files.read_verdict(CASE) is None  # it died with no word: crashed
    files.stacks_path.write_text('Timeout (0:00:35)!\nThread 0x1 (most recent call first):\n  File "x.py"')
    verdict = files.read_verdict(CASE)
    assert verdict is not None
    assert verdict.outcome == "timeout"
    assert "time limit of 30 s (the default)" in verdict.message
    assert "C code holding the GIL" in verdict.message
    assert verdict.evidence is not None
    assert verdict.evidence.startswith("Timeout (0:00:35)!")
    assert files.read_verdict(CASE + "-another") is None
    files.write_verdict(Verdict(CASE, "device-fault", "device fault after this case: …", "AcceleratorError"))
    assert files.read_verdict(CASE) == Verdict(
        CASE, "device-fault", "device fault after this case: …", "AcceleratorError"
    )
    assert json.loads(files.case_path.read_text())["pid"] > 0
    files.reset()
    assert not any(tmp_path.iterdir())


def _case(id: str, outcome: str, message: str = "", evidence: str | None = None) -> CaseResult:
    params = {"dtype": "float16", "shape": "8x8x8"}
    return CaseResult(id, "mm_out", params, outcome, message, f"repro {id}", 1.0, "gw0", evidence=evidence)


def test_timeouts_device_faults_and_not_run_cases_render_with_their_evidence() -> None:
    run = new_run({"hostname": "box"})
    run.cases = [
        _case("t.py::a[0]", "passed"),
        _case(
            "t.py::a[1]",
            "timeout",
            "timeout: the case outlived …",
            "Thread 0x1 <hung> (most recent call first)",
        ),
        _case("t.py::a[2]", "device-fault", "device fault after this case: …", "AcceleratorError: illegal"),
        _case("t.py::a[3]", "not-run", "not run: the run was stopped by SIGTERM (before this case started)"),
    ]
    page = render_summary(run)
    assert page.index("t.py::a[1]") < page.index("t.py::a[2]")  # faults come first among the problems
    assert "Thread 0x1 &lt;hung&gt;" in page  # the evidence, escaped
    assert "Evidence (1 lines: every thread&#39;s stack)" in page
    assert 'class="badge not-run"' in page
    assert "not run: the run was stopped by SIGTERM (before this case started)" in page
    (matrix,) = build_matrices(run.cases)
    (cell,) = matrix.rows[0].cells
    assert (cell.status, cell.text) == ("crash", "1/3 +1 not run")
