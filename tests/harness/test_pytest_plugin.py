"""The results plugin, exercised through real inner pytest sessions (pytester, in subprocesses)."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.environment import capture_environment, cpu_model, nvidia_driver_version, suite_commit
from harness.finalize import main as finalize_main
from harness.pytest_plugin import chapter_of, repro_command, stringify_param
from harness.results import load_results

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[2]

MIXED_TESTS = """
import pytest

@pytest.mark.parametrize("shape", [(257, 129, 65)])
@pytest.mark.parametrize("mode", ["fast", "slow"])
def test_param(mode, shape):
    assert mode == "fast", "slow mode is not fast"

def test_skip():
    pytest.skip("no CUDA device is present")

@pytest.mark.skipif(True, reason="needs two GPUs")
def test_skipif():
    pass

@pytest.fixture
def broken_setup():
    raise RuntimeError("setup exploded")

def test_setup_error(broken_setup):
    pass

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown exploded")

def test_teardown_error(broken_teardown):
    pass

@pytest.mark.xfail(reason="known bug 12", strict=False)
def test_xfail():
    assert False

@pytest.mark.xfail(reason="fixed already", strict=False)
def test_xpass():
    pass
"""

METADATA_CONFTEST = """
from harness.pytest_plugin import add_run_metadata

def pytest_configure(config):
    add_run_metadata(config, "backend", {"name": "toy", "version": "0.1", "spec": "toy:BACKEND"})
    add_run_metadata(config, "repro_args", ["--backend", "toy:BACKEND"])
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose subprocesses can import the repository's packages."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    return pytester


def run_inner(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, Path]:
    results = pytester.path / "out" / "results.json"
    outcome = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "harness.pytest_plugin", "--results-json", str(results), *args
    )
    return outcome, results


def cases_by_name(path: Path) -> dict[str, dict[str, Any]]:
    data = json.loads(path.read_text())
    return {case["id"].split("::", 1)[1]: case for case in data["cases"]}


@pytest.mark.proof
def test_records_every_outcome_with_params_and_repro(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_mm_out=MIXED_TESTS)
    inner.makeconftest(METADATA_CONFTEST)
    junit = inner.path / "junit.xml"
    outcome, results = run_inner(inner, f"--junitxml={junit}")

    data = json.loads(results.read_text())
    assert data["complete"] is True
    assert data["finished_at"]
    assert data["metadata"]["backend"]["name"] == "toy"
    assert "torch" in data["environment"]
    cases = cases_by_name(results)
    assert {name: case["outcome"] for name, case in cases.items()} == {
        "test_param[fast-shape0]": "passed",
        "test_param[slow-shape0]": "failed",
        "test_skip": "skipped",
        "test_skipif": "skipped",
        "test_setup_error": "error",
        "test_teardown_error": "error",
        "test_xfail": "xfailed",
        "test_xpass": "xpassed",
    }
    failed = cases["test_param[slow-shape0]"]
    assert failed["params"] == {"mode": "slow", "shape": "257x129x65"}
    assert failed["chapter"] == "mm_out"
    assert "slow mode is not fast" in failed["message"]
    assert failed["worker"] is None
    assert failed["repro"] == (
        "python -m pytest 'test_mm_out.py::test_param[slow-shape0]' --backend toy:BACKEND"
    )
    assert cases["test_skip"]["message"] == "no CUDA device is present"
    assert cases["test_skipif"]["message"] == "needs two GPUs"
    assert "setup exploded" in cases["test_setup_error"]["message"]
    assert "teardown exploded" in cases["test_teardown_error"]["message"]
    assert cases["test_xfail"]["message"] == "known bug 12"
    assert all(case["duration_s"] >= 0 for case in cases.values())
    # Each case's start, from the run's start: in file order, so a worker's timeline can be drawn.
    starts = [cases[name]["started_s"] for name in ("test_param[fast-shape0]", "test_skip", "test_xpass")]
    assert all(isinstance(s, float) and s >= 0 for s in starts)
    assert starts == sorted(starts)
    # Where the session's wall went: its start, its cases' window and its final write (no xdist workers).
    line = data["metadata"]["timeline"]
    assert line["workers_done"] is None
    stamps = [line[k] for k in ("session_start", "first_case", "last_case_end", "final_write")]
    assert stamps == sorted(stamps), line
    assert line["first_case"] - line["session_start"] <= starts[0] + 0.01

    outcome.stdout.fnmatch_lines([f"results: {results} (1 passed, 1 failed, 2 skipped, 0 crashed, *"])
    assert not Path(str(results) + ".journal.jsonl").exists()
    # The params also travel as user properties, so JUnit XML carries them.
    assert '<property name="param:shape" value="257x129x65" />' in junit.read_text()
    # A failed case's repro, with its --backend, in the JUnit file and the terminal (issue 48, item 3).
    reproes = [p.get("value") for p in ET.parse(junit).getroot().iter("property") if p.get("name") == "repro"]
    assert failed["repro"] in reproes
    printed = outcome.stdout.str()
    assert "repro commands (2 failed)" in printed, printed
    assert failed["repro"] in printed.split("repro commands (2 failed)")[1]


@pytest.mark.proof
def test_crash_under_xdist_is_recorded_and_the_rest_still_lands(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        test_streams="""
        import ctypes, pytest

        def test_before():
            pass

        @pytest.mark.parametrize("threads", [4])
        def test_segfault(threads):
            ctypes.string_at(0)

        def test_after():
            assert 1 == 2
        """
    )
    outcome, results = run_inner(inner, "-n", "1")
    cases = cases_by_name(results)
    assert {name: case["outcome"] for name, case in cases.items()} == {
        "test_before": "passed",
        "test_segfault[4]": "crashed",
        "test_after": "failed",
    }
    crashed = cases["test_segfault[4]"]
    assert re.fullmatch(
        r"worker 'gw\d+' crashed while running 'test_streams.py::test_segfault\[4\]'", crashed["message"]
    )
    assert crashed["params"] == {"threads": "4"}  # from the setup report that arrived before the crash
    assert crashed["chapter"] == "streams"
    assert crashed["worker"] == "gw0"
    assert cases["test_after"]["worker"] not in (None, "gw0")  # ran on the replacement worker
    assert json.loads(results.read_text())["complete"] is True
    outcome.stdout.fnmatch_lines(["results: * (1 passed, 1 failed, 0 skipped, 1 crashed)"])


@pytest.mark.proof
def test_killed_run_leaves_a_readable_journal(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        test_runtime="""
        import os

        def test_first():
            pass

        def test_dies():
            os._exit(3)

        def test_never():
            pass
        """
    )
    outcome, results = run_inner(inner, "--repro-prefix", "nox -s conformance --")
    assert outcome.ret == 3
    assert not results.exists()
    run = load_results(results)
    assert run.complete is False
    # The journal lists what the run collected: what has no result is not-run, never silently absent.
    assert [(case.id, case.outcome) for case in run.cases] == [
        ("test_runtime.py::test_first", "passed"),
        ("test_runtime.py::test_dies", "not-run"),
        ("test_runtime.py::test_never", "not-run"),
    ]
    assert run.cases[0].repro == "nox -s conformance -- test_runtime.py::test_first"
    assert "ended before this case ended" in run.cases[2].message
    # harness.finalize (the front door runs it) writes the files; the watchdog's files name the case
    # that was running when the process died.
    junit = results.with_suffix(".junit.xml")
    assert finalize_main([str(results), f"--junit={junit}"]) == 0
    final = load_results(results)
    assert final.complete is False
    assert [case.outcome for case in final.cases] == ["passed", "crashed", "not-run"]
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"test_first", "test_dies", "test_never"}
    assert cases["test_dies"].find("failure") is not None
    assert cases["test_never"].find("skipped").get("message").startswith("not-run: ")


@pytest.mark.proof
def test_interrupted_run_is_written_as_incomplete(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        test_runtime="""
        def test_first():
            pass

        def test_interrupt():
            raise KeyboardInterrupt

        def test_never():
            pass
        """
    )
    outcome, results = run_inner(inner)
    assert outcome.ret == pytest.ExitCode.INTERRUPTED
    run = load_results(results)
    assert run.complete is False
    assert run.metadata["incomplete_reason"] == "interrupted"
    assert run.cases[0].outcome == "passed"
    # The rest is not-run, with why: the case that raised, and the one never started.
    outcomes = {case.id: (case.outcome, case.message) for case in run.cases}
    assert outcomes["test_runtime.py::test_interrupt"] == (
        "not-run",
        "not run: the run was interrupted (while this case was running)",
    )
    assert outcomes["test_runtime.py::test_never"] == (
        "not-run",
        "not run: the run was interrupted (before this case started)",
    )


@pytest.mark.proof
def test_collection_error_is_recorded(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_lowering="import no_such_module_anywhere\n")
    _, results = run_inner(inner)
    run = load_results(results)
    assert [(case.id, case.chapter, case.outcome) for case in run.cases] == [
        ("test_lowering.py", "lowering", "error")
    ]
    assert "no_such_module_anywhere" in run.cases[0].message
    assert run.complete is False


@pytest.mark.proof
def test_without_option_nothing_is_written(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_one="def test_ok():\n    pass\n")
    outcome = inner.runpytest_subprocess("-p", "no:cacheprovider", "-p", "harness.pytest_plugin")
    outcome.assert_outcomes(passed=1)
    assert "results:" not in outcome.stdout.str()
    assert [p.name for p in inner.path.iterdir() if p.suffix in (".json", ".jsonl")] == []


# ---------------------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("nodeid", "chapter"),
    [
        ("conformance/mm_out/test_mm_out.py::test_x[a-b]", "mm_out"),
        ("conformance/streams_threads/test_streams_threads.py::TestX::test_y", "streams_threads"),
        ("tests/helpers.py::test_z", "helpers"),
        ("test_lowering.py", "lowering"),
    ],
)
def test_chapter_of(nodeid: str, chapter: str) -> None:
    assert chapter_of(nodeid) == chapter


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (torch.float16, "float16"),
        (torch.bfloat16, "bfloat16"),
        ((257, 129, 65), "257x129x65"),
        (0, "0"),
        ("fp32", "fp32"),
        (None, "None"),
        ((), "()"),
    ],
)
def test_stringify_param(value: object, text: str) -> None:
    assert stringify_param(value) == text


def test_repro_command_quotes() -> None:
    assert repro_command("python -m pytest", "t.py::test[a b]", ["--backend", "x y:z"]) == (
        "python -m pytest 't.py::test[a b]' --backend 'x y:z'"
    )


def test_capture_environment_without_gpu_is_json() -> None:
    env = capture_environment()
    json.dumps(env)
    for key in (
        "python",
        "platform",
        "hostname",
        "cpu",
        "torch",
        "torch_cuda",
        "cuda_available",
        "gpus",
        "driver_version",
        "env",
    ):
        assert key in env
    assert set(env["env"]) == {"CUDA_VISIBLE_DEVICES", "CXX"}
    assert 1 <= env["usable_cores"] <= env["cpu_count"]
    assert ("cores_bound_by" in env) == (env["usable_cores"] < env["cpu_count"])
    if not torch.cuda.is_available():
        assert env["gpus"] == []
        assert env["cuda_available"] is False


def test_the_suite_commit_is_its_checkouts_head_and_says_when_it_was_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "f.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    done = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    head = done.stdout.strip()
    assert suite_commit(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("results of a run")  # results/ and the like: not a change
    assert suite_commit(tmp_path) == head
    (tmp_path / "f.py").write_text("x = 2\n")
    assert suite_commit(tmp_path) == f"{head}+changes"
    copied = tmp_path / "copied"  # a tree copied without its history (a GPU machine's copy, an install)
    copied.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find tmp_path's repository
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    assert suite_commit(copied) is None
    monkeypatch.setenv("GITHUB_SHA", "abc123")
    assert suite_commit(copied) == "abc123"
    assert "suite_commit" in capture_environment()


def test_driver_version_never_raises() -> None:
    assert isinstance(nvidia_driver_version(), str)


def test_cpu_model_reads_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Imaginary CPU 9000\n")
    assert cpu_model(info) == "Imaginary CPU 9000"
    assert cpu_model(tmp_path / "missing")  # falls back to the platform, never raises


@pytest.mark.proof
def test_the_exit_status_follows_the_recorded_outcomes(inner: pytest.Pytester) -> None:
    """A report pytest counted as failed whose case a later verdict declares (a known device fault is
    ``xfailed``) leaves the run green, as its result file says; an undeclared failure still fails it."""
    inner.makeconftest(
        """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "declared" in item.name:
        report.case_result = {"outcome": "xfailed", "message": "a known device fault"}
"""
    )
    inner.makepyfile(test_one="def test_declared():\n    assert 0\n\ndef test_ok():\n    pass\n")
    outcome, results = run_inner(inner)
    assert outcome.ret == 0, outcome.stdout.str()
    assert cases_by_name(results)["test_declared"]["outcome"] == "xfailed"
    inner.makepyfile(test_two="def test_broken():\n    assert 0\n")
    outcome, results = run_inner(inner)
    assert outcome.ret == 1
    assert cases_by_name(results)["test_broken"]["outcome"] == "failed"
