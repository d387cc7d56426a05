"""One bug, one headline (issue 48, item 1, for the bug it names): a backend whose ``execute`` writes its
result into the caller's first input fails, in every chapter, under the contract monitor's inputs rule, so the
run's failed-rules headline opens with the cause, not with the chapters' consequences (before the monitor
the same backend failed 76 cases under 37 rules, the list opening with ``program_format/flipped-byte``)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = (
    "conformance/program_format/test_program_format.py",
    "conformance/multi_method/test_multi_method.py",
    "conformance/bad_inputs/test_bad_inputs.py",
)


@pytest.mark.proof
def test_a_backend_writing_into_its_inputs_is_headlined_by_the_inputs_rule(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "pytest", *CHAPTERS, "-k", "cpu", "-q", "-p", "no:cacheprovider",
        "--no-preflight", "--backend", "tests.broken.contract:WRITES_RESULT_INTO_INPUTS",
        f"--basetemp={tmp_path / 'base'}", "-p", "harness.pytest_plugin",
        f"--results-json={tmp_path / 'r.json'}", f"--junitxml={tmp_path / 'r.xml'}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "failed rules:" in line)
    assert "[contract/inputs-untouched]" in lines[start + 1], "\n".join(lines[start : start + 5])
    # The JUnit file and the page the run writes open with the same cause.
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["likely-cause"].startswith("likely cause: [contract/inputs-untouched]"), properties
    page = tmp_path / "r.html"
    render = [sys.executable, "-m", "reports", str(tmp_path / "r.json"), "-o", str(page)]
    subprocess.run(render, cwd=ROOT, check=True, capture_output=True, timeout=120)
    html = page.read_text()
    assert 'Likely cause: <span class="mono">[contract/inputs-untouched]</span>' in html
    assert html.index('id="likely-cause"') < html.index("<h2>Environment</h2>")
