"""The outcome vocabulary (``harness.outcomes``): the members are the result file's strings, the groupings
split them consistently, every table keyed by outcome covers them all, and a member prints, serialises and
compares as its string. Literals here on purpose: they are the file format."""

from __future__ import annotations

import ast
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import execnet
import pytest

from harness import outcomes, results
from harness.finalize import write_junit
from harness.outcomes import (
    CRASH_LIKE,
    FAILING,
    FAULTS,
    FINAL,
    NOT_CHECKING,
    OK,
    PASSING,
    SKIP_LIKE,
    SUITE_DECIDED,
    Outcome,
)
from harness.watchdog import CASE_RESULT_ATTR, Verdict, set_case_result

ROOT = Path(__file__).resolve().parents[2]
#: What a result file may hold, in the order ``RunResult.summary()`` counts (schema version 3).
FILE_OUTCOMES = (
    "passed", "failed", "skipped", "error", "crashed", "xfailed", "xpassed", "should-failed", "coverage",
    "timeout", "device-fault", "not-run",
)  # fmt: skip


def test_the_members_are_the_file_format() -> None:
    assert tuple(outcome.value for outcome in Outcome) == FILE_OUTCOMES
    assert results.OUTCOMES == FILE_OUTCOMES
    assert all(type(name) is str for name in (*results.OUTCOMES, *results.FAILING_OUTCOMES))
    assert results.FAILING_OUTCOMES == ("failed", "error", "crashed", "xpassed", "timeout", "device-fault")


def test_pass_fail_and_skip_like_split_the_outcomes() -> None:
    groups = (PASSING, FAILING, SKIP_LIKE)
    assert set().union(*groups) == set(Outcome)
    assert sum(len(group) for group in groups) == len(Outcome)  # no outcome in two of them


def test_the_finer_groups_sit_inside_the_split() -> None:
    assert FAULTS <= CRASH_LIKE <= FAILING
    assert FAULTS | {Outcome.NOT_RUN} == FINAL
    assert NOT_CHECKING <= SKIP_LIKE
    assert SUITE_DECIDED <= SKIP_LIKE
    assert PASSING | {Outcome.XFAILED} == OK
    assert not OK & FAILING
    assert not NOT_CHECKING & OK
    groups = [value for value in vars(outcomes).values() if isinstance(value, frozenset)]
    assert all(isinstance(member, Outcome) for group in groups for member in group)


def test_every_table_keyed_by_outcome_covers_all_of_them() -> None:
    from harness.run_end import _STATUS
    from reports.charts import OUTCOME_COLOURS
    from reports.compare import _SEVERITY_ORDER
    from reports.matrix import _STATUS_OF_OUTCOME
    from reports.page_run import PROBLEM_OUTCOMES

    assert set(OUTCOME_COLOURS) == set(Outcome)
    assert sorted(_SEVERITY_ORDER) == sorted(Outcome)
    assert set(_STATUS_OF_OUTCOME) == set(Outcome)
    assert {o for o, status in _STATUS_OF_OUTCOME.items() if status == "crash"} == CRASH_LIKE
    assert {o for o, status in _STATUS_OF_OUTCOME.items() if status in ("crash", "fail")} == FAILING
    assert sorted(PROBLEM_OUTCOMES) == sorted(FAILING)
    assert set(_STATUS) == FINAL


@pytest.mark.parametrize("outcome", list(Outcome))
def test_a_member_is_its_string_wherever_it_is_written(outcome: Outcome) -> None:
    text = outcome.value
    assert type(text) is str
    assert outcome == text
    assert hash(outcome) == hash(text)
    assert Outcome(text) is outcome
    assert {outcome: 1}[text] == 1  # a string read from a file finds a member's entry
    assert json.dumps(outcome) == json.dumps(text)
    assert json.dumps({outcome: [outcome]}) == json.dumps({text: [text]})
    # Pinned __str__: a (str, Enum) would print "Outcome.X" from Python 3.11 on.
    assert str(outcome) == f"{outcome}" == text
    assert "{}".format(outcome) == text  # noqa: UP032 (str.format is what the check is about)
    assert "%s" % outcome == text  # noqa: UP031 (ElementTree writes attributes with %)
    assert f"{outcome:>14}" == f"{text:>14}"


def test_a_case_recorded_with_a_member_writes_the_same_file(tmp_path: Path) -> None:
    def run_with(outcome: str) -> str:
        run = results.new_run({})
        run.run_id, run.started_at = "r", "t"
        run.cases.append(results.not_run_case("conformance/test_x.py::test_a", "why"))
        run.cases[0].outcome = outcome
        path = tmp_path / f"{type(outcome).__name__}.json"
        results.write_results(path, run)
        return path.read_text(encoding="utf-8")

    assert run_with(Outcome.DEVICE_FAULT) == run_with("device-fault")
    assert '"outcome": "device-fault"' in run_with(Outcome.DEVICE_FAULT)


def test_junit_written_from_members_shows_their_strings(tmp_path: Path) -> None:
    run = results.new_run({})
    run.cases = [results.not_run_case("conformance/test_x.py::test_a", "slow")]
    run.cases[0].outcome = Outcome.TIMEOUT
    write_junit(tmp_path / "junit.xml", run)
    case = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite/testcase")
    assert case is not None
    assert case.find("properties/property").get("value") == "timeout"  # type: ignore[union-attr]
    assert case.find("failure").get("message") == "timeout: slow"  # type: ignore[union-attr]


def test_what_rides_on_a_report_is_a_plain_string() -> None:
    """pytest-xdist's execnet serialiser takes no str subclass: a member on a report would break a run."""
    with pytest.raises(execnet.DataFormatError):
        execnet.dumps(Outcome.TIMEOUT)
    report = SimpleNamespace()
    set_case_result(report, Verdict("case", Outcome.TIMEOUT, "slow"))  # type: ignore[arg-type]
    result = getattr(report, CASE_RESULT_ATTR)
    assert type(result["outcome"]) is str
    execnet.dumps(result)


# Product code names outcomes by Outcome; pytest's own TestReport.outcome ("passed", "failed", "skipped")
# is pytest's vocabulary and stays literal (``report.outcome = "skipped"``).
_PRODUCT = [*sorted((ROOT / "harness").rglob("*.py")), *sorted((ROOT / "reports").rglob("*.py"))]
_PRODUCT += [ROOT / "conformance" / "suite" / "outcomes.py", ROOT / "conformance" / "conftest.py"]


def _literal_outcomes(node: ast.AST) -> list[str]:
    if isinstance(node, ast.IfExp):
        return _literal_outcomes(node.body) + _literal_outcomes(node.orelse)
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in FILE_OUTCOMES]


def _names_outcome(node: ast.AST) -> bool:
    """``outcome``, ``case.outcome``, ``result["outcome"]``: but not a pytest report's ``report.outcome``."""
    if isinstance(node, ast.Name):
        return "outcome" in node.id
    if isinstance(node, ast.Attribute):
        return node.attr == "outcome" and not (isinstance(node.value, ast.Name) and node.value.id == "report")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "outcome"
    return False


def _named_values(node: ast.AST) -> list[ast.AST]:
    """The expressions ``node`` gives an outcome: what it compares one with, assigns or passes as one."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return sides if any(_names_outcome(side) for side in sides) else []
    if isinstance(node, ast.Assign) and any(_names_outcome(t) for t in node.targets):
        return [node.value]
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
        pairs = zip(node.targets[0].elts, getattr(node.value, "elts", []), strict=False)
        return [value for target, value in pairs if _names_outcome(target)]
    if isinstance(node, ast.keyword) and node.arg == "outcome":
        return [node.value]
    if isinstance(node, ast.Dict):
        pairs = zip(node.keys, node.values, strict=True)
        return [value for key, value in pairs if isinstance(key, ast.Constant) and key.value == "outcome"]
    if isinstance(node, ast.FunctionDef) and "outcome" in node.name:  # returns an outcome (and a message)
        returned = [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
        return [value.elts[0] if isinstance(value, ast.Tuple) else value for value in returned]
    return []


def _outcome_literals(tree: ast.AST) -> list[tuple[int, str]]:
    values = [value for node in ast.walk(tree) for value in _named_values(node)]
    found = [(value.lineno, literal) for value in values for literal in _literal_outcomes(value)]
    return sorted(found, key=lambda item: item[0])


@pytest.mark.parametrize("path", _PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_product_code_names_outcomes_by_the_enum(path: Path) -> None:
    if path.name == "outcomes.py" and path.parent.name == "harness":
        return  # the owner spells each string once
    found = _outcome_literals(ast.parse(path.read_text(encoding="utf-8")))
    where = ", ".join(f"{path.relative_to(ROOT)}:{line} {value!r}" for line, value in found)
    assert not found, f"outcome spelled as a string literal (use harness.outcomes.Outcome): {where}"


def test_the_literal_finder_finds_literals() -> None:
    source = """
if case.outcome == "passed": pass
if outcome in ("timeout", "device-fault"): pass
outcome, message = "crashed", text
result = {"outcome": "not-run"}
CaseResult(outcome="error")
outcome = "failed" if when == "call" else "xpassed"
report.outcome = "skipped"
def _skip_outcome(report):
    return "xfailed", str(report.wasxfail)
"""
    found = [value for _, value in _outcome_literals(ast.parse(source))]
    assert found == [
        "passed", "timeout", "device-fault", "crashed", "not-run", "error", "failed", "xpassed", "xfailed",
    ]  # fmt: skip
