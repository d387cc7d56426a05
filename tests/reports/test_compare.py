"""Baseline comparison: every metric verdict, thresholds, case changes, and the CLI's regression gate."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from harness.results import CaseResult, RunResult, new_run, write_results
from reports.compare import Comparison, compare_cases, compare_metric, compare_runs, metric_verdict
from reports.dashboard import main


def verdict(
    base: float, base_spread: float, now: float, now_spread: float, better: str | None = "lower", pct=5.0
):
    return metric_verdict(base, base_spread, now, now_spread, better, pct)


@pytest.mark.parametrize(
    ("base", "base_spread", "now", "now_spread", "better", "expected"),
    [
        (1.00, 0.01, 1.04, 0.01, "lower", "same"),  # 4% < 5%
        (1.00, 0.50, 1.04, 0.50, "lower", "same"),  # below the threshold, noise is irrelevant
        (1.00, 0.01, 1.10, 0.01, "lower", "slower"),
        (1.00, 0.01, 0.90, 0.01, "lower", "faster"),
        (1.00, 0.01, 0.90, 0.01, "higher", "slower"),  # e.g. TFLOP/s or a speed ratio dropped
        (1.00, 0.01, 1.10, 0.01, "higher", "faster"),
        (1.00, 0.06, 1.10, 0.05, "lower", "ambiguous"),  # 10% change, but 1.06 > 1.05: intervals overlap
        (1.00, 0.25, 1.50, 0.25, "lower", "ambiguous"),  # touching intervals count as overlapping
        (1.00, 0.04, 1.10, 0.05, "higher", "faster"),  # 1.04 < 1.05: apart, and higher is better
        (1.00, 0.01, 1.10, 0.01, None, "changed"),  # no direction: reported, never "slower"
        (0.0, 0.0, 0.0, 0.0, "lower", "same"),
        (0.0, 0.0, 1.0, 0.0, "lower", "slower"),  # from zero: an infinite relative change
    ],
)
def test_metric_verdicts(base, base_spread, now, now_spread, better, expected) -> None:
    assert verdict(base, base_spread, now, now_spread, better) == expected


def test_threshold_is_a_strict_bound_and_configurable() -> None:
    assert verdict(1.0, 0.0, 1.05, 0.0) == "slower"  # exactly at the threshold is not "same"
    assert verdict(1.0, 0.0, 1.05, 0.0, pct=5.01) == "same"
    assert verdict(1.0, 0.0, 1.20, 0.0, pct=25) == "same"
    assert verdict(1.0, 0.0, 1.001, 0.0, pct=0) == "slower"


def test_metric_comparison_handles_odd_values() -> None:
    key = ("benchmarks", "mm_out", "x", "time")
    good = {"unit": "s", "value": 1.0, "spread": 0.01, "better": "lower"}
    assert compare_metric(key, good, {**good, "value": None}, 5).verdict == "n/a"
    assert compare_metric(key, {**good, "value": "fast"}, good, 5).verdict == "n/a"
    assert compare_metric(key, good, {**good, "value": math.nan}, 5).verdict == "n/a"
    changed_unit = compare_metric(key, good, {**good, "unit": "ms", "value": 1000.0}, 5)
    assert changed_unit.verdict == "n/a"
    assert "unit changed" in changed_unit.note
    # A missing spread is a point interval; a negative one is taken by size.
    assert compare_metric(
        key, {"unit": "s", "value": 1.0, "better": "lower"}, good | {"value": 1.2}, 5
    ).verdict == ("slower")
    assert compare_metric(key, good | {"spread": -0.5}, good | {"value": 1.2}, 5).verdict == "ambiguous"
    # An unknown "better" is treated as no direction.
    assert compare_metric(
        key, good | {"better": "sideways"}, good | {"value": 2.0, "better": "sideways"}, 5
    ).verdict == ("changed")


def record(suite: str, name: str, **metrics: dict[str, Any]) -> dict[str, Any]:
    return {"suite": suite, "name": name, "params": {}, "primary": next(iter(metrics)), "metrics": metrics}


def time(value: float, spread: float = 0.001) -> dict[str, Any]:
    return {"unit": "s", "value": value, "spread": spread, "better": "lower", "n": 20}


def case(case_id: str, outcome: str) -> CaseResult:
    return CaseResult(case_id, "mm_out", {}, outcome, "", f"python -m pytest '{case_id}'", 0.1, None)


def run(
    cases: list[CaseResult], benchmarks: list[dict[str, Any]], traffic: list[dict[str, Any]] | None = None
):
    result = new_run({"hostname": "h"}, {"backend": {"name": "b"}})
    return dataclasses.replace(
        result, cases=cases, benchmarks=benchmarks, traffic=traffic or [], complete=True, finished_at="x"
    )


def test_runs_match_metrics_by_suite_name_and_metric() -> None:
    base = run(
        [],
        [
            record("mm_out", "a", time=time(1.0)),
            record("mm_out", "b", time=time(1.0)),
            record("other", "a", time=time(1.0)),
            record("mm_out", "gone", time=time(1.0)),
        ],
        [record("pcie", "t", bytes={"unit": "bytes", "value": 100.0, "spread": 1.0, "better": "lower"})],
    )
    now = run(
        [],
        [
            record("mm_out", "a", time=time(1.2)),  # slower
            record("mm_out", "b", time=time(0.8), extra=time(5.0)),  # faster; "extra" has no baseline
            record("other", "a", time=time(1.0)),  # same
            record("mm_out", "new", time=time(1.0)),
        ],
        [record("pcie", "t", bytes={"unit": "bytes", "value": 150.0, "spread": 1.0, "better": "lower"})],
    )
    comparison = compare_runs(now, base)
    verdicts = {(m.section, m.suite, m.name, m.metric): m.verdict for m in comparison.metrics}
    assert verdicts == {
        ("benchmarks", "mm_out", "a", "time"): "slower",
        ("benchmarks", "mm_out", "b", "time"): "faster",
        ("benchmarks", "other", "a", "time"): "same",
        ("traffic", "pcie", "t", "bytes"): "slower",  # more bytes moved than before
    }
    assert comparison.verdict == "regression"
    assert len(comparison.regressions()) == 2
    assert compare_runs(now, base, threshold_pct=60).verdict == "unchanged"


def test_repeated_names_are_matched_in_order() -> None:
    base = run([], [record("s", "x", time=time(1.0)), record("s", "x", time=time(2.0))])
    now = run([], [record("s", "x", time=time(1.0)), record("s", "x", time=time(3.0))])
    verdicts = {m.name: m.verdict for m in compare_runs(now, base).metrics}
    assert verdicts == {"x": "same", "x#2": "slower"}


def test_case_changes() -> None:
    base = [
        case("a", "passed"),
        case("b", "passed"),
        case("c", "passed"),
        case("d", "failed"),
        case("e", "passed"),
        case("f", "skipped"),
        case("g", "xfailed"),
        case("gone", "passed"),
        case("h", "passed"),
        case("i", "passed"),
        case("j", "passed"),
    ]
    now = [
        case("a", "failed"),
        case("b", "crashed"),
        case("c", "error"),
        case("d", "passed"),
        case("e", "passed"),
        case("f", "failed"),  # skipped before: not "newly failing" (it did not pass then)
        case("g", "xpassed"),  # an expected failure that now passes unexpectedly
        case("new", "failed"),
        case("h", "skipped"),
        case("i", "coverage"),  # no longer checked: the backend stopped covering it
        case("j", "timeout"),  # an outcome this version does not know: failing until listed as not
    ]
    changes = {(c.id, c.change) for c in compare_cases(now, base)}
    assert changes == {
        ("a", "newly_failing"),
        ("b", "newly_failing"),
        ("c", "newly_failing"),
        ("g", "newly_failing"),
        ("j", "newly_failing"),
        ("d", "newly_passing"),
        ("new", "new"),
        ("gone", "lost"),
        ("h", "newly_skipped"),
        ("i", "newly_skipped"),
    }


def test_shards_with_the_same_case_id_count_the_worst_outcome() -> None:
    changes = compare_cases([case("a", "passed"), case("a", "crashed")], [case("a", "passed")])
    assert [(c.id, c.change, c.current_outcome) for c in changes] == [("a", "newly_failing", "crashed")]


def test_overall_verdicts() -> None:
    base = run([case("a", "failed")], [record("s", "x", time=time(1.0, 0.2))])
    assert compare_runs(
        run([case("a", "failed")], [record("s", "x", time=time(1.1, 0.2))]), base
    ).verdict == ("ambiguous")
    assert compare_runs(
        run([case("a", "passed")], [record("s", "x", time=time(1.0, 0.2))]), base
    ).verdict == ("improved")
    assert compare_runs(base, base).verdict == "unchanged"


def test_comparison_round_trips_through_a_dict() -> None:
    base = run([case("a", "passed")], [record("s", "x", time=time(1.0))])
    now = run([case("a", "failed")], [record("s", "x", time=time(2.0))])
    comparison = compare_runs(now, base)
    assert Comparison.from_dict(comparison.to_dict()) == comparison


# ---------------------------------------------------------------------------------------------- the CLI gate


def write(path: Path, result: RunResult) -> str:
    write_results(path, result)
    return str(path)


@pytest.fixture
def baseline_file(tmp_path: Path) -> str:
    return write(
        tmp_path / "base.json", run([case("t::a", "passed")], [record("mm_out", "m", time=time(1.0))])
    )


def gate(tmp_path: Path, baseline: str, current: RunResult, *extra: str) -> int:
    return main(
        [write(tmp_path / "now.json", current), "-o", str(tmp_path / "site"), "--baseline", baseline, *extra]
    )


def test_fail_on_regression_exits_1_for_a_slower_metric(tmp_path, baseline_file, capsys) -> None:
    slower = run([case("t::a", "passed")], [record("mm_out", "m", time=time(1.5))])
    assert gate(tmp_path, baseline_file, slower, "--fail-on-regression") == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out
    assert "slower: benchmarks mm_out / m / time: 1.000 s ± 1.000 ms → 1.500 s ± 1.000 ms (+50.0%)" in out
    # Without the flag the same run is reported but does not fail the command.
    assert gate(tmp_path, baseline_file, slower) == 0
    assert "REGRESSION" in capsys.readouterr().out


def test_fail_on_regression_exits_1_for_a_newly_failing_case(tmp_path, baseline_file, capsys) -> None:
    failing = run([case("t::a", "crashed")], [record("mm_out", "m", time=time(1.0))])
    assert gate(tmp_path, baseline_file, failing, "--fail-on-regression") == 1
    assert "newly failing: t::a (passed → crashed)" in capsys.readouterr().out


def test_fail_on_regression_passes_on_noise_improvements_and_the_threshold(tmp_path, baseline_file) -> None:
    noisy = run([case("t::a", "passed")], [record("mm_out", "m", time=time(1.2, 0.3))])
    assert gate(tmp_path, baseline_file, noisy, "--fail-on-regression") == 0  # ambiguous does not gate
    faster = run([case("t::a", "passed"), case("t::new", "failed")], [record("mm_out", "m", time=time(0.5))])
    assert gate(tmp_path, baseline_file, faster, "--fail-on-regression") == 0  # a new failing case is "new"
    slower = run([case("t::a", "passed")], [record("mm_out", "m", time=time(1.3))])
    assert gate(tmp_path, baseline_file, slower, "--fail-on-regression", "--threshold-pct", "40") == 0
    assert gate(tmp_path, baseline_file, slower, "--fail-on-regression", "--threshold-pct", "20") == 1


def test_lost_cases_fail_the_gate_unless_the_comparison_is_narrowed(tmp_path, capsys) -> None:
    """A `-k mm_out` run against a full baseline: every case it did not run is lost, and the gate fails
    (it read "unchanged · 798 removed" and passed); with --narrowed the same run passes, lost cases listed."""
    full = [case(f"conformance/lowering/test_lowering.py::t[{n}]", "passed") for n in range(30)]
    full += [case("conformance/mm_out/test_mm_out.py::t", "passed")]
    baseline = write(tmp_path / "base.json", run(full, []))
    narrowed = run([case("conformance/mm_out/test_mm_out.py::t", "passed")], [])
    assert gate(tmp_path, baseline, narrowed, "--fail-on-regression") == 1
    out = capsys.readouterr().out
    assert "30 case(s) lost (not in this run; if it is a deliberate subset, compare with --narrowed)" in out
    assert "lost: conformance/lowering/test_lowering.py::t[0] (passed → absent)" in out
    assert "… and 10 more lost" in out  # 20 listed, then a count
    assert gate(tmp_path, baseline, narrowed, "--fail-on-regression", "--narrowed") == 0
    assert "REGRESSION" not in capsys.readouterr().out
    index = (tmp_path / "site" / "index.html").read_text()
    assert "30 lost" in index
    assert "narrowed: lost and newly skipped cases do not gate" in index
    # Both sides: the full run again passes the gate without the flag.
    assert gate(tmp_path, baseline, run(full, []), "--fail-on-regression") == 0


def test_passed_to_skipped_fails_the_gate_unless_the_comparison_is_narrowed(tmp_path, capsys) -> None:
    """A backend that starts skipping what it passed (a part it stopped providing) no longer passes."""
    baseline = write(tmp_path / "base.json", run([case("t::a", "passed"), case("t::b", "skipped")], []))
    skipping = run([case("t::a", "skipped"), case("t::b", "skipped")], [])
    assert gate(tmp_path, baseline, skipping, "--fail-on-regression") == 1
    assert "newly skipped: t::a (passed → skipped)" in capsys.readouterr().out
    assert gate(tmp_path, baseline, skipping, "--fail-on-regression", "--narrowed") == 0
    # Both sides: a case skipped before and after is no change; one that runs again is no regression.
    again = run([case("t::a", "passed"), case("t::b", "passed")], [])
    assert gate(tmp_path, baseline, again, "--fail-on-regression") == 0


def test_a_stored_comparison_from_before_lost_cases_gated_keeps_its_verdict() -> None:
    """History written before "lost" existed named it "removed" and never gated on it."""
    old = {
        "baseline_run_id": "b",
        "baseline_started_at": "2026-01-01T00:00:00+00:00",
        "threshold_pct": 5.0,
        "metrics": [],
        "cases": [
            {
                "id": "t::x",
                "chapter": "t",
                "change": "removed",
                "baseline_outcome": "passed",
                "current_outcome": None,
            }
        ],
    }
    comparison = Comparison.from_dict(old)
    assert [c.change for c in comparison.cases] == ["lost"]
    assert comparison.verdict == "unchanged"


def test_unreadable_baseline_exits_2(tmp_path, capsys) -> None:
    bad = tmp_path / "base.json"
    bad.write_text('{"schema": "aoti-conformance-results", "schema_version": 1, "run_id": ', encoding="utf-8")
    current = run([case("t::a", "passed")], [])
    assert gate(tmp_path, str(bad), current, "--fail-on-regression") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "baseline" in err
    assert str(bad) in err


def test_an_incomplete_baseline_is_never_unchanged_and_fails_the_gate(tmp_path, capsys) -> None:
    """Issue 48 item 4: against a baseline cut short (its cases not run), the verdict is "incomplete", the
    gate says why and fails, and a passing gate still prints its verdict and baseline."""
    cut = dataclasses.replace(
        run([case("t::a", "not-run"), case("t::b", "passed")], [record("mm_out", "m", time=time(1.0))]),
        complete=False,
    )
    now = run([case("t::a", "passed"), case("t::b", "passed")], [record("mm_out", "m", time=time(1.0))])
    comparison = compare_runs(now, cut)
    assert comparison.verdict == "incomplete"
    assert comparison.baseline_incomplete == "incomplete: cut before its end (INCOMPLETE), 1 case(s) not run"
    assert any("nothing can be vouched unchanged" in line for line in comparison.regressions())
    assert gate(tmp_path, write(tmp_path / "cut.json", cut), now, "--fail-on-regression") == 1
    out = capsys.readouterr().out
    assert "the baseline is incomplete" in out
    assert "verdict incomplete" in out
    whole = write(tmp_path / "whole.json", now)
    assert gate(tmp_path, whole, now, "--fail-on-regression") == 0
    assert "verdict unchanged against baseline" in capsys.readouterr().out


def test_a_chapter_that_did_not_run_on_one_side_shows_no_ratio() -> None:
    from reports.compare_cli import timing_lines

    before = run([case("t::a", "not-run")], [])
    now = run([case("t::a", "passed")], [])
    (row,) = [line for line in timing_lines(before, now) if "mm_out (case-seconds)" in line]
    assert row.rstrip().endswith("n/a"), row
