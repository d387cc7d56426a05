"""An xdist worker leaves without the interpreter's teardown once its session is over
(harness/worker_exit.py), shown through real inner pytest sessions: a test module's object whose
``__del__`` writes a file, which only the interpreter's teardown runs."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from harness import worker_exit

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[2]

# The module-level object is deleted only when the interpreter tears the module down.
TORN_DOWN = """
import os

class _Teardown:
    def __del__(self, _open=open, _path=os.environ["TORN_DOWN_MARKER"]):
        with _open(_path, "w") as marker:
            marker.write("torn down")

_kept = _Teardown()

def test_passes():
    assert True

def test_{outcome}():
    assert {verdict}
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str, fail: bool = False):
    marker = pytester.path / "torn-down"
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.setenv("TORN_DOWN_MARKER", str(marker))
    module = TORN_DOWN.format(outcome="fails" if fail else "passes_too", verdict=not fail)
    pytester.makepyfile(test_mod=module)
    outcome = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "harness.pytest_plugin", *args)
    return outcome, marker


def test_a_worker_whose_session_ended_skips_the_teardown(pytester, monkeypatch):
    outcome, marker = _run(pytester, monkeypatch, "-n", "1")
    outcome.assert_outcomes(passed=2)
    assert outcome.ret == 0
    assert not marker.exists(), "the worker's process ran the interpreter's teardown after its session"


def test_a_single_process_is_torn_down_as_python_does(pytester, monkeypatch):
    outcome, marker = _run(pytester, monkeypatch, "-n", "0")
    outcome.assert_outcomes(passed=2)
    assert marker.read_text() == "torn down"


def test_a_failure_in_a_worker_still_fails_the_run(pytester, monkeypatch):
    outcome, marker = _run(pytester, monkeypatch, "-n", "1", fail=True)
    outcome.assert_outcomes(passed=1, failed=1)
    assert outcome.ret == 1  # the controller's status: a worker's own exit status is never read
    assert not marker.exists()


# A conftest's module-level object: the controller imports it too, so each process writes its own marker.
TORN_DOWN_EVERYWHERE = """
import os

class _Teardown:
    def __del__(self, _open=open, _path=os.environ["TORN_DOWN_MARKER"] + "." + str(os.getpid())):
        with _open(_path, "w") as marker:
            marker.write("torn down")

_kept = _Teardown()
"""


@pytest.mark.parametrize(("fail", "status"), [(False, 0), (True, 1)])
def test_an_xdist_controller_leaves_with_its_sessions_status(pytester, monkeypatch, fail, status):
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.setenv("TORN_DOWN_MARKER", str(pytester.path / "torn-down"))
    pytester.makeconftest(TORN_DOWN_EVERYWHERE)
    pytester.makepyfile(test_mod=f"def test_one():\n    assert {not fail}\n")
    plugin = ("-p", "no:cacheprovider", "-p", "harness.pytest_plugin")
    outcome = pytester.runpytest_subprocess(*plugin, "-n", "1")
    assert outcome.ret == status
    assert sorted(pytester.path.glob("torn-down.*")) == [], "a process ran the interpreter's teardown"


def test_only_the_processs_own_session_leaves_early(monkeypatch):
    """An in-process ``pytest.main`` (a longer-lived program's) must not end that program at its exit."""
    monkeypatch.setattr(sys, "argv", ["pytest", "-n", "2", "tests"])
    own = types.SimpleNamespace(invocation_params=types.SimpleNamespace(args=("-n", "2", "tests")))
    inner = types.SimpleNamespace(invocation_params=types.SimpleNamespace(args=("-n", "1", "other")))
    assert worker_exit.is_the_process_session(own)
    assert not worker_exit.is_the_process_session(inner)


def test_an_uncaught_exception_keeps_pythons_status(monkeypatch):
    exits: list[int] = []
    monkeypatch.setattr(worker_exit.os, "_exit", exits.append)
    monkeypatch.setitem(worker_exit._state, "over", True)
    monkeypatch.setattr(sys, "last_value", RuntimeError("unconfigure broke"), raising=False)
    worker_exit._leave()
    assert exits == []


def test_under_coverage_the_process_ends_as_python_ends_it(monkeypatch):
    """Coverage saves its data from a handler that may run after this one: no early exit then."""
    exits: list[int] = []
    monkeypatch.setattr(worker_exit.os, "_exit", exits.append)
    monkeypatch.setitem(worker_exit._state, "over", True)
    measuring = types.SimpleNamespace(Coverage=types.SimpleNamespace(current=lambda: object()))
    monkeypatch.setitem(sys.modules, "coverage", measuring)
    worker_exit._leave()
    assert exits == []
    idle = types.SimpleNamespace(Coverage=types.SimpleNamespace(current=lambda: None))
    monkeypatch.setitem(sys.modules, "coverage", idle)
    worker_exit._leave()
    assert exits == [worker_exit.EXIT_STATUS]


def test_a_session_not_over_is_not_cut_short(monkeypatch):
    exits: list[int] = []
    monkeypatch.setattr(worker_exit.os, "_exit", exits.append)
    monkeypatch.setitem(worker_exit._state, "over", False)
    worker_exit._leave()
    assert exits == []


STASHED = """
import os
from _pytest.unraisableexception import gc_collect_iterations_key

def test_records_the_final_collections(request):
    value = request.config.stash.get(gc_collect_iterations_key, "pytest's default")
    with open(os.environ["TORN_DOWN_MARKER"], "w") as marker:
        marker.write(str(value))
"""


@pytest.mark.parametrize(("workers", "collections"), [("1", "0"), ("0", "pytest's default")])
def test_only_a_worker_skips_the_final_garbage_collections(pytester, monkeypatch, workers, collections):
    """A worker's unconfigure collects no garbage (0.7 s of a warm GPU worker's end); one process keeps
    pytest's own."""
    marker = pytester.path / "collections"
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.setenv("TORN_DOWN_MARKER", str(marker))
    pytester.makepyfile(test_mod=STASHED)
    outcome = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "harness.pytest_plugin", "-n", workers
    )
    outcome.assert_outcomes(passed=1)
    assert marker.read_text() == collections
