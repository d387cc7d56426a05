"""Sharding the matrix over several CI runners, with processes standing in for the runners.

Each "runner" is its own checkout with its own ``results/`` and ``$CONFORMANCE_CACHE_DIR`` (and its own
``$CXX``, an environment the other runner does not share) and runs one matrix cell through the real front
door, ``nox -s conformance_cell(...)``, with one ``$CONFORMANCE_RUN_ID`` for both, as
``examples/ci/github-actions-sharded.yml`` does. Their files are gathered into one folder, as the
workflow's download step does, and ``nox -s report`` renders them: one run, one page, every case with the
outcome one unsharded run of the same selection gives it, and each runner's environment kept.

The selection is tiny on purpose (cases that compile nothing, ``--no-preflight``): what is tested is the
plumbing, not the chapters.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import load_results, write_results
from reports.history import run_slug
from reports.inputs import load_inputs
from reports.page_run import environment_facts, shard_views
from tests.dashboard_samples import sample_run
from tests.project.test_front_door import _repository_copy

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "20261201T120000Z-gh4242"
#: (runner, chapter, $CXX): two cells of the matrix, on two runners that differ in their environment.
RUNNERS = [("runner-a", "lowering", "g++"), ("runner-b", "differential", "c++")]
DTYPE = "independent"
#: Cases of both chapters that take seconds on a CPU and compile nothing (no artifact cache needed), in one
#: process per cell (``-n 0`` overrides the front door's two workers: each would import torch again).
NARROW = [
    "-k",
    "(view_pass_verdicts and every-view-twin) or option_calls or generated_report",
    "--no-preflight",
]
NARROW += ["-n", "0"]


def _env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "CONFORMANCE_PRELOWER": "0"}
    env.pop("CONFORMANCE_RUN_ID", None)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_a_shard_gathered_twice_is_named_in_a_notice(tmp_path: Path) -> None:
    """Cells' files have distinct names, so gathering them into one folder loses nothing; but the same
    shard arriving twice (two folders, a re-run's copy) would count its cases twice: the report says so."""
    run = sample_run()
    for folder in ("first", "second"):
        write_results(tmp_path / folder / "cell-mm_out-float32.json", run)
    inputs = load_inputs([tmp_path / "first", tmp_path / "second"])
    assert len(inputs.runs) == 1
    (notice,) = [n for n in inputs.notices if "the same shard gathered twice" in n]
    assert f"record the same {len(run.cases)} case(s)" in notice
    assert "first" in notice
    assert "second" in notice
    assert not [n for n in load_inputs([tmp_path / "first"]).notices if "gathered twice" in n]


def test_each_shard_keeps_the_environment_of_its_runner(tmp_path: Path) -> None:
    """Cells from runners with another torch or driver: the run's facts are those all shards share, and
    the shard table names what each has of its own, so no runner's environment is lost or misattributed."""
    first = sample_run(host="runner-a", hostile=False, run_id=RUN_ID)
    second = sample_run(host="runner-b", hostile=False, run_id=RUN_ID)
    second.environment = {**second.environment, "torch": "2.12.0+cu128", "driver_version": "575.57.08"}
    second.cases = [dataclasses.replace(case, id=case.id + "-b") for case in second.cases]
    write_results(tmp_path / "cell-a.json", first)
    write_results(tmp_path / "cell-b.json", second)
    (loaded,) = load_inputs([tmp_path]).runs
    facts = dict(environment_facts(loaded.run))
    assert "torch" not in facts
    assert "Driver" not in facts
    assert facts["Host"] == "runner-a, runner-b"
    assert facts["Python"] == "3.12.3 CPython"  # what they share is still said once
    own = [shard.own for shard in shard_views(loaded)]
    assert own == ["Driver 580.65.06; torch 2.13.0+cu130", "Driver 575.57.08; torch 2.12.0+cu128"]


@pytest.mark.skipif(importlib.util.find_spec("nox") is None, reason="nox is not installed (extra test)")
@pytest.mark.proof
def test_cells_on_two_runners_merge_into_one_run_equal_to_an_unsharded_one(tmp_path: Path) -> None:
    started = []
    for runner, chapter, cxx in RUNNERS:
        repo = _repository_copy(tmp_path / runner)
        session = f"conformance_cell(chapter='{chapter}', dtype='{DTYPE}')"
        cmd = [sys.executable, "-m", "nox", "-s", session, "--no-venv", "--", *NARROW]
        env = _env(
            PYTHONPATH=str(repo),
            CONFORMANCE_RUN_ID=RUN_ID,
            CONFORMANCE_CACHE_DIR=str(tmp_path / f"{runner}-cache"),
            CXX=cxx,
        )
        log = open(tmp_path / f"{runner}.log", "w")  # noqa: SIM115 - closed once the process ends
        started.append((runner, repo, log, subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=log)))
    # One unsharded run of the same selection, beside them: the cases the two cells would run together.
    unsharded = tmp_path / "unsharded.json"
    chapters = [f"conformance/{chapter}/test_{chapter}.py" for _, chapter, _ in RUNNERS]
    cmd = [sys.executable, "-m", "pytest", *chapters, f"--dtype={DTYPE}", *NARROW, "-p", "no:cacheprovider",
           "-p", "harness.pytest_plugin", f"--results-json={unsharded}"]  # fmt: skip
    env = _env(PYTHONPATH=str(ROOT), CONFORMANCE_CACHE_DIR=str(tmp_path / "unsharded-cache"))
    single = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    gathered = tmp_path / "gathered"  # the report job's one folder (download-artifact, merge-multiple)
    gathered.mkdir()
    for runner, repo, log, process in started:
        code = process.wait(timeout=300)
        log.close()
        assert code == 0, (tmp_path / f"{runner}.log").read_text()[-4000:]
        for path in (repo / "results").glob("*.json"):
            assert not (gathered / path.name).exists(), f"{path.name}: two runners wrote the same file name"
            shutil.copy2(path, gathered / path.name)
    assert single.returncode == 0, single.stdout + single.stderr

    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "report", "--no-venv",
           "--", str(gathered), "--output", str(site)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 run(s)" in proc.stdout + proc.stderr

    # One run page, the shared run id's, naming both runners' files.
    pages = sorted((site / "runs").glob("*.html"))
    assert [p.name for p in pages] == [f"{run_slug(RUN_ID)}.html"]
    page = pages[0].read_text()
    for _, chapter, cxx in RUNNERS:
        assert f"cell-{chapter}-{DTYPE}.json" in page
        assert f"<td>$CXX {cxx}</td>" in page  # the shard table: what each runner has of its own

    # The merged run: every case as the unsharded run has it, each runner's environment kept.
    inputs = load_inputs([gathered])
    assert not inputs.errors
    assert not inputs.notices
    (merged,) = inputs.runs
    assert merged.run.run_id == RUN_ID
    shards = [load_results(source) for source in merged.sources]
    assert {shard.run_id for shard in shards} == {RUN_ID}
    expected = {case.id: case.outcome for case in load_results(unsharded).cases}
    got = {case.id: case.outcome for case in merged.run.cases}
    assert len(got) == len(merged.run.cases), "a case was recorded twice"
    assert got == expected
    assert {chapter for _, chapter, _ in RUNNERS} <= {case.chapter for case in merged.run.cases}
    assert merged.run.environment["shards"] == [shard.environment for shard in shards]
    cxx = {shard.environment["env"]["CXX"] for shard in shards}
    assert cxx == {cxx for _, _, cxx in RUNNERS}
    assert "CXX" not in merged.run.environment.get("env", {}), "runners' differing $CXX merged into one"
