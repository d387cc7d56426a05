"""The long-cases-first order (harness/case_order.py): against pytest-xdist's own work-stealing scheduler,
through a real xdist session, and the committed durations file against what the suite collects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from xdist.scheduler import WorkStealingScheduling

from harness.case_order import (
    LONG_S,
    load_recorded,
    load_seconds,
    long_first,
    main,
    measured_phases,
    measured_seconds,
    slice_sizes,
    write_seconds,
)

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[2]


class _Node:
    """What the scheduler sees of a worker: it records the case indices it is sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def send_steal(self, indices: list[int]) -> None:  # pragma: no cover - not reached before a case ends
        raise AssertionError("no steal before the first case ends")

    def shutdown(self) -> None:
        self.shutting_down = True


def first_slices(collection: list[str], workers: int) -> list[list[str]]:
    """The cases xdist's ``WorkStealingScheduling`` hands each worker before any case has run."""
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None)
    scheduler = WorkStealingScheduling(config)  # type: ignore[arg-type]
    nodes = [_Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        scheduler.add_node_collection(node, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    return [[collection[i] for i in node.sent] for node in nodes]


def ordered(ids: list[str], seconds: dict[str, float], workers: int) -> list[str]:
    return [ids[i] for i in long_first(ids, seconds, workers)]


@pytest.mark.parametrize(("count", "workers"), [(1100, 12), (1100, 24), (17, 2), (5, 4), (3, 8), (0, 3)])
def test_slice_sizes_are_the_schedulers(count: int, workers: int) -> None:
    ids = [f"t{i}" for i in range(count)]
    assert [len(s) for s in first_slices(ids, workers)] == slice_sizes(count, workers)


def test_each_slice_starts_with_its_share_of_the_long_cases() -> None:
    ids = [f"t{i:03d}" for i in range(120)]
    # the long ones sit together at the end, as a chapter of long cases does in collection order
    seconds = {"t110": 12.0, "t111": 9.0, "t112": 8.0, "t113": 5.0, "t114": 4.0, "t115": 3.0, "t116": 1.0}
    slices = first_slices(ordered(ids, seconds, 4), 4)
    heads = [[case for case in s if case in seconds] for s in slices]
    assert sorted(len(h) for h in heads) == [1, 2, 2, 2]
    for s, head in zip(slices, heads, strict=True):
        assert s[: len(head)] == head, "a slice's long cases come first, longest first"
        assert head == sorted(head, key=lambda c: -seconds[c])
    # LPT: 12 | 9 + 1 | 8 + 3 | 5 + 4
    assert sorted(sum(seconds[c] for c in h) for h in heads) == [9.0, 10.0, 11.0, 12.0]
    short = [case for s in slices for case in s if case not in seconds]
    assert short == sorted(short), "the short cases keep collection order, slice after slice"


@pytest.mark.parametrize("workers", [1, 0])
def test_one_worker_keeps_pytests_order(workers: int) -> None:
    ids = ["a", "b", "c"]
    assert ordered(ids, {"c": 10.0}, workers) == ids


def test_a_permutation_whatever_the_file_says() -> None:
    ids = [f"t{i}" for i in range(50)]
    seconds = {f"t{i}": float(i % 7) for i in range(0, 50, 3)} | {"not-collected": 99.0}
    for workers in (2, 3, 7, 12, 60):
        assert sorted(ordered(ids, seconds, workers)) == sorted(ids)


def test_refresh_keeps_the_long_cases_median(tmp_path: Path) -> None:
    def run(name: str, cases: list[tuple[str, float, str]]) -> Path:
        path = tmp_path / name
        body = [{"id": i, "duration_s": d, "outcome": o} for i, d, o in cases]
        path.write_text(json.dumps({"cases": body}))
        return path

    files = [
        run("a.json", [("x", 9.0, "passed"), ("y", 0.1, "passed"), ("z", 30.0, "not-run")]),
        run("b.json", [("x", 1.0, "passed"), ("y", 0.2, "skipped")]),
        run("c.json", [("x", 2.0, "failed"), ("w", 0.7, "passed")]),
    ]
    seconds = measured_seconds(files)
    assert seconds == {"x": 2.0, "y": 0.15000000000000002, "w": 0.7}
    out = tmp_path / "case_seconds.json"
    assert write_seconds(seconds, out, "test") == 2
    assert load_seconds(out) == {"w": 0.7, "x": 2.0}
    assert min(load_seconds(out).values()) >= LONG_S


def test_refresh_records_each_phase_by_its_busiest_worker(tmp_path: Path) -> None:
    def run(name: str, cases: list[tuple[str, float]]) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"cases": [{"id": "x", "duration_s": d, "worker": w} for w, d in cases]}))
        return path

    shared = run("conformance.json", [("gw0", 3.0), ("gw1", 4.0), ("gw0", 2.0)])
    alone = run("conformance-exclusive.json", [("gw0", 1.5), ("gw0", 2.5)])
    assert measured_phases([shared, alone]) == {"": 5.0, "-exclusive": 4.0}
    out = tmp_path / "case_seconds.json"
    write_seconds({}, out, "test", measured_phases([shared, alone]))
    assert load_recorded(out)[1] == {"": 5.0, "-exclusive": 4.0}


def test_refresh_drops_the_cases_the_current_run_no_longer_has(tmp_path: Path) -> None:
    """A case split or renamed since the older runs (their medians still name it) leaves the file when
    ``--current`` names a run of today's suite."""

    def run(path: Path, cases: dict[str, float]) -> Path:
        body = [{"id": i, "duration_s": d, "outcome": "passed"} for i, d in cases.items()]
        path.write_text(json.dumps({"cases": body}))
        return path

    older = run(tmp_path / "older.json", {"whole": 9.0, "kept": 2.0})
    today = run(tmp_path / "today.json", {"kept": 4.0, "part-1": 3.0})
    out = tmp_path / "case_seconds.json"
    assert main([str(older), str(today), "-o", str(out)]) == 0
    assert set(load_seconds(out)) == {"whole", "kept", "part-1"}
    assert main([str(older), str(today), "-o", str(out), "--current", str(today)]) == 0
    assert load_seconds(out) == {"kept": 3.0, "part-1": 3.0}


def test_the_committed_file_names_only_cases_the_suite_has() -> None:
    """A case renamed or removed leaves a stale line; refresh the file from a warm run (module doc)."""
    seconds = load_seconds(REPO_ROOT / "conformance" / "suite" / "case_seconds.json")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    collected = {line for line in lines if line.startswith("conformance/") and "::" in line}
    assert seconds, "the file is empty"
    assert sorted(set(seconds) - collected) == []


SLEEPY = """
import time
import pytest

@pytest.mark.parametrize("i", range(12))
def test_case(i):
    time.sleep(0.3 if i == 11 else 0.01)
"""


@pytest.mark.proof
def test_a_real_worksteal_session_starts_the_long_case_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through pytest-xdist itself: the case the file calls long, last in collection order, is the
    first its worker runs; without the file, it is the last."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    pytester.makepyfile(test_sleepy=SLEEPY)
    seconds = pytester.path / "seconds.json"
    write_seconds({"test_sleepy.py::test_case[11]": 5.0}, seconds, "test")

    def rank(*extra: str) -> int:
        """Where the long case came in its worker's order (0: first)."""
        out = pytester.path / f"results{len(extra)}.json"
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-p", "harness.pytest_plugin", f"--results-json={out}",
            "-n", "2", "--dist", "worksteal", *extra,
        )  # fmt: skip
        assert result.ret == 0, result.stdout.str()
        cases = json.loads(out.read_text())["cases"]
        long = next(c for c in cases if c["id"].endswith("[11]"))
        mine = sorted(c["started_s"] for c in cases if c["worker"] == long["worker"])
        return mine.index(long["started_s"])

    assert rank(f"--case-seconds={seconds}") == 0
    assert rank() > 0
    broken = pytester.path / "broken.json"
    broken.write_text('{"schema": "something else"}')
    result = pytester.runpytest_subprocess(
        "-p", "harness.pytest_plugin", "-n", "2", "--dist", "worksteal", f"--case-seconds={broken}"
    )  # fmt: skip
    assert result.ret != 0
    assert f"--case-seconds {broken}: not a file of case seconds" in result.stderr.str() + result.stdout.str()
