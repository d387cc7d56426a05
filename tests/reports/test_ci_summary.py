"""Where a reviewer looks first (issue 50 item 3): the job summary and the annotations, rendered from a
recorded GPU run, and the workflow's own step run as written (its command, ``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

import dataclasses
import gzip
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.outcomes import Outcome
from harness.results import load_results, write_results
from reports.ci_summary import annotations, summary_markdown

ROOT = Path(__file__).resolve().parents[2]
#: A whole matrix of the reference on one H100, every case passed or skipped.
RECORDED = (
    ROOT
    / "examples"
    / "runs"
    / "2026-11-27-protocol-shards"
    / "h100-8b9d829"
    / "cold"
    / "conformance.json.gz"
)
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-conformance.yml"
BROKEN = (
    "conformance/test_bad_inputs.py::"
    "test_bad_inputs_are_rejected_and_change_nothing[one-input-more-cuda-program]"
)


def recorded(tmp_path: Path, *, broken: bool) -> Path:
    """The recorded run under ``tmp_path/results/``; ``broken``: two of its cases failed, one under the
    contract monitor's inputs rule, one after it in the same worker."""
    results = tmp_path / "results"
    results.mkdir()
    path = results / "conformance.json"
    path.write_bytes(gzip.decompress(RECORDED.read_bytes()))
    if broken:
        run = load_results(path)
        cases = {case.id: i for i, case in enumerate(run.cases)}
        first = run.cases[cases[BROKEN]]
        later = next(
            c for c in run.cases if c.worker == first.worker and (c.started_s or 0) > (first.started_s or 0)
        )
        for case, rule in ((first, "contract/inputs-untouched"), (later, "program_format/flipped-byte")):
            changed = dataclasses.replace(
                case, outcome=Outcome.FAILED, rule=rule, level="must", message=f"[{rule}] it broke\nmore"
            )
            run.cases[cases[case.id]] = changed
        write_results(path, run)
    return path


def test_a_green_run_says_so_with_its_chapters_and_slowest_cases(tmp_path: Path) -> None:
    run = load_results(recorded(tmp_path, broken=False))
    text = summary_markdown(run, page_url="https://example.invalid/run")
    assert text.startswith(
        "## Conformance: reference_impl 0.1.0 (reference_impl:BACKEND) — ✅ no failing case"
    )
    assert "| mm_out | 294 | 0 | 0 | 4 |" in text
    assert "### Slowest cases" in text
    assert "[The run's page](https://example.invalid/run)" in text
    assert "likely cause" not in text
    assert annotations(run) == []


def test_a_red_run_opens_with_its_likely_cause_and_annotates_each_failure(tmp_path: Path) -> None:
    run = load_results(recorded(tmp_path, broken=True))
    text = summary_markdown(run)
    assert "❌ 2 failing" in text.splitlines()[0]
    assert "**likely cause: [contract/inputs-untouched] (2 of 2 failures)**" in text
    assert (
        f"- `[contract/inputs-untouched]` `{BROKEN}` (failed): [contract/inputs-untouched] it broke" in text
    )
    commands = annotations(run)
    assert len(commands) == 2
    assert commands[0].startswith(
        "::error file=conformance/test_bad_inputs.py,title=[contract/inputs-untouched] failed::" + BROKEN
    )
    assert "%0Arepro: " in commands[0]
    assert "\n" not in commands[0]


def _step_command() -> str:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml reads the workflow (the test extra has it)")
    workflow = yaml.YAML(typ="safe").load(WORKFLOW.read_text())
    step = next(s for s in workflow["jobs"]["gpu"]["steps"] if s.get("name") == "Job summary and annotations")
    return str(step["run"])


@pytest.mark.parametrize("with_baseline", [False, True])
def test_the_workflows_step_runs_as_written(tmp_path: Path, with_baseline: bool) -> None:
    """The step's own command, with GitHub's expressions filled in as a runner would: the summary lands in
    ``$GITHUB_STEP_SUMMARY``, the annotations on stdout; a missing baseline folder (a first run) is none."""
    recorded(tmp_path, broken=True)
    if with_baseline:
        (tmp_path / "baseline").mkdir()
        (tmp_path / "baseline" / "conformance.json").write_bytes(gzip.decompress(RECORDED.read_bytes()))
    command = _step_command()
    for expression, value in {
        "${{ github.server_url }}": "https://github.com",
        "${{ github.repository }}": "o/r",
        "${{ github.run_id }}": "7",
    }.items():
        command = command.replace(expression, value)
    summary = tmp_path / "summary.md"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", "-e", "-c", command.replace("python3 ", f"{shlex.quote(sys.executable)} ", 1)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("::error file=") == 2, done.stdout
    text = summary.read_text()
    assert "likely cause: [contract/inputs-untouched]" in text
    assert "[The run's page](https://github.com/o/r/actions/runs/7)" in text
    assert ("Against the baseline" in text) == with_baseline
