"""``device_fault = true`` known failures: a case that breaks the CUDA context (the watchdog's
``device-fault`` verdict, a toy probe standing in for CUDA's) is xfailed when declared, under pytest-xdist,
with the CUDA error kept; undeclared, or declared only as a crash or a failure, it stays a device fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.suite import known_failures
from conformance.suite.known_failures import KnownFailuresError, parse_entries
from tests.conformance.test_case_outcomes import by_name, junit_cases, properties, run_toy, toy  # noqa: F401
from tests.harness.test_run_end import POISON, PROBE  # a toy probe stands in for CUDA's

pytest_plugins = ["pytester"]

DECLARED = """
[[known_failures]]
case = "conformance/test_fault.py::test_poisons"
device_fault = true
reason = "reads through a null device pointer; repro: repros/poisons.py"
link = "https://example.com/fault"
"""

# The same case declared as a crash and as an ordinary failure: neither excuses a device fault; a
# device-fault entry on a case that passes is stale.
WRONG = """
[[known_failures]]
case = "conformance/test_fault.py::test_poisons"
crash = true
reason = "said to crash"

[[known_failures]]
case = "conformance/test_fault.py::test_poisons"
reason = "said to fail"

[[known_failures]]
case = "conformance/test_fault.py::test_first"
device_fault = true
reason = "faulted once"
"""


@pytest.fixture
def faulting(toy: pytest.Pytester) -> pytest.Pytester:  # noqa: F811
    (toy.path / "conformance" / "test_toy.py").unlink()
    (toy.path / "conformance" / "test_fault.py").write_text(POISON, encoding="utf-8")
    (toy.path / "toy_probe.py").write_text(PROBE, encoding="utf-8")
    (toy.path / "declared.toml").write_text(DECLARED, encoding="utf-8")
    (toy.path / "wrong.toml").write_text(WRONG, encoding="utf-8")
    return toy


@pytest.mark.proof
def test_a_declared_device_fault_is_xfailed_under_xdist(faulting: pytest.Pytester) -> None:
    args = ("--device-probe", "toy_probe:probe", "-n", "1", "--known-failures", "declared.toml")
    result, data, xml = run_toy(faulting, *args)
    assert result.ret == 0, result.stdout.str()
    cases = by_name(data)
    assert {name: c["outcome"] for name, c in cases.items()} == {
        "test_first": "passed",
        "test_poisons": "xfailed",
        "test_neighbour": "passed",  # a fresh worker: no neighbour inherits the broken context
        "test_last": "passed",
    }
    fault = cases["test_poisons"]
    assert fault["message"].startswith("device fault after this case: AcceleratorError: CUDA error: an ill")
    assert "(toy)" in (fault["evidence"] or "")
    assert (fault["known_failure"]["device_fault"], fault["known_failure"]["link"]) == (
        True,
        "https://example.com/fault",
    )
    testcase = junit_cases(xml)["test_poisons"]
    assert properties(testcase)["known_failure:link"] == "https://example.com/fault"
    result.stdout.fnmatch_lines(["*1 failed as declared (xfailed)*"])


@pytest.mark.proof
def test_only_a_device_fault_entry_excuses_a_device_fault(faulting: pytest.Pytester) -> None:
    args = ("--device-probe", "toy_probe:probe", "-n", "1", "--known-failures", "wrong.toml")
    result, data, _ = run_toy(faulting, *args)
    assert result.ret == 1, result.stdout.str()
    cases = by_name(data)
    assert {name: c["outcome"] for name, c in cases.items()} == {
        "test_first": "failed",  # stale: declared a device fault, but it passed
        "test_poisons": "device-fault",
        "test_neighbour": "passed",
        "test_last": "passed",
    }
    assert "declares it a known device fault: faulted once" in cases["test_first"]["message"]


def test_device_fault_entries_match_only_a_device_fault() -> None:
    entries = parse_entries(
        [
            {"case": "a::*", "reason": "faults", "device_fault": True},
            {"case": "a::*", "reason": "dies", "crash": True},
            {"case": "a::b", "reason": "wrong"},
        ],
        "src",
    )
    fault, dies, wrong = entries
    assert known_failures.first_match(entries, "a::b", None, device_fault=True) is fault
    assert known_failures.first_match(entries, "a::b", None, crash=True) is dies
    assert known_failures.first_match(entries, "a::b", None) is wrong
    assert known_failures.first_match(entries, "a::c", None) is None  # neither excuses a failure
    assert (fault.ends_process, dies.ends_process, wrong.ends_process) == (True, True, False)
    assert fault.describe() == "case 'a::*', device_fault = true (src #1)"
    assert fault.to_dict()["device_fault"] is True
    (from_json,) = parse_entries(json.loads('[{"case": "a", "reason": "r", "device_fault": true}]'), "j")
    assert from_json.device_fault is True


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"device_fault": "yes"}, "field 'device_fault' must be true or false, found 'yes'"),
        ({"device_fault": True, "rule": "a/b"}, "field 'rule' does not go with device_fault = true"),
        ({"device_fault": True, "crash": True}, "crash = true and device_fault = true: a case ends one way"),
    ],
)
def test_bad_device_fault_entries_are_named(raw: dict[str, object], message: str, tmp_path: Path) -> None:
    with pytest.raises(KnownFailuresError, match=r"^src: entry 1: ") as info:
        parse_entries([{"case": "x", "reason": "r", **raw}], "src")
    assert message in str(info.value)
