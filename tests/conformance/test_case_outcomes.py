"""Rule levels, coverage gaps and declared known failures, through real inner pytest sessions.

A synthetic chapter (``conformance/test_toy.py`` in a temporary directory) runs against a toy backend with
the suite's own configuration loaded as a plugin (``-p conformance.conftest``), in a subprocess, with and
without pytest-xdist; the verdicts are read back from the exit status, the result file, JUnit XML and
the terminal.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conformance.common import rules
from conformance.suite import known_failures
from conformance.suite.known_failures import KnownFailuresError, glob_match, load_file, parse_entries
from harness.results import SCHEMA_VERSION, ResultFileError, parse_results

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[2]

TOY_BACKEND = """
class Toy:
    name = "toy"
    version = "0.1"
    known_failures = (
        {"case": "conformance/test_toy.py::test_known_by_backend", "reason": "declared by the backend",
         "link": "https://example.com/backend"},
    )

BACKEND = Toy()
"""

TOY_CHAPTER = """
import pytest
from conformance.common.checks import coverage_gap, fail

@pytest.mark.rules("toy/values")
def test_must():
    fail("toy/values", "toy()", "wrong values")

@pytest.mark.rules("mm_out/no-host-sync")
def test_should():
    fail("mm_out/no-host-sync", "toy()", "returned only after the stream drained")

@pytest.mark.rules("toy/ops")
def test_coverage():
    coverage_gap("toy/ops", "lower(toy)", "op aten::foo is not mapped")

@pytest.mark.rules("toy/values")
@pytest.mark.parametrize("x", [1, 2])
def test_known(x):
    fail("toy/values", "toy()", "known wrong")

@pytest.mark.rules("toy/other")
def test_known_other_rule():
    fail("toy/other", "toy()", "not the declared rule")

@pytest.mark.rules("toy/anything")
def test_known_by_backend():
    fail("toy/anything", "toy()", "the backend says so")

def test_stale():
    pass

def test_pass():
    pass

@pytest.fixture
def slow_fixture():
    fail("mm_out/no-host-sync", "fixture", "a should rule broken in setup")

@pytest.mark.rules("mm_out/no-host-sync")
def test_setup_should(slow_fixture):
    pass
"""

KNOWN_TOML = """
[[known_failures]]
case = "conformance/test_toy.py::test_known[*]"
rule = "toy/values"
reason = "bug 1"
link = "https://example.com/1"

[[known_failures]]
case = "conformance/test_toy.py::test_known_other_rule"
rule = "toy/values"
reason = "declared with another rule"

[[known_failures]]
case = "conformance/test_toy.py::test_stale"
reason = "fixed since"

[[known_failures]]
case = "conformance/test_gone.py::*"
reason = "a chapter that no longer exists"
"""

LEVELS_ONLY = ("-k", "should or coverage or test_pass")


@pytest.fixture
def toy(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    pytester.makeini("[pytest]\n")  # the temporary directory is the rootdir: ids read conformance/...
    pytester.makepyfile(toy_backend=TOY_BACKEND)
    (pytester.path / "conformance").mkdir()
    (pytester.path / "conformance" / "test_toy.py").write_text(TOY_CHAPTER, encoding="utf-8")
    (pytester.path / "known.toml").write_text(KNOWN_TOML, encoding="utf-8")
    return pytester


def run_toy(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, Any], str]:
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "harness.pytest_plugin", "-p", "conformance.conftest",
        "--backend", "toy_backend:BACKEND", "--no-preflight",
        f"--results-json={out / 'r.json'}", f"--junitxml={out / 'j.xml'}", "conformance", *args,
    )  # fmt: skip
    return result, json.loads((out / "r.json").read_text()), (out / "j.xml").read_text()


def by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {case["id"].split("::", 1)[1]: case for case in data["cases"]}


def junit_cases(xml: str) -> dict[str, ET.Element]:
    return {tc.get("name", ""): tc for tc in ET.fromstring(xml).iter("testcase")}


def properties(testcase: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in testcase.iter("property")}


EXPECTED_LEVELS = {
    "test_should": "should-failed",
    "test_coverage": "coverage",
    "test_pass": "passed",
    "test_setup_should": "should-failed",
}
EXPECTED_FULL = {
    "test_must": "failed",
    "test_should": "should-failed",
    "test_coverage": "coverage",
    "test_known[1]": "xfailed",
    "test_known[2]": "xfailed",
    "test_known_other_rule": "failed",
    "test_known_by_backend": "xfailed",
    "test_stale": "failed",
    "test_pass": "passed",
    "test_setup_should": "should-failed",
}


@pytest.mark.proof
def test_should_failures_and_coverage_gaps_do_not_fail_the_run(toy: pytest.Pytester) -> None:
    result, data, xml = run_toy(toy, *LEVELS_ONLY)
    assert result.ret == 0, result.stdout.str()
    cases = by_name(data)
    assert {name: c["outcome"] for name, c in cases.items()} == EXPECTED_LEVELS
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["metadata"]["strict_should"] is False
    should = cases["test_should"]
    assert (should["rule"], should["level"]) == ("mm_out/no-host-sync", "should")
    assert "[mm_out/no-host-sync] toy(): returned only after the stream drained" in should["message"]
    assert (cases["test_setup_should"]["rule"], cases["test_setup_should"]["level"]) == (
        "mm_out/no-host-sync",
        "should",
    )
    gap = cases["test_coverage"]
    assert (gap["rule"], gap["level"]) == ("toy/ops", None)
    assert "op aten::foo is not mapped" in gap["message"]
    # The backend's entry matches a collected (if deselected) case: no warning.
    assert "warnings" not in data["metadata"]

    junit = junit_cases(xml)
    skipped = junit["test_should"].find("skipped")
    assert skipped is not None
    assert skipped.get("message", "").startswith("should: [mm_out/no-host-sync]")
    assert properties(junit["test_should"])["conformance:level"] == "should"
    coverage = junit["test_coverage"].find("skipped")
    assert coverage is not None
    assert coverage.get("message", "").startswith("coverage: [toy/ops]")
    assert properties(junit["test_coverage"])["conformance:outcome"] == "coverage"
    assert ET.fromstring(xml).find("testsuite").get("failures") == "0"  # type: ignore[union-attr]

    result.stdout.fnmatch_lines(
        [
            "toy: 1 passed, 0 failed, 0 error, 0 skipped, 2 should-failed, 1 coverage",
            "*should-level failures: 2; they do not fail this run; --strict-should makes them*",
            "conformance/test_toy.py::test_should — [[]mm_out/no-host-sync] toy(): returned only after*",
            "*coverage gaps: 1 (never a failure)*",
            "conformance/test_toy.py::test_coverage — [[]toy/ops] lower(toy): op aten::foo is not mapped",
            "*1 passed*2 should-failed, 1 coverage*",
        ]
    )
    result.stdout.no_fnmatch_line("*FAILED*")


@pytest.mark.proof
def test_strict_should_fails_the_run_under_xdist(toy: pytest.Pytester) -> None:
    result, data, _ = run_toy(toy, *LEVELS_ONLY, "-n", "2", "--strict-should")
    assert result.ret == 1, result.stdout.str()
    cases = by_name(data)
    assert {name: c["outcome"] for name, c in cases.items()} == EXPECTED_LEVELS
    assert {c["worker"] for c in cases.values()} <= {"gw0", "gw1"}
    assert cases["test_should"]["level"] == "should"
    assert data["metadata"]["strict_should"] is True
    result.stdout.fnmatch_lines(["*should-level failures: 2; they fail this run (--strict-should)*"])


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["single", "xdist"])
@pytest.mark.proof
def test_known_failures_are_xfailed_and_stale_entries_fail(toy: pytest.Pytester, workers: list[str]) -> None:
    result, data, xml = run_toy(toy, "--known-failures", "known.toml", *workers)
    assert result.ret == 1, result.stdout.str()  # test_must, test_known_other_rule and the stale entry
    cases = by_name(data)
    assert {name: c["outcome"] for name, c in cases.items()} == EXPECTED_FULL

    known = cases["test_known[2]"]
    assert (known["rule"], known["level"]) == ("toy/values", "must")
    assert known["known_failure"]["reason"] == "bug 1"
    assert known["known_failure"]["link"] == "https://example.com/1"
    assert known["known_failure"]["case"] == "conformance/test_toy.py::test_known[*]"
    assert "[toy/values] toy(): known wrong" in known["message"]
    assert cases["test_known_by_backend"]["known_failure"]["reason"] == "declared by the backend"
    # Declared with another rule than the one it broke: an ordinary failure.
    other = cases["test_known_other_rule"]
    assert (other["rule"], other["known_failure"]) == ("toy/other", None)
    stale = cases["test_stale"]
    assert stale["rule"] == known_failures.STALE_RULE
    assert stale["message"].startswith("[known-failures/stale] conformance/test_toy.py::test_stale: passed")
    assert stale["known_failure"]["reason"] == "fixed since"
    assert "--known-failures known.toml" in stale["repro"]

    unmatched = data["metadata"]["known_failures"]["unmatched"]
    assert [entry["case"] for entry in unmatched] == ["conformance/test_gone.py::*"]
    assert data["metadata"]["warnings"] == [
        "known-failures: case 'conformance/test_gone.py::*' (known.toml #4) matches no collected case"
    ]

    junit = junit_cases(xml)
    skipped = junit["test_known[1]"].find("skipped")
    assert skipped is not None
    assert skipped.get("message", "").startswith("known failure: bug 1 (https://example.com/1)")
    assert properties(junit["test_known[1]"])["known_failure:link"] == "https://example.com/1"
    assert junit["test_stale"].find("failure") is not None

    result.stdout.fnmatch_lines(
        [
            "toy: 1 passed, 3 failed, 0 error, 0 skipped, 2 should-failed, 1 coverage, 3 xfailed",
            "*known failures*",
            "5 declared (backend attribute known_failures, known.toml): 3 failed as declared (xfailed), "
            "1 stale (passed: failed with known-failures/stale)",
            "XFAIL conformance/test_toy.py::test_known[[]1] — bug 1 https://example.com/1",
            "STALE conformance/test_toy.py::test_stale",
            "warning: known-failures: case 'conformance/test_gone.py::*' (known.toml #4) matches no*",
        ]
    )


@pytest.mark.proof
def test_a_broken_known_failures_file_is_a_usage_error(toy: pytest.Pytester) -> None:
    (toy.path / "bad.toml").write_text('[[known_failures]]\ncase = "x"\nwhy = "typo"\n', encoding="utf-8")
    result = toy.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "conformance.conftest", "--backend", "toy_backend:BACKEND",
        "--known-failures", "bad.toml", "conformance", "--collect-only",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--known-failures: bad.toml: entry 1: unknown field(s) [[]'why'[]]*"])


# A chapter whose first case kills its worker (a segmentation fault, as PyTorch's AOTI runtime does on some
# inputs): declared with crash = true it is xfailed, under pytest-xdist only.
CRASH_CHAPTER = """
import ctypes
import pytest
from conformance.common.checks import fail

@pytest.mark.parametrize("where", ["null"])
def test_dies(where):
    ctypes.string_at(0)

def test_passes():
    pass

@pytest.mark.rules("toy/values")
def test_fails():
    fail("toy/values", "toy()", "a wrong value, and no crash")

@pytest.mark.rules("toy/values")
def test_fails_as_declared():
    fail("toy/values", "toy()", "declared by another entry too")
"""

CRASH_TOML = """
[[known_failures]]
case = "conformance/test_crash.py::test_dies[*]"
crash = true
reason = "a segmentation fault reading address 0; repro: repros/dies.py"
link = "https://example.com/crash"
"""

# Crash entries on cases that do not crash, and on none; test_dies has none here.
WRONG_CRASH_TOML = """
[[known_failures]]
case = "conformance/test_crash.py::test_passes"
crash = true
reason = "crashed once"

[[known_failures]]
case = "conformance/test_crash.py::test_fails*"
crash = true
reason = "said to crash"

[[known_failures]]
case = "conformance/test_crash.py::test_fails_as_declared"
rule = "toy/values"
reason = "a plain known failure"

[[known_failures]]
case = "conformance/test_gone.py::*"
crash = true
reason = "a chapter that no longer exists"
"""


BACKEND_ENTRY_UNMATCHED = (
    "known-failures: case 'conformance/test_toy.py::test_known_by_backend' (backend 'toy' known_failures #1) "
    "matches no collected case"
)


@pytest.fixture
def crashing(toy: pytest.Pytester) -> pytest.Pytester:
    (toy.path / "conformance" / "test_toy.py").unlink()
    (toy.path / "conformance" / "test_crash.py").write_text(CRASH_CHAPTER, encoding="utf-8")
    (toy.path / "crash.toml").write_text(CRASH_TOML, encoding="utf-8")
    (toy.path / "wrong.toml").write_text(WRONG_CRASH_TOML, encoding="utf-8")
    return toy


@pytest.mark.proof
def test_a_declared_crash_is_xfailed_under_xdist(crashing: pytest.Pytester) -> None:
    result, data, xml = run_toy(crashing, "--known-failures", "crash.toml", "-n", "2", "-k", "dies or passes")
    assert result.ret == 0, result.stdout.str()
    cases = by_name(data)
    assert {name: c["outcome"] for name, c in cases.items()} == {
        "test_dies[null]": "xfailed",
        "test_passes": "passed",
    }
    dies = cases["test_dies[null]"]
    assert dies["known_failure"]["reason"] == "a segmentation fault reading address 0; repro: repros/dies.py"
    assert (dies["known_failure"]["link"], dies["known_failure"]["crash"]) == (
        "https://example.com/crash",
        True,
    )
    assert (dies["rule"], dies["level"]) == (None, "must")
    assert re.fullmatch(
        r"worker 'gw\d' crashed while running 'conformance/test_crash.py::test_dies\[null\]'", dies["message"]
    )
    assert dies["params"] == {"where": "null"}  # from its setup report, before the crash
    assert "--known-failures crash.toml" in dies["repro"]
    assert data["metadata"]["warnings"] == [BACKEND_ENTRY_UNMATCHED]  # the crash entry matched its case

    testcase = junit_cases(xml)["test_dies[null]"]
    skipped = testcase.find("skipped")
    assert skipped is not None
    assert skipped.get("message", "").startswith(
        "known failure: a segmentation fault reading address 0; repro: repros/dies.py (https://example.com/crash)"
        " — worker 'gw"
    )
    assert properties(testcase)["conformance:outcome"] == "xfailed"
    assert properties(testcase)["known_failure:link"] == "https://example.com/crash"
    assert ET.fromstring(xml).find("testsuite").get("failures") == "0"  # type: ignore[union-attr]
    result.stdout.fnmatch_lines(
        [
            "results: * (1 passed, 0 failed, 0 skipped, 0 crashed, 1 xfailed)",
            "crash: 1 passed, 0 failed, 0 error, 0 skipped, 1 xfailed",
            "2 declared (backend attribute known_failures, crash.toml): 1 failed as declared (xfailed), 0 *",
            "XFAIL conformance/test_crash.py::test_dies[[]null] — a segmentation fault * https://example.com/crash",
            "*= 1 passed, 1 xfailed in *",
        ]
    )


@pytest.mark.proof
def test_crash_entries_excuse_only_a_crash(crashing: pytest.Pytester) -> None:
    result, data, _ = run_toy(crashing, "--known-failures", "wrong.toml", "-n", "2")
    assert result.ret == 1, result.stdout.str()
    cases = by_name(data)
    assert {name: c["outcome"] for name, c in cases.items()} == {
        "test_dies[null]": "crashed",  # no entry declares it
        "test_passes": "failed",  # stale
        "test_fails": "failed",  # a wrong value: a crash entry does not excuse it
        "test_fails_as_declared": "xfailed",  # the plain entry does
    }
    assert cases["test_dies[null]"]["known_failure"] is None
    stale = cases["test_passes"]
    assert stale["rule"] == known_failures.STALE_RULE
    assert "passed, but wrong.toml #1 declares it a known crash: crashed once" in stale["message"]
    assert (cases["test_fails"]["rule"], cases["test_fails"]["known_failure"]) == ("toy/values", None)
    assert cases["test_fails_as_declared"]["known_failure"]["reason"] == "a plain known failure"
    assert data["metadata"]["warnings"] == [
        BACKEND_ENTRY_UNMATCHED,
        "known-failures: case 'conformance/test_gone.py::*', crash = true (wrong.toml #4) matches no "
        "collected case",
    ]


@pytest.mark.proof
def test_without_xdist_a_declared_crash_ends_the_run_and_says_so(crashing: pytest.Pytester) -> None:
    out = crashing.path / "out"
    result = crashing.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "harness.pytest_plugin", "-p", "conformance.conftest",
        "--backend", "toy_backend:BACKEND", "--no-preflight", f"--results-json={out / 'r.json'}",
        "--known-failures", "crash.toml", "conformance", "-k", "dies",
    )  # fmt: skip
    assert result.ret not in (0, 1), result.stdout.str()  # killed by the signal, not an ending pytest chose
    result.stdout.fnmatch_lines(
        [
            "warning: known-failures: case 'conformance/test_crash.py::test_dies[[]*]', crash = true "
            "(crash.toml #1) declares that the case ends its process: only a run under pytest-xdist (-n) "
            "survives that and records it xfailed; in this single process it ends the run"
        ]
    )
    assert not (out / "r.json").exists()  # harness.finalize would rebuild it from the journal: crashed


# ---------------------------------------------------------------------------------------------- units


def test_globs_treat_brackets_literally() -> None:
    assert glob_match(
        "conformance/mm_out/test_mm_out.py::test_x[float16-*]",
        "conformance/mm_out/test_mm_out.py::test_x[float16-1x2]",
    )
    assert not glob_match(
        "conformance/mm_out/test_mm_out.py::test_x[float16-*]", "conformance/mm_out/test_mm_out.py::test_x[f]"
    )
    assert glob_match("*::test_?", "a/b.py::test_1")
    assert not glob_match("test_x", "test_xy")  # whole id, not a prefix


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"case": "x"}, "field 'reason' must be a non-empty string, found missing"),
        ([{"case": "x", "reason": " "}], "field 'reason' must be a non-empty string"),
        ([{"case": "x", "reason": "r", "link": 3}], "field 'link' must be a non-empty string, found 3"),
        ([{"case": "x", "reason": "r", "why": "?"}], "unknown field(s) ['why']"),
        (
            [{"case": "x", "reason": "r", "crash": "yes"}],
            "entry 1: field 'crash' must be true or false, found 'yes'",
        ),
        ([{"case": "x", "reason": "r", "crash": 1}], "field 'crash' must be true or false, found 1"),
        (["x"], "entry 1: must be a table/object, found str"),
        ("x", "must be a list of entries, found str"),
        ({"known_failures": [], "extra": 1}, "unknown top-level key(s) ['extra']"),
    ],
)
def test_bad_entries_are_named(raw: object, message: str) -> None:
    with pytest.raises(KnownFailuresError, match=r"^src: ") as info:
        parse_entries([raw] if raw == {"case": "x"} else raw, "src")
    assert message in str(info.value)


def test_json_and_bare_lists_are_accepted(tmp_path: Path) -> None:
    entry = {"case": "a::b", "rule": "r/*", "reason": "why", "link": "https://example.com"}
    (tmp_path / "k.json").write_text(json.dumps({"known_failures": [entry]}), encoding="utf-8")
    (tmp_path / "bare.json").write_text(json.dumps([entry]), encoding="utf-8")
    for name in ("k.json", "bare.json"):
        (loaded,) = load_file(tmp_path / name)
        assert (loaded.case, loaded.rule, loaded.reason, loaded.link) == (
            "a::b",
            "r/*",
            "why",
            "https://example.com",
        )
        assert loaded.matches_rule("r/x")
        assert not loaded.matches_rule("s/x")
        assert not loaded.matches_rule(None)
    (tmp_path / "bad.toml").write_text("[[known_failures]\n", encoding="utf-8")
    with pytest.raises(KnownFailuresError, match="not valid TOML"):
        load_file(tmp_path / "bad.toml")
    assert parse_entries({}, "empty") == []


def test_crash_entries_match_only_a_crash() -> None:
    entries = parse_entries(
        [
            {"case": "a::*", "reason": "dies", "crash": True},
            {"case": "a::b", "reason": "wrong", "crash": False},
            {"case": "a::c", "reason": "wrong"},
        ],
        "src",
    )
    dies, wrong, plain = entries
    assert (dies.crash, wrong.crash, plain.crash) == (True, False, False)
    assert known_failures.first_match(entries, "a::b", None, crash=True) is dies
    assert known_failures.first_match(entries, "a::b", "x/y") is wrong
    assert known_failures.first_match(entries, "a::d", None) is None  # the crash entry excuses no failure
    assert known_failures.first_match(entries, "a::d", None, crash=True) is dies
    assert known_failures.case_matches(entries, "a::c") == [dies, plain]  # either makes a pass stale
    assert dies.to_dict()["crash"] is True
    assert dies.describe() == "case 'a::*', crash = true (src #1)"
    (from_json,) = parse_entries(json.loads('[{"case": "a", "reason": "r", "crash": true}]'), "j")
    assert from_json.crash is True


def test_rule_levels() -> None:
    assert rules.level_of("mm_out/no-host-sync") is rules.Level.SHOULD
    assert rules.level_of("mm_out/values") is rules.Level.MUST
    assert rules.level_of("never/heard-of") is rules.Level.MUST
    assert rules.rule_of("[mm_out/values] mm_out(out, a, b): 3 elements differ") == "mm_out/values"
    assert rules.rule_of("AssertionError: [x/y] nope") is None
    assert rules.rule_of("no rule") is None


def test_rules_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert rules.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("mm_out/no-host-sync ") and " should " in line for line in out)
    assert any(line.startswith("mm_out/values ") and " must " in line for line in out)
    assert rules.main(["--ids"]) == 0
    ids = capsys.readouterr().out.splitlines()
    assert "mm_out/no-host-sync should" in ids
    assert "mm_out/values must" in ids


def test_version_1_result_files_stay_readable() -> None:
    case = {
        "id": "conformance/mm_out/test_mm_out.py::t", "chapter": "mm_out", "params": {}, "outcome": "failed",
        "message": "m", "repro": "r", "duration_s": 0.1, "worker": None,
    }  # fmt: skip
    run = {
        "schema": "aoti-conformance-results", "schema_version": 1, "run_id": "r", "started_at": "s",
        "finished_at": None, "complete": True, "environment": {}, "metadata": {}, "cases": [case],
        "benchmarks": [], "traffic": [],
    }  # fmt: skip
    (old,) = parse_results(json.dumps(run)).cases
    assert (old.outcome, old.rule, old.level, old.known_failure) == ("failed", None, None, None)
    run["schema_version"] = 2
    run["cases"] = [{**case, "outcome": "should-failed", "rule": "a/b", "level": "should"}]
    (new,) = parse_results(json.dumps(run)).cases
    assert (new.outcome, new.rule, new.level) == ("should-failed", "a/b", "should")
    run["cases"] = [{**case, "level": "maybe"}]
    with pytest.raises(ResultFileError, match="level 'maybe' is not one of must, should"):
        parse_results(json.dumps(run))


@pytest.mark.proof
def test_a_run_stopped_before_its_workers_end_calls_no_matching_entry_unmatched(toy: pytest.Pytester) -> None:
    """Under xdist the workers' own matches arrive only when they end; a deadline ends them first. The
    controller matches the selection each worker collected, so only the entry for a gone file is unmatched
    (seen: a torch_aoti run stopped by its deadline warned about all 15 of its entries)."""
    (toy.path / "conformance" / "test_zz_slow.py").write_text(
        "import pytest, signal, time\n\n"
        "@pytest.mark.parametrize('worker', [1, 2])\n"  # both workers deaf to the stop: killed by xdist,
        "def test_deaf(worker):\n"  # their matches are never sent
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
        "    time.sleep(60)\n",
        encoding="utf-8",
    )
    result, data, _ = run_toy(toy, "--known-failures", "known.toml", "-n", "2", "--run-deadline", "40")
    assert result.ret == 124, result.stdout.str()
    assert data["metadata"]["incomplete_reason"].startswith("the run deadline")
    unmatched = [entry["case"] for entry in data["metadata"]["known_failures"]["unmatched"]]
    # The deadline (from the process's start) leaves a loaded machine time to collect; where it did not
    # (15 s did not under `nox -s proofs` on 2 cores), nothing is known and no entry is called unmatched.
    assert unmatched == (["conformance/test_gone.py::*"] if data["cases"] else []), result.stdout.str()
