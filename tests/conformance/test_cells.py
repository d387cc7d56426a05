"""The nox matrix offers exactly the cells that select cases: what ``conformance/suite/cells.py`` reads from
the source agrees with what pytest collects for each ``--dtype`` cell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.suite.cells import DTYPE_CELLS, INDEPENDENT, matrix_cells

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cell", [*DTYPE_CELLS, INDEPENDENT])
@pytest.mark.proof
def test_static_cells_match_what_pytest_collects(cell: str) -> None:
    cmd = [sys.executable, "-m", "pytest", "conformance", "--collect-only", "-q", f"--dtype={cell}",
           "-p", "no:cacheprovider"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    ids = [line for line in proc.stdout.splitlines() if line.startswith("conformance/") and "::" in line]
    collected = {case_id.split("/")[1] for case_id in ids}  # conformance/<chapter>/test_<chapter>.py::...
    assert collected == {chapter for chapter, c in matrix_cells() if c == cell}


def test_chapters_without_dtype_cases_have_only_the_independent_cell() -> None:
    cells = matrix_cells()
    assert ("program_format", INDEPENDENT) in cells
    assert not any(chapter == "program_format" and c in DTYPE_CELLS for chapter, c in cells)
    assert ("mm_out", "float16") in cells
