"""The rule-coverage table (``python -m tests.rule_coverage``) is complete and true: every rule id has a case,
and a broken backend that a chapter fails on it or an exemption with its reason; every rule id a case
declares is a rule of the table, and the table says which chapters check it; no exemption is stale.

The cases are those pytest collects, each with the rules it declares (``@pytest.mark.rules``, read by
``conformance/common/declared_rules.py``). The declarations are held both ways: a failure under a rule its
case does not declare is a suite error at run time (proven here on a toy chapter), and every rule id a chapter
looks up is declared by one of its cases."""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conformance.catalogue import CATALOGUE, RULE_TABLE, RULES_BY_ID
from conformance.common import declared_rules
from conformance.suite import rule_coverage as rc
from harness.results import parse_results
from tests.rule_coverage import BrokenBackend, broken_backends

ROOT = rc.ROOT

pytest_plugins = ["pytester"]


#: The chapters' cases and their declared rules, as JSON (what ``cases`` reads).
COLLECT = (
    "import json\n"
    "from conformance.suite import rule_coverage as rc\n"
    "print(json.dumps([[c.id, c.chapter, sorted(c.rules)] for c in rc.collected_cases()]))\n"
)


def in_a_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` here: pytest's collection of the chapters loads the suite's configuration (its
    Hypothesis profile, its backend), which must not leak into this process."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cases() -> list[rc.Case]:
    proc = in_a_process("-c", COLLECT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [rc.Case(id, chapter, frozenset(rules)) for id, chapter, rules in json.loads(proc.stdout)]


@pytest.fixture(scope="module")
def backends() -> list[BrokenBackend]:
    return broken_backends()


@pytest.fixture(scope="module")
def rows(cases: list[rc.Case], backends: list[BrokenBackend]) -> list[rc.Row]:
    return rc.coverage_rows(cases, [b.proof() for b in backends])


def test_every_case_declares_a_rule_of_its_own(cases: list[rc.Case]) -> None:
    """Not only the contract monitor's, which the backend fixture implies: a case with no ``rules`` mark
    would make every failure of its own checks a suite error."""
    assert len(cases) > 1000, "the chapters' cases were not all collected"
    bare = [case.id for case in cases if not case.rules - set(declared_rules.IMPLIED["backend"])]
    assert bare == [], f"cases without @pytest.mark.rules(...): {bare[:10]}"


def test_every_rule_a_chapter_looks_up_is_declared_by_one_of_its_cases(cases: list[rc.Case]) -> None:
    """The other direction from the run-time check, where it can be seen without running: a rule id a
    chapter holds at module level (``VALUES = rule_id(...)``, a family's ``{value: id}``, a helper's tuple)
    is there to be checked, so some case of that chapter declares it; one none declares is a check whose
    failure would be a suite error (or a constant nobody uses)."""
    declared: dict[str, set[str]] = {}
    for case in cases:
        declared.setdefault(case.id.split("::")[0], set()).update(case.rules)
    missing = {}
    for path, rules in sorted(declared.items()):
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        values = [v for name, v in vars(module).items() if not name.startswith("_")]
        strings = [s for v in values for s in ([v] if isinstance(v, str) else _strings(v))]
        looked_up = {s for s in strings if s in RULES_BY_ID}
        if looked_up - rules:
            missing[path] = sorted(looked_up - rules)
    assert missing == {}, f"rule ids a chapter names that none of its cases declares: {missing}"


def _strings(value: object) -> list[str]:
    """The strings one level inside a mapping (keys and values) or a sequence; none for anything else."""
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [v for v in value if isinstance(v, str)]
    return []


@pytest.mark.proof
def test_every_rule_has_a_case(rows: list[rc.Row]) -> None:
    """A SPEC rule mapped to an id no case checks shows here (the SPEC map names ids the code must use);
    only a rule no backend can break (not-checkable, e.g. known-failures/stale) may have none."""
    assert [r.rule for r in rows if r.status == "NO CASE"] == []


def test_every_rule_has_a_broken_backend_or_is_not_checkable(rows: list[rc.Row]) -> None:
    """A gap (a rule some backend could break, with no broken backend proving the suite catches it) fails
    here; the only way around a broken backend is an exemption saying why no backend can break the rule."""
    gaps = [r.rule for r in rows if r.status not in ("proven", "proven-gpu", "not-checkable")]
    assert gaps == [], (
        f"add a broken backend (tests/broken/*.py, with breaks=...), or if no backend can break it, the "
        f"reason as exempt= on its row of conformance/catalogue/rule_table.py: {gaps}"
    )


def test_no_rule_id_is_left_a_template(rows: list[rc.Row]) -> None:
    """Every ``{...}`` in a rule id was filled from the case's parameters or the caller's arguments."""
    assert [r.rule for r in rows if "{" in r.rule] == []


def test_exemptions_are_not_stale(rows: list[rc.Row]) -> None:
    """An exempt rule (``exempt=`` on its row of the table) must have no broken backend: one a broken
    backend now proves is stale. Its row says why, and the coverage table shows that reason."""
    by_rule = {r.rule: r for r in rows}
    exempt = [rule for rule, row in RULES_BY_ID.items() if row.exempt]
    assert exempt, "the table exempts nothing: the meter's rules and suite/self-check should be exempt"
    stale = [rule for rule in exempt if by_rule[rule].broken_backends]
    assert stale == [], f"exempt, yet a broken backend proves them (drop exempt=): {stale}"
    assert all(by_rule[r].exemption == "not-checkable" and by_rule[r].exemption_reason for r in exempt)


def test_every_rule_a_case_checks_is_a_rule_of_the_table(rows: list[rc.Row]) -> None:
    """A rule id written past the table (a literal instead of ``rule_id(...)``) shows as a row the table
    lacks; so would a rule id the table dropped while a case still names it."""
    assert [r.rule for r in rows if r.rule not in RULES_BY_ID] == []


def test_the_table_says_which_chapters_check_each_rule(rows: list[rc.Row]) -> None:
    """A row's chapters are exactly those whose cases can fail with its rule ids."""
    wrong = [
        (r.rule, sorted(RULES_BY_ID[r.rule].chapters), r.chapters)
        for r in rows
        if sorted(RULES_BY_ID[r.rule].chapters) != r.chapters
    ]
    assert wrong == [], "rows of conformance/catalogue/rule_table.py naming the wrong chapters: " + str(wrong)


def test_every_row_of_the_table_is_a_row_of_the_coverage_table(rows: list[rc.Row]) -> None:
    assert [r.rule for r in rows] == sorted(i for row in RULE_TABLE for i in row.ids)


def test_declared_breaks_name_rules_the_chapter_checks(
    rows: list[rc.Row], backends: list[BrokenBackend]
) -> None:
    """A broken backend may only claim rules that a case of its chapter checks."""
    by_rule = {r.rule: r for r in rows}
    for broken in backends:
        chapter = broken.breaks.chapter
        for rule in broken.breaks.rules:
            assert rule in by_rule, f"{broken.spec} claims {rule!r}, which no case checks"
            assert any(c.startswith(chapter) for c in by_rule[rule].cases), (broken.spec, rule, chapter)


def test_every_chapter_with_a_backend_has_a_broken_backend(backends: list[BrokenBackend]) -> None:
    chapters = {b.breaks.chapter for b in backends}
    wanted = {f"conformance/{c}/test_{c}.py" for c in rc.CHAPTERS if c != "traffic_meter"}  # the meter: none
    assert wanted <= chapters, sorted(wanted - chapters)


def test_catalogue_rules_name_rule_ids_the_chapters_check(rows: list[rc.Row]) -> None:
    """Every rule pattern of the catalogue (``conformance/catalogue``) matches a rule id some case checks:
    a renamed or dropped rule shows here as a sentence of the contract nobody enforces. A rule no case can
    check (``known-failures/stale``: the plugin's own) counts when it is exempt as not-checkable."""
    checked = [r.rule for r in rows if r.cases or r.status == "not-checkable"]
    stale = [
        (entry.cite(), pattern)
        for entry in CATALOGUE
        for pattern in entry.rules
        if not any(fnmatch.fnmatchcase(rule, pattern) for rule in checked)
    ]
    assert stale == [], f"catalogue rule patterns that match no rule id a case checks: {stale}"


def test_rows_cite_the_sentences_their_rule_enforces(rows: list[rc.Row]) -> None:
    by_rule = {r.rule: r for r in rows}
    assert any("On any error, outputs are left untouched." in s for s in by_rule["mm_out/none-out"].spec)
    assert any(s.startswith("SPEC §1b: ") for s in by_rule["streams_threads/threads"].spec)


def test_rule_ids_are_picked_per_case(cases: list[rc.Case]) -> None:
    """Both sides: a case's own rule is found and its siblings' are not (``BAD_INPUT_RULES[rule]``, a
    ``parametrize`` over ``AFTER_DESTROY``); a helper's rule ids are those of the mechanism its caller
    passes (``SKIP_COPY``, ``PLACEMENT``); a lookup (``level_of``) is not read as every rule."""
    by_id = {case.id: case for case in cases}
    bad = by_id[
        "conformance/mm_out/test_mm_out.py::test_bad_input_is_rejected_and_out_untouched[dtype-mismatch-mat2]"
    ]
    assert "mm_out/dtype-mismatch-mat2" in bad.rules
    assert "mm_out/none-out" not in bad.rules
    matrix = [c for c in cases if "::test_skip_copy_matrix[" in c.id]
    assert matrix
    assert all("runtime_options/output-device" in c.rules for c in matrix)
    assert not any("device_placement/output-device" in c.rules for c in matrix)
    destroyed = by_id[
        "conformance/bad_inputs/test_bad_inputs.py::test_destroyed_handle_is_rejected[destroy-cpu-program]"
    ]
    assert "bad_inputs/destroy-twice" in destroyed.rules
    assert "bad_inputs/execute-after-destroy" not in destroyed.rules
    verdicts = [c for c in cases if "::test_view_pass_verdicts[" in c.id]
    assert verdicts
    assert not any("mm_out/no-host-sync" in c.rules for c in verdicts)


@pytest.mark.proof  # three processes that each collect the chapters: about 25 s on two cores
def test_the_command_prints_the_table_and_json() -> None:
    """``python -m tests.rule_coverage`` (what ``nox -s conformance`` writes for the dashboard) gives the
    broken backends; the product's own command cannot know them, and says so."""
    proc = in_a_process("-m", "tests.rule_coverage", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {"rule", "level", "cases", "broken_backends", "status"} <= set(data[0])
    assert any(row["rule"] == "runtime_options/nul-character" and row["broken_backends"] for row in data)
    by_rule = {row["rule"]: row for row in data}
    assert (
        "conformance/mm_out/test_mm_out.py::test_bad_input_is_rejected_and_out_untouched[none-out]"
        in (by_rule["mm_out/none-out"]["cases"])
    )
    proc = in_a_process("-m", "tests.rule_coverage")
    assert proc.returncode == 0, proc.stderr
    assert "runtime_options/nul-character" in proc.stdout
    proc = in_a_process("-m", "conformance.suite.rule_coverage", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "no broken backends given" in proc.stderr
    assert not any(row["broken_backends"] for row in json.loads(proc.stdout))


def test_status_both_sides() -> None:
    """The statuses the self-tests above rely on: a rule with a case and nothing else is red; a broken
    backend declaring it makes it proven; a rule with no case is red whatever proves it."""
    case = rc.Case("conformance/test_x.py::test_y", "x", frozenset({"zz/unexempted"}))
    proof = rc.Proof("tests.x:Y", ("zz/unexempted",))
    assert [r.status for r in rc.coverage_rows([case], []) if r.rule == "zz/unexempted"] == [
        "NO BROKEN BACKEND"
    ]
    assert [r.status for r in rc.coverage_rows([case], [proof]) if r.rule == "zz/unexempted"] == ["proven"]
    on_gpu = rc.Proof("tests.x:G", ("zz/unexempted",), cuda=True)
    statuses = [r.status for r in rc.coverage_rows([case], [on_gpu]) if r.rule == "zz/unexempted"]
    assert statuses == ["proven-gpu"]  # the CPU self-tests skip it: only a GPU run proves it
    both = [r.status for r in rc.coverage_rows([case], [on_gpu, proof]) if r.rule == "zz/unexempted"]
    assert both == ["proven"]
    lonely = rc.Case("conformance/test_x.py::test_z", "x", frozenset())
    rows = rc.coverage_rows([lonely], [])
    assert all(r.status in ("NO CASE", "not-checkable") for r in rows)


# ========================================================================== declarations, at run time

DECLARING = """
import pytest

@pytest.mark.rules("toy/a", "toy/b")
@pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.rules("toy/one")), 2])
def test_declares(x, backend):
    pass

def test_declares_nothing():
    pass
"""


def test_a_case_declares_its_marks_its_parameters_and_what_its_fixtures_imply(
    pytester: pytest.Pytester,
) -> None:
    """The declared set is the union of the function's and the parameter's ``rules`` marks, plus the
    contract monitor's rules for a case handed the backend (there: the fixture); a rule outside it is
    named, with the case and the set."""
    pytester.makeini(f"[pytest]\nmarkers =\n    {declared_rules.MARKER_HELP}\n")
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef backend():\n    return None\n")
    items = {item.name: item for item in pytester.getitems(DECLARING)}
    monitor = set(declared_rules.IMPLIED["backend"])
    assert declared_rules.declared(items["test_declares[1]"]) == {"toy/a", "toy/b", "toy/one"} | monitor
    assert declared_rules.declared(items["test_declares[2]"]) == {"toy/a", "toy/b"} | monitor
    assert declared_rules.declared(items["test_declares_nothing"]) == frozenset()
    second = items["test_declares[2]"]
    assert declared_rules.undeclared(second, ("toy/a", None, "contract/error-class")) is None
    message = str(declared_rules.undeclared(second, ("toy/one",)))
    assert message.startswith("[suite/undeclared-rule] ")  # the module is named after the test
    assert "::test_declares[2]: failed under toy/one, which the case does not declare" in message
    assert "(it declares: contract/error-class, " in message
    assert "toy/a, toy/b)" in message
    nothing = str(declared_rules.undeclared(items["test_declares_nothing"], ("toy/a",)))
    assert "(it declares: nothing)" in nothing


def test_params_declare_the_rule_each_value_picks() -> None:
    made = declared_rules.params({"none-out": "mm_out/none-out", "two": ("b/2", "a/1")})
    assert [(p.id, p.values) for p in made] == [("none-out", ("none-out",)), ("two", ("two",))]
    assert [[m.args for m in p.marks] for p in made] == [[("mm_out/none-out",)], [("a/1", "b/2")]]


TOY_BACKEND = """
class Toy:
    name = "toy"
    version = "0.1"

BACKEND = Toy()
"""

UNDECLARED_CHAPTER = """
import pytest
from conformance.common.checks import coverage_gap, fail

@pytest.mark.rules("toy/values")
def test_declared():
    fail("toy/values", "toy()", "wrong values")

@pytest.mark.rules("toy/values")
def test_undeclared():
    fail("toy/other", "toy()", "a check naming a rule its case does not declare")

@pytest.mark.rules("toy/values")
def test_undeclared_gap():
    coverage_gap("toy/ops", "lower(toy)", "op aten::foo is not mapped")

@pytest.mark.parametrize("rule", [pytest.param("toy/a", marks=pytest.mark.rules("toy/a")), "toy/b"])
def test_per_parameter(rule):
    fail(rule, "toy()", "the parameter picks the rule")

def test_monitor_rule_with_the_backend(backend):
    fail("contract/error-class", "toy()", "the contract monitor's rule: implied by the backend")

def test_monitor_rule_without_the_backend():
    fail("contract/error-class", "toy()", "no backend, so no monitor: not declared")
"""


@pytest.mark.proof  # a chapter run in a real pytest session: about 10 s on two cores
def test_a_failure_under_an_undeclared_rule_is_a_suite_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A toy chapter through the suite's plugins: a failure under a declared rule (the function's, the
    parameter's, or the monitor's for a case with the backend) is the backend's; under any other it is a
    suite error: outcome ``error``, rule ``suite/undeclared-rule``, counted with the suite's self-checks,
    shown as an error (never FAILED), and the run fails."""
    pytester.makeini("[pytest]\n")  # the temporary directory is the rootdir: ids read conformance/...
    pytester.makepyfile(toy_backend=TOY_BACKEND)
    (pytester.path / "conformance").mkdir()
    (pytester.path / "conformance" / "test_toy.py").write_text(UNDECLARED_CHAPTER, encoding="utf-8")
    out = pytester.path / "out"
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "harness.pytest_plugin", "-p", "conformance.conftest",
        "--backend", "toy_backend:BACKEND", "--no-preflight", "-rfE",
        f"--results-json={out / 'r.json'}", f"--junitxml={out / 'j.xml'}", "conformance",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    run = parse_results((out / "r.json").read_text())
    cases = {case.id.split("::", 1)[1]: case for case in run.cases}
    backend_s = {"test_declared", "test_per_parameter[toy/a]", "test_monitor_rule_with_the_backend"}
    suite_s = {"test_undeclared", "test_undeclared_gap", "test_per_parameter[toy/b]"}
    suite_s.add("test_monitor_rule_without_the_backend")
    assert {name: (c.outcome, c.suite_check) for name, c in cases.items()} == {
        **{name: ("failed", False) for name in backend_s},
        **{name: ("error", True) for name in suite_s},
    }
    assert {cases[name].rule for name in suite_s} == {"suite/undeclared-rule"}
    undeclared = cases["test_undeclared"].message
    assert undeclared.startswith(
        "[suite/undeclared-rule] conformance/test_toy.py::test_undeclared: failed under toy/other, which "
        "the case does not declare (it declares: toy/values)"
    ), undeclared
    assert (
        "the failure: conformance.common.checks.CheckFailure: [toy/other] toy(): a check naming" in undeclared
    )
    assert run.summary()["suite_checks"] == {"error": 4}
    assert run.summary()["outcomes"]["failed"] == 3
    junit = {tc.get("name"): tc for tc in ET.fromstring((out / "j.xml").read_text()).iter("testcase")}
    props = {p.get("name"): p.get("value") for p in junit["test_undeclared"].iter("property")}
    assert props["conformance:suite_check"] == "true"
    assert props["conformance:rule"] == "suite/undeclared-rule"
    result.stdout.fnmatch_lines(["*ERROR at call of test_undeclared*", "*[[]suite/undeclared-rule[]]*"])
    result.stdout.no_fnmatch_line("FAILED conformance/test_toy.py::test_undeclared *")
