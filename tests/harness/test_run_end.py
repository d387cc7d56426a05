"""Hangs, device faults, the deadline and signals in real inner pytest runs (harness/watchdog.py,
harness/run_end.py, harness/run_control.py): each ends the run or the case as documented, names the case
with its evidence, and leaves the result file and JUnit complete. The inner tests import no torch, so a
run takes seconds; tests/harness/test_fault_robustness.py does the same through the suite's own chapters."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.finalize import main as finalize_main
from harness.results import CaseResult, RunResult, load_results
from harness.run_control import EXIT_DEADLINE, EXIT_SIGINT, EXIT_SIGTERM, EXIT_STOPPED_BY_FAULT
from reports.summary import render_summary

ROOT = Path(__file__).resolve().parents[2]

HANGS = """
import ctypes, threading

def test_first():
    pass

def test_hangs_in_python():
    threading.Event().wait()

def test_hangs_holding_the_gil():
    mutex = ctypes.create_string_buffer(64)
    ctypes.CDLL(None).pthread_mutex_lock(mutex)
    ctypes.PyDLL(None).pthread_mutex_lock(mutex)  # keeps the GIL: no Python thread runs again

def test_fails():
    assert 1 == 2

def test_last():
    pass
"""

STUCK_IN_C = """
import ctypes, threading

def test_first():
    pass

def test_hangs():
    if {python}:
        threading.Event().wait()
    mutex = ctypes.create_string_buffer(64)
    ctypes.CDLL(None).pthread_mutex_lock(mutex)
    ctypes.CDLL(None).pthread_mutex_lock(mutex)  # the GIL released, and no signal wakes it

def test_next():
    pass

def test_last():
    pass
"""

POISON = """
import toy_probe

def test_first():
    assert not toy_probe.POISONED

def test_poisons():
    toy_probe.POISONED.append("CUDA error: an illegal memory access was encountered (toy)")

def test_neighbour():
    assert not toy_probe.POISONED, "ran in a poisoned process"

def test_last():
    assert not toy_probe.POISONED, "ran in a poisoned process"
"""

PROBE = """
POISONED = []

def probe():
    return f"AcceleratorError: {POISONED[0]}" if POISONED else None
"""

SLOW = """
import time

def test_first():
    pass

def test_sleeps():
    time.sleep(60)

def test_never():
    pass
"""

MANY = """
import time
import pytest

@pytest.mark.parametrize("n", range(30))
def test_step(n):
    time.sleep(0.25)
"""


def stop_halfway(
    cmd: list[str], cwd: Path, env: dict[str, str], journal: Path, cases: int, signum: int, wait_s: float
) -> tuple[int, str]:
    """Start ``cmd`` in a process group of its own, and once its journal holds ``cases`` cases send
    ``signum`` to the whole group, as a CI system stops a job; its exit code and output."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_text().count('"kind": "case"') >= cases:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be stopped halfway"
    os.killpg(proc.pid, signum)
    output, _ = proc.communicate(timeout=120)
    return proc.returncode, output


def _run(tmp: Path, source: str, *args: str, timeout: float = 120) -> tuple[int, str, float]:
    (tmp / "test_toy.py").write_text(source)
    start = time.monotonic()
    proc = subprocess.run(
        _command(tmp, *args), cwd=tmp, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _command(tmp: Path, *args: str) -> list[str]:
    """The inner run; without native frames unless asked (gdb takes seconds where torch is loaded, and the
    recording process loads it for the environment record)."""
    if not any(arg.startswith("--native-stacks") for arg in args):
        args = (*args, "--native-stacks=off")
    return [
        sys.executable, "-m", "pytest", "test_toy.py", "-p", "harness.pytest_plugin",
        f"--results-json={tmp / 'out' / 'r.json'}", f"--junitxml={tmp / 'out' / 'j.xml'}",
        "-p", "no:cacheprovider", "-q", *args,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), "."])}


def _cases(tmp: Path) -> dict[str, CaseResult]:
    return {case.id.split("::")[1]: case for case in load_results(tmp / "out" / "r.json").cases}


def _junit(tmp: Path) -> dict[str, list[str]]:
    """Case name -> the tags under its testcase (failure, error, skipped)."""
    cases: dict[str, list[str]] = {}
    for element in ET.parse(tmp / "out" / "j.xml").getroot().iter("testcase"):
        cases.setdefault(str(element.get("name")), []).extend(child.tag for child in element)
    return cases


@pytest.mark.proof
def test_a_hang_under_xdist_is_a_timeout_and_a_fresh_worker_runs_the_rest(tmp_path: Path) -> None:
    # gdb, where installed, attaches fast to these workers: they import no torch.
    code, output, wall = _run(tmp_path, HANGS, "-n", "2", "--case-timeout", "2", "--native-stacks=auto")
    assert code == 1, output
    cases = _cases(tmp_path)
    outcomes = {name: case.outcome for name, case in cases.items()}
    assert outcomes == {
        "test_first": "passed",
        "test_hangs_in_python": "timeout",
        "test_hangs_holding_the_gil": "timeout",
        "test_fails": "failed",
        "test_last": "passed",
    }, output
    python = cases["test_hangs_in_python"]
    assert "time limit of 2 s (the default) in its call" in python.message
    assert python.evidence
    assert "in test_hangs_in_python" in python.evidence
    if shutil.which("gdb"):  # native frames where gdb can give them
        assert "native frames (gdb)" in python.evidence
        assert "\n#" in python.evidence
    held = cases["test_hangs_holding_the_gil"]
    assert "C code holding the GIL" in held.message
    assert held.evidence
    assert "in test_hangs_holding_the_gil" in held.evidence
    junit = _junit(tmp_path)
    assert set(junit) == set(outcomes)
    assert "failure" in junit["test_hangs_in_python"]
    assert "failure" in junit["test_hangs_holding_the_gil"]
    assert "TIMEOUT test_toy.py::test_hangs_in_python" in output
    assert wall < 90, f"{wall:.0f} s"


@pytest.mark.parametrize("where", ["python", "c"])
@pytest.mark.proof
def test_without_xdist_a_hang_stops_the_run_and_every_file_is_written(tmp_path: Path, where: str) -> None:
    """In one process nothing can take over a hung case: it is a timeout and the rest is not-run. Stuck in
    C (the GIL released, no signal wakes it) the files are written from another thread."""
    source = STUCK_IN_C.format(python=where == "python")
    code, output, _ = _run(tmp_path, source, "--case-timeout", "2", "--stop-grace", "1")
    assert code == EXIT_STOPPED_BY_FAULT, output
    run = load_results(tmp_path / "out" / "r.json")
    assert run.complete is False
    assert "test_toy.py::test_hangs ended in timeout" in run.metadata["incomplete_reason"]
    cases = _cases(tmp_path)
    assert [(name, case.outcome) for name, case in cases.items()] == [
        ("test_first", "passed"),
        ("test_hangs", "timeout"),
        ("test_next", "not-run"),
        ("test_last", "not-run"),
    ]
    assert cases["test_hangs"].evidence
    assert "in test_hangs" in cases["test_hangs"].evidence
    assert cases["test_next"].message.endswith("(before this case started)")
    assert set(_junit(tmp_path)) == set(cases)


@pytest.mark.proof
def test_without_xdist_a_hang_holding_the_gil_leaves_a_journal_that_finalize_completes(
    tmp_path: Path,
) -> None:
    """The last resort: nothing in the process can run, the C watchdog writes the stacks and ends it; the
    journal and the stacks make the result file and JUnit (the front door runs harness.finalize)."""
    code, output, _ = _run(tmp_path, HANGS, "--case-timeout", "1", "--stop-grace", "1", "-k", "not python")
    assert code == -signal.SIGALRM, output  # the C handler chains to SIGALRM's default: the process ends
    results = tmp_path / "out" / "r.json"
    assert not results.exists()
    assert finalize_main([str(results), f"--junit={tmp_path / 'out' / 'j.xml'}"]) == 0
    cases = _cases(tmp_path)
    assert {name: case.outcome for name, case in cases.items()} == {
        "test_first": "passed",
        "test_hangs_holding_the_gil": "timeout",
        "test_fails": "not-run",
        "test_last": "not-run",
    }
    assert "in test_hangs_holding_the_gil" in (cases["test_hangs_holding_the_gil"].evidence or "")
    assert set(_junit(tmp_path)) == set(cases)


@pytest.mark.parametrize("workers", [["-n", "1"], []], ids=["xdist", "one-process"])
@pytest.mark.proof
def test_a_device_fault_is_its_case_alone(tmp_path: Path, workers: list[str]) -> None:
    """A sticky error after a case (a toy probe stands in for CUDA's): that case is device-fault with the
    error and a compute-sanitizer repro; with xdist a fresh worker runs the rest (no neighbour fails), in
    one process the run stops there."""
    (tmp_path / "toy_probe.py").write_text(PROBE)
    code, output, _ = _run(tmp_path, POISON, "--device-probe", "toy_probe:probe", *workers)
    cases = _cases(tmp_path)
    fault = cases["test_poisons"]
    assert fault.outcome == "device-fault", output
    assert (
        "device fault after this case: AcceleratorError: CUDA error: an illegal memory access"
        in fault.message
    )
    assert fault.evidence
    assert "(toy)" in fault.evidence
    assert fault.repro == "compute-sanitizer --tool memcheck python -m pytest test_toy.py::test_poisons"
    assert "error" in _junit(tmp_path)["test_poisons"]
    if workers:
        assert code == 1, output
        assert [case.outcome for case in cases.values()] == ["passed", "device-fault", "passed", "passed"]
        assert cases["test_neighbour"].worker != fault.worker
    else:
        assert code == EXIT_STOPPED_BY_FAULT, output
        assert [case.outcome for case in cases.values()] == ["passed", "device-fault", "not-run", "not-run"]


@pytest.mark.parametrize("workers", [["-n", "1"], []], ids=["xdist", "one-process"])
@pytest.mark.proof
def test_the_run_deadline_ends_the_run_with_every_file(tmp_path: Path, workers: list[str]) -> None:
    """The deadline counts from the start of pytest's configuration (the controller imports torch there
    for the environment record): 20 s leaves the run time to start its worker on a loaded machine."""
    code, output, wall = _run(tmp_path, SLOW.replace("60", "120"), *workers, "--run-deadline", "20")
    assert code == EXIT_DEADLINE, output
    assert wall < 50, f"the run took {wall:.0f} s: the case in its 120 s sleep was not ended"
    run = load_results(tmp_path / "out" / "r.json")
    assert run.metadata["incomplete_reason"] == "the run deadline (--run-deadline 20 s) was reached"
    cases = _cases(tmp_path)
    assert [(name, case.outcome) for name, case in cases.items()] == [
        ("test_first", "passed"),
        ("test_sleeps", "not-run"),
        ("test_never", "not-run"),
    ]
    assert cases["test_sleeps"].message.endswith("(while this case was running)")
    assert cases["test_never"].message.endswith("(before this case started)")
    assert set(_junit(tmp_path)) == set(cases)
    assert "exit code 124" in output


@pytest.mark.proof
def test_a_deadline_already_passed_starts_no_worker_and_records_every_case_not_run(tmp_path: Path) -> None:
    code, output, _ = _run(tmp_path, SLOW, "-n", "2", "--run-deadline", "0")
    assert code == EXIT_DEADLINE, output
    assert "bringing up nodes" not in output
    assert {case.outcome for case in _cases(tmp_path).values()} == {"not-run"}
    assert len(_junit(tmp_path)) == 3


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, EXIT_SIGTERM), (signal.SIGINT, EXIT_SIGINT)])
@pytest.mark.proof
def test_a_signal_halfway_leaves_a_readable_result_file_junit_and_page(
    tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    """As a CI system stops a job: the signal to the whole process group (controller and workers), in the
    middle of the run. What finished is kept, the rest is not-run, every file is written."""
    (tmp_path / "test_toy.py").write_text(MANY)
    journal = tmp_path / "out" / "r.json.journal.jsonl"
    returncode, output = stop_halfway(_command(tmp_path, "-n", "2"), tmp_path, _env(), journal, 6, signum, 90)
    assert returncode == code, output
    run: RunResult = load_results(tmp_path / "out" / "r.json")
    assert run.complete is False
    assert run.metadata["incomplete_reason"] == f"the run was stopped by {signum.name}"
    outcomes = [case.outcome for case in run.cases]
    assert len(outcomes) == 30
    assert set(outcomes) == {"passed", "not-run"}
    assert 6 <= outcomes.count("passed") < 30
    assert len(_junit(tmp_path)) == 30
    page = render_summary(run, [str(tmp_path / "out" / "r.json")])
    assert "Incomplete run" in page
    assert f"the run was stopped by {signum.name}" in page
    assert "Not run (" in page


DIES_AFTER_TEARDOWN = """
import os

def test_first():
    pass

def test_dies_after_its_teardown():
    pass

def test_last():
    pass
"""

DIE_AFTER_TEARDOWN = """
import os, time

WORKER = []

def pytest_configure(config):
    # Only a worker has workerinput (PYTEST_XDIST_WORKER may be inherited from an outer pytest-xdist run).
    WORKER.append(hasattr(config, "workerinput"))

def pytest_runtest_logfinish(nodeid, location):
    # After the teardown report went out, before the worker tells pytest-xdist the case is complete:
    # as a worker killed by a CI system's SIGTERM in that instant. The pause lets execnet send the report
    # first (an exit at once could lose it, and then the case did crash mid-teardown).
    if nodeid.endswith("test_dies_after_its_teardown") and WORKER[0]:
        time.sleep(1)
        os._exit(1)
"""


@pytest.mark.proof
def test_a_worker_dying_after_a_case_finished_leaves_one_result_and_one_testcase(tmp_path: Path) -> None:
    """pytest-xdist reports the item of a dead worker as crashed though its reports all came: the case
    keeps its one result (passed) in the result file and in JUnit alike."""
    (tmp_path / "conftest.py").write_text(DIE_AFTER_TEARDOWN)
    code, output, _ = _run(tmp_path, DIES_AFTER_TEARDOWN, "-n", "1")
    assert code == 0, output
    cases = _cases(tmp_path)
    assert {name: case.outcome for name, case in cases.items()} == {
        "test_first": "passed",
        "test_dies_after_its_teardown": "passed",
        "test_last": "passed",
    }, output
    junit = ET.parse(tmp_path / "out" / "j.xml").getroot()
    assert sorted(str(element.get("name")) for element in junit.iter("testcase")) == sorted(cases), output
    assert _junit(tmp_path)["test_dies_after_its_teardown"] == []  # no failure, error or skip
    (suite,) = junit.iter("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "0", "0")
