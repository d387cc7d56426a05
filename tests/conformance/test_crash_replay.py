"""A generated call that kills the backend's process is a finding: the differential chapter, run as a user
runs it (pytest-xdist workers, the result file, the JUnit file), against a backend that segfaults on an
empty input (``tests/broken/crash.py``). The crash is found again in fresh processes, shrunk, recorded
``crashed`` under the crashing call's rule with a repro that crashes as printed; the other cases of the run
keep their outcomes; a ``crash = true`` entry naming that rule declares it, one naming another rule not."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BACKEND = "tests.broken.crash:SEGFAULTS_ON_EMPTY_INPUT"
CRASHING = "conformance/differential/test_differential.py::test_execute_calls_agree_with_the_oracle[cpu]"
NEIGHBOUR = "conformance/differential/test_differential.py::test_option_calls_agree_with_the_oracle"
RULE = "differential/missing-error"


def run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], str]:
    out = tmp_path / "results"
    command = [
        sys.executable, "-m", "pytest", "conformance/differential/test_differential.py",
        "-k", "(execute_calls and cpu) or option_calls", f"--backend={BACKEND}", "-n", "1",
        "-p", "harness.pytest_plugin", f"--results-json={out / 'r.json'}", f"--junitxml={out / 'j.xml'}",
        "-p", "no:cacheprovider", "--no-preflight", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    data = json.loads((out / "r.json").read_text(encoding="utf-8"))
    return done, data, (out / "j.xml").read_text(encoding="utf-8")


@pytest.mark.proof
def test_a_crash_is_found_again_shrunk_and_recorded_under_its_rule(tmp_path: Path) -> None:
    # An entry for another rule's crash does not declare this one.
    entry = f'case = "{CRASHING}"\ncrash = true\nrule = "differential/values"\nreason = "no"\n'
    (tmp_path / "other.toml").write_text(f"[[known_failures]]\n{entry}", encoding="utf-8")
    done, data, xml = run(tmp_path, f"--known-failures={tmp_path / 'other.toml'}")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    cases = {case["id"]: case for case in data["cases"]}
    assert cases[NEIGHBOUR]["outcome"] == "passed", output  # the rest of the run is unaffected
    crashed = cases[CRASHING]
    assert (crashed["outcome"], crashed["rule"], crashed["level"]) == ("crashed", RULE, "must"), crashed
    message = crashed["message"]
    assert "the process died (SIGSEGV) in execute(" in message
    assert "the oracle rejects this call (invalid-argument)" in message
    assert "shortest crashing sequence: 2 of 3 steps" in message, message
    assert "bad='empty-size'" in message
    assert crashed["repro"].endswith(".py"), crashed["repro"]
    # The repro, run as printed from the checkout, crashes the same way.
    replayed = subprocess.run(
        shlex.split(crashed["repro"]),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert replayed.returncode == -signal.SIGSEGV, replayed.stdout + replayed.stderr
    # Where a CI user looks: the terminal's failure and the JUnit entry say it, with the repro; the
    # headline names the crash's rule, and its chapter line counts it crashed, as the result file does.
    assert f"[{RULE}] crashed" in output
    assert f"    1  [{RULE}]" in output.split("failed rules: 1 (1 cases)")[1], output
    assert "0 error, 0 skipped, 1 crashed" in output, output
    assert f"repro: {crashed['repro']}" in output
    testcase = next(
        tc for tc in ET.fromstring(xml).iter("testcase") if tc.get("name") == CRASHING.split("::")[1]
    )
    assert f"repro: {crashed['repro']}" in ET.tostring(testcase, encoding="unicode")


@pytest.mark.proof
def test_a_crash_entry_naming_the_rule_declares_it(tmp_path: Path) -> None:
    (tmp_path / "known.toml").write_text(
        f'[[known_failures]]\ncase = "{CRASHING}"\ncrash = true\nrule = "{RULE}"\nreason = "reads an empty '
        'input"\n',
        encoding="utf-8",
    )
    done, data, _ = run(tmp_path, f"--known-failures={tmp_path / 'known.toml'}")
    assert done.returncode == 0, done.stdout + done.stderr
    cases = {case["id"]: case for case in data["cases"]}
    declared = cases[CRASHING]
    assert (declared["outcome"], declared["rule"]) == ("xfailed", RULE), declared
    assert declared["known_failure"]["crash"] is True
    assert "shortest crashing sequence" in declared["message"]
    assert declared["repro"].endswith(".py")
    # The terminal counts it as the result file does (pytest's own category for a dead worker is "failed";
    # a GPU run's console once said "1 failed" beside a result file's xfailed).
    output = done.stdout + done.stderr
    assert "failed rules:" not in output, output
    assert "repro commands" not in output, output
    chapter = next(line for line in output.splitlines() if line.startswith("differential: "))
    assert chapter.startswith("differential: 1 passed, 0 failed, 0 error, 0 skipped, 1 xfailed"), chapter


@pytest.mark.proof
def test_a_generated_mm_out_that_crashes_is_recorded_with_its_call(tmp_path: Path) -> None:
    """The steps of the mm_out case are functions of (backend, oracle): the same search finds them."""
    out = tmp_path / "results"
    command = [
        sys.executable, "-m", "pytest", "conformance/differential/test_differential.py",
        "-k", "mm_out and cpu",
        "--backend=tests.broken.crash:SEGFAULTS_ON_EMPTY_MATMUL", "-n", "1", "-p", "harness.pytest_plugin",
        f"--results-json={out / 'r.json'}", "-p", "no:cacheprovider", "--no-preflight",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    cases = {c["id"]: c for c in json.loads((out / "r.json").read_text(encoding="utf-8"))["cases"]}
    crashed = cases["conformance/differential/test_differential.py::test_mm_out_agrees_with_the_oracle[cpu]"]
    assert (crashed["outcome"], crashed["rule"]) == ("crashed", RULE), done.stdout + done.stderr
    assert "in mm_out(float32[0, 0]@cpu" in crashed["message"]
    assert (
        "conformance.differential.test_differential:mm_out_call(device='cpu', plan=MmOutPlan("
        in crashed["message"]
    )
    replayed = subprocess.run(shlex.split(crashed["repro"]), cwd=ROOT, capture_output=True, timeout=300)
    assert replayed.returncode == -signal.SIGSEGV
