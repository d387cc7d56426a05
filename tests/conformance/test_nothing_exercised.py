"""A run in which no case checked the backend under test is not green: the suite's own self-checks
(marked ``suite_check``: no backend involved) are counted as the suite's, never as the backend's passes,
on every surface (result file, summary line, pytest's counts, the chapter lines, JUnit, the page); a run of
nothing but skips, coverage gaps and self-checks exits 5 with one line saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.outcomes import Outcome
from harness.pytest_plugin import nothing_exercised_line, summary_line
from harness.results import CaseResult, RunResult, dumps_run, new_run, parse_results
from reports.inputs import LoadedRun
from reports.page_run import run_page
from tests.conformance.test_case_outcomes import run_toy, toy  # noqa: F401

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

SELF_CHECK_ONLY = """
import pytest

@pytest.mark.suite_check
def test_suite_self_check_oracle_is_sound():
    pass

def test_needs_a_part_the_backend_lacks():
    pytest.skip("backend 'toy' does not implement protocol part 'runtime'")
"""


def case(name: str, outcome: str, suite_check: bool = False) -> CaseResult:
    return CaseResult(
        f"conformance/test_x.py::{name}", "x", {}, outcome, "", "", 0.1, None, suite_check=suite_check
    )


def run_of(*cases: CaseResult) -> RunResult:
    run = new_run({})
    run.cases = list(cases)
    return run


def test_the_summary_counts_the_suites_checks_apart() -> None:
    run = run_of(case("a", "passed", True), case("b", "passed", True), case("c", "skipped"))
    summary = run.summary()
    assert summary["outcomes"][Outcome.PASSED] == 0
    assert (summary["total"], summary["suite_checks"]) == (1, {"passed": 2})
    assert summary["chapters"]["x"][Outcome.SKIPPED] == 1
    assert not run.exercised()
    line = summary_line(Path("r.json"), run)
    assert line == "results: r.json (0 passed, 0 failed, 1 skipped, 0 crashed; suite self-checks: 2 passed)"
    assert nothing_exercised_line(run).startswith(
        "no case exercised the backend under test (1 skipped; 2 suite"
    )


@pytest.mark.parametrize(
    ("outcome", "exercised"),
    [("passed", True), ("failed", True), ("xfailed", True), ("crashed", True), ("should-failed", True),
     ("skipped", False), ("coverage", False), ("not-run", False)],
)  # fmt: skip
def test_a_case_exercises_the_backend_unless_it_checked_nothing(outcome: str, exercised: bool) -> None:
    assert run_of(case("a", "passed", True), case("b", outcome)).exercised() is exercised
    assert run_of(case("b", outcome, suite_check=True)).exercised() is False


def test_the_flag_survives_the_result_file() -> None:
    run = run_of(case("a", "passed", True), case("b", "passed"))
    again = parse_results(dumps_run(run), source="r.json")
    assert [c.suite_check for c in again.cases] == [True, False]
    old = json.loads(dumps_run(run))
    for item in old["cases"]:
        del item["suite_check"]  # a file written before the flag: every case the backend's
    assert [c.suite_check for c in parse_results(json.dumps(old), source="old.json").cases] == [False, False]


def test_the_page_shows_them_apart() -> None:
    run = run_of(case("a", "passed", True), case("b", "skipped"))
    page = run_page(LoadedRun(run, []), None)
    assert (page.total, page.counts, page.suite_checks) == (1, [("skipped", 1)], [("passed", 1)])
    cells = [cell for m in page.matrices for row in m.rows for cell in row.cells if cell.total]
    assert [dict(cell.counts) for cell in cells] == [{"skipped": 1}]  # the self-check is in no cell


def test_only_self_checks_and_skips_exit_5_with_the_line(toy: pytest.Pytester) -> None:  # noqa: F811
    (toy.path / "conformance" / "test_toy.py").write_text(SELF_CHECK_ONLY, encoding="utf-8")
    result, data, xml = run_toy(toy)
    assert result.ret == 5, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "results: * (0 passed, 0 failed, 1 skipped, 0 crashed; suite self-checks: 1 passed)",
            "no case exercised the backend under test (1 skipped; 1 suite self-checks, *",
            "toy: 0 passed, 0 failed, 0 error, 1 skipped (suite self-checks, no backend: 1 passed)*",
            "*1 skipped, *1 suite self-check passed*",
        ]
    )
    checks = [c for c in data["cases"] if c["suite_check"]]
    assert [c["id"].split("::")[1] for c in checks] == ["test_suite_self_check_oracle_is_sound"]
    props = {p.get("name"): p.get("value") for p in ET.fromstring(xml).iter("property")}
    assert props.get("conformance:suite_check") == "true"


def test_one_case_that_checked_the_backend_is_enough(toy: pytest.Pytester) -> None:  # noqa: F811
    chapter = SELF_CHECK_ONLY + "\ndef test_the_backend_answers():\n    pass\n"
    (toy.path / "conformance" / "test_toy.py").write_text(chapter, encoding="utf-8")
    result, _, _ = run_toy(toy)
    assert result.ret == 0, result.stdout.str()
    assert "no case exercised" not in result.stdout.str()


@pytest.mark.proof
def test_a_backend_with_only_a_name_and_a_version_is_not_green(tmp_path: Path) -> None:
    """Every chapter on this machine against a backend that implements nothing: exit 5, and the line."""
    (tmp_path / "nothing.py").write_text(
        'class B:\n    name = "nothing"\n    version = "0"\n\nBACKEND = B()\n'
    )
    command = [
        sys.executable, "-m", "pytest", "conformance", "--backend=nothing:BACKEND",
        f"--backend-path={tmp_path}", "-n", "2", "-p", "harness.pytest_plugin",
        f"--results-json={tmp_path / 'r.json'}", "-p", "no:cacheprovider", "--no-preflight", "-q",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 5, output
    assert "no case exercised the backend under test" in output
    data = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    passed = [c["id"] for c in data["cases"] if c["outcome"] == "passed"]
    assert passed, "the suite's self-checks ran"
    assert all(c["suite_check"] for c in data["cases"] if c["outcome"] == "passed"), passed
