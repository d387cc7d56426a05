"""What a new user meets first: a bad matrix cell is a usage error naming the valid ones, and leaves the
last result file alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_unknown_dtype_is_a_usage_error_listing_the_cells(tmp_path: Path) -> None:
    results = tmp_path / "conformance.json"
    results.write_text("{}")  # the previous run's file
    cmd = [
        sys.executable, "-m", "pytest", "conformance/test_mm_out.py", "--dtype=float64",
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
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("no CUDA device") == 1, proc.stdout + proc.stderr
