"""The suite must fail a backend that breaks a rule, naming the rule; and pass the reference backend.

Each case runs the real mm_out chapter in a subprocess against a backend picked with --backend, exactly as a
user would, and reads the verdict back from the result file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.results import RunResult, load_results

ROOT = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for this chapter")


def run_chapter(tmp_path: Path, backend: str, *select: str) -> tuple[int, RunResult, str]:
    results = tmp_path / "results.json"
    cmd = [
        sys.executable, "-m", "pytest", "conformance/test_mm_out.py", *select,
        f"--backend={backend}", "-p", "harness.pytest_plugin", f"--results-json={results}",
        "-q", "-p", "no:cacheprovider",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    return proc.returncode, load_results(results), proc.stdout + proc.stderr


def failures(run: RunResult) -> dict[str, str]:
    return {case.id: case.message for case in run.cases if case.outcome == "failed"}


def test_reference_backend_passes_what_this_machine_can_run(tmp_path: Path) -> None:
    code, run, output = run_chapter(tmp_path, "reference_impl:BACKEND")
    assert code == 0, output
    assert failures(run) == {}
    assert any(case.outcome == "passed" for case in run.cases)
    assert run.metadata["backend"]["name"] == "reference_impl"


def test_backend_accepting_cpu_tensors_fails_the_cuda_device_rule(tmp_path: Path) -> None:
    """Runs without a GPU: upstream's missing device-type check is caught on any machine."""
    code, run, output = run_chapter(tmp_path, "tests.broken_backends:ACCEPTS_CPU_TENSORS")
    assert code == 1, output
    failed = failures(run)
    assert list(failed) == ["conformance/test_mm_out.py::test_cpu_tensors_are_rejected"], failed
    message = next(iter(failed.values()))
    assert "[mm_out/cuda-device]" in message
    assert "the call succeeded" in message


def test_backend_without_mm_out_is_skipped_with_the_reason(tmp_path: Path) -> None:
    code, run, output = run_chapter(tmp_path, "tests.broken_backends:NO_PARTS")
    assert code == 0, output
    assert {case.outcome for case in run.cases} == {"skipped"}
    if not torch.cuda.is_available():
        return  # GPU cases are skipped for want of a GPU before the part is even looked at
    assert all("does not implement protocol part 'mm_out'" in case.message for case in run.cases)


@pytest.mark.gpu
@needs_cuda
def test_backend_accepting_dtype_mismatch_fails_the_dtype_rules(tmp_path: Path) -> None:
    code, run, output = run_chapter(
        tmp_path, "tests.broken_backends:ACCEPTS_DTYPE_MISMATCH", "-k", "bad_input"
    )
    assert code == 1, output
    failed = failures(run)
    assert set(failed) == {
        "conformance/test_mm_out.py::test_bad_input_is_rejected_and_out_untouched[dtype-mismatch-mat2]"
    }, failed
    message = next(iter(failed.values()))
    assert "[mm_out/dtype-mismatch-mat2]" in message
    assert "the call succeeded" in message
