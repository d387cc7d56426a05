"""What a new user meets first: a bad matrix cell is a usage error naming the valid ones, and leaves the
last result file alone."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from harness.results import load_results
from tests.harness.test_run_end import stop_halfway

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.proof
def test_unknown_dtype_is_a_usage_error_listing_the_cells(tmp_path: Path) -> None:
    results = tmp_path / "conformance.json"
    results.write_text("{}")  # the previous run's file
    cmd = [
        sys.executable, "-m", "pytest", "conformance/mm_out/test_mm_out.py", "--dtype=float64",
        "-p", "harness.pytest_plugin", f"--results-json={results}", "-p", "no:cacheprovider",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "invalid choice: 'float64'" in proc.stderr
    for cell in ("float32", "float16", "bfloat16", "independent"):
        assert cell in proc.stderr
    assert results.read_text() == "{}"


def test_reports_render_without_torch(tmp_path: Path) -> None:
    """`nox -s report` installs no torch (pyproject's `report` extra): both renderers must not need it."""
    from tests.dashboard_samples import sample_run, write_run

    result = write_run(tmp_path / "conformance.json", sample_run())
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "from reports.__main__ import main as summary; from reports.dashboard import main as dashboard\n"
        f"assert summary([{str(result)!r}, '-o', {str(tmp_path / 'page.html')!r}]) == 0\n"
        f"sys.exit(dashboard([{str(result)!r}, '--output', {str(tmp_path / 'site')!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "page.html").exists()
    assert (tmp_path / "site" / "index.html").exists()


def test_bench_on_cpu_states_each_skip_reason_once(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("on a GPU the suites run instead of skipping")
    cmd = [
        sys.executable,
        "-m",
        "harness.bench",
        "--quick",
        "--suite",
        "mm_out,threads",
        "--out",
        str(tmp_path / "b.json"),
        "--allow-empty",  # both suites need CUDA: nothing is measured here (without the flag: exit 1)
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("no CUDA device") == 1, proc.stdout + proc.stderr


def _repository_copy(target: Path) -> Path:
    """The tracked files (without the example runs): the front door writes results/ beside its noxfile."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in files:
        if name and not name.startswith("examples/") and (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


NEEDS_NOX = pytest.mark.skipif(
    importlib.util.find_spec("nox") is None, reason="nox is not installed (extra test)"
)
#: A matrix cell: the same front door as `nox -s conformance`, without the coverage table.
CELL, CELL_SESSION = "cell-lowering-independent", "conformance_cell(chapter='lowering', dtype='independent')"


def _cell_command(backend: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "nox", "-s", CELL_SESSION, "--no-venv", "--",
        "-k", "view_pass_verdicts", f"--backend=tests.broken.fault:{backend}", *extra,
    ]  # fmt: skip


def _assert_stopped_with_every_file(repo: Path, reason: str) -> list[str]:
    """The run's result file (incomplete, with ``reason``), a JUnit case per recorded case, the page."""
    run = load_results(repo / "results" / f"{CELL}.json")
    assert run.complete is False
    assert run.metadata["incomplete_reason"] == reason
    outcomes = [case.outcome for case in run.cases]
    assert set(outcomes) <= {"passed", "not-run"}
    junit = ET.parse(repo / "results" / f"{CELL}.junit.xml").getroot()
    assert len(list(junit.iter("testcase"))) == len(outcomes)
    page = (repo / "results" / f"{CELL}.html").read_text()
    assert "Incomplete run" in page
    assert reason in page
    assert "Where the time went" in page  # the phases are stored before the page is rendered (issue 48)
    return outcomes


@NEEDS_NOX
@pytest.mark.proof
def test_sigterm_halfway_through_the_front_door_still_writes_every_file_and_the_page(tmp_path: Path) -> None:
    """As a CI system cancels a job: SIGTERM to the whole process group (nox, pytest, its workers) while
    the cases run. nox gives pytest the time to write its files, renders the page and exits 143."""
    repo = _repository_copy(tmp_path / "repo")
    journal = repo / "results" / f"{CELL}.json.journal.jsonl"
    env = {**os.environ, "PYTHONPATH": str(repo), "CONFORMANCE_PRELOWER": "0"}
    code, output = stop_halfway(_cell_command("SLOW_VIEW_PASS"), repo, env, journal, 4, signal.SIGTERM, 240)
    assert code == 143, output
    outcomes = _assert_stopped_with_every_file(repo, "the run was stopped by SIGTERM")
    assert outcomes.count("passed") >= 4
    assert "not-run" in outcomes


@NEEDS_NOX
@pytest.mark.proof
def test_the_front_door_ends_at_its_deadline_with_every_file_and_the_page(tmp_path: Path) -> None:
    """`-- --run-deadline 40`: the phase gets what is left of it (less the page's share), pytest ends at
    that, and the front door writes the page and exits 124, though the cases would take over 50 s."""
    repo = _repository_copy(tmp_path / "repo")
    env = {**os.environ, "PYTHONPATH": str(repo), "CONFORMANCE_PRELOWER": "0"}
    start = time.monotonic()
    cmd = _cell_command("SLOWER_VIEW_PASS", "--run-deadline", "40")
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=240)
    wall = time.monotonic() - start
    assert proc.returncode == 124, proc.stdout + proc.stderr
    run = load_results(repo / "results" / f"{CELL}.json")
    assert run.metadata["incomplete_reason"].startswith("the run deadline (--run-deadline ")
    _assert_stopped_with_every_file(repo, run.metadata["incomplete_reason"])
    # pytest itself ended at its share (the reason above: the front door's backstop would have recorded a
    # SIGTERM), before every case ran (they need 52 s on two workers). No bound on the phase's own wall time:
    # on a loaded CI machine, importing torch and starting workers before a held stop can end the session
    # takes tens of seconds (68 s seen under `pytest tests -n 3` on 2 cores), and that is not the hazard.
    assert [case.outcome for case in run.cases].count("passed") < 52, run.metadata["phases"]
    assert wall < 40 + 90, f"the front door took {wall:.0f} s"
