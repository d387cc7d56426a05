"""What a new user meets first: a bad matrix cell is a usage error naming the valid ones, and leaves the
last result file alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
