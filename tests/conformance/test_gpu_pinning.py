"""One xdist worker per GPU: each worker is pinned with CUDA_VISIBLE_DEVICES before CUDA starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.conftest import WORKER_GPUS_ENV, worker_gpu

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import os, pathlib
import pytest

@pytest.mark.parametrize("i", range(6))
def test_probe(i):
    out = pathlib.Path(os.environ["PROBE_DIR"]) / f"{os.environ['PYTEST_XDIST_WORKER']}-{i}"
    out.write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
"""


def test_worker_n_takes_gpu_n_round_robin() -> None:
    assert [worker_gpu(f"gw{i}", ["3", "7"]) for i in range(4)] == ["3", "7", "3", "7"]
    assert worker_gpu("gw0", ["GPU-abc"]) == "GPU-abc"


@pytest.mark.proof
def test_xdist_workers_are_pinned_and_the_mapping_is_recorded(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    results = tmp_path / "results.json"
    env = {**os.environ, WORKER_GPUS_ENV: "3,7", "PROBE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTEST_XDIST_WORKER"] = "gw5"  # as inherited when the self-tests themselves run under xdist
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_probe.py"), "-p", "conformance.conftest",
         "-p", "harness.pytest_plugin", f"--results-json={results}", "-n", "2", "-q",
         "-p", "no:cacheprovider", f"--rootdir={tmp_path}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = {p.name.split("-")[0]: p.read_text() for p in tmp_path.glob("gw*-*")}
    assert seen == {"gw0": "3", "gw1": "7"}
    metadata = json.loads(results.read_text())["metadata"]
    assert metadata["worker_gpus"] == {"gw0": "3", "gw1": "7"}
