"""A faulty backend never takes the run down (issue 26). Each faulty backend of
``tests/broken/fault.py`` runs its chapters as a user would (pytest-xdist, the result file,
JUnit); the run must end, name the faulty case with its outcome and evidence, give every other case the
outcome it gets against the reference, case by case, and leave a complete result file, JUnit and page.

On a CPU machine the faults a CPU can have (hangs in execute, lower and the view pass; a process that
dies; a sticky error, simulated) run here, all in one run of ``all_cpu_faults`` (each at its own case) on a
small selection of three chapters, beside the reference's run of it: two runs instead of ten keep the
self-tests fast. On a GPU machine (``.ci/gpu/faults.sh``) the CUDA ones run whole chapters, one at a time:
an illegal address, an out-of-memory, a kernel that never ends; ``FAULT_EVIDENCE_DIR`` keeps each run's
files there.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from harness.results import RunResult, load_results, write_results
from reports.summary import render_summary
from tests.broken.fault import ALL_CPU_FAULTS, Fault, faulty_backends
from tests.conformance.test_suite_catches_broken_backends import start_chapter

FAULTY = faulty_backends()
ALL_CPU = "tests.broken.fault:ALL_CPU_FAULTS"
CUDA = [spec for spec, backend in FAULTY.items() if backend.fault.cuda]
#: Where the GPU script keeps each run's files and the comparison (unset: nothing is kept).
EVIDENCE_DIR = os.environ.get("FAULT_EVIDENCE_DIR")
#: Time limits of a faulty run: (every case, the faulty cases). A faulty case that is the first of a fresh
#: worker may lower its program before it meets the fault (an export and a cache look-up: 12-20 s seen on
#: a 2-core CI machine at load 12); on the GPU a warm chapter case takes under 10 s (the reference run warms
#: the cache first). The faulty cases get a limit above that, so the stacks show the hang itself; every
#: other case a generous one, so load never reads as a hang (on the GPU the suite's own, 10 minutes). The
#: reference's runs keep the suite's limits.
CASE_TIMEOUT = {"cpu": ("120", "40"), "cuda": ("", "30")}
#: Workers of a faulty run: on the CPU three, so that the hangs wait side by side.
WORKERS = {"cpu": "3", "cuda": os.environ.get("FAULT_WORKERS", "4")}
#: The whole faulty run, worker replacements included, ends within this (README "A faulty backend never
#: takes the run down"); on the GPU also its deadline, so that a hang nothing could end still leaves files.
RUN_BOUND_S = {"cpu": 240.0, "cuda": 300.0}
DEADLINE_S = {"cpu": "", "cuda": "240"}
SIMULATED_PROBE = "tests.broken.fault:simulated_probe"
REFERENCE = "reference_impl:BACKEND"


def _kind(fault: Fault) -> str:
    return "cuda" if fault.cuda else "cpu"


def _args(fault: Fault, junit: Path, workers: str, faulty: bool) -> tuple[str, ...]:
    kind = _kind(fault)
    limits = (
        *([f"--case-timeout={CASE_TIMEOUT[kind][0]}"] if CASE_TIMEOUT[kind][0] else []),
        *(f"--case-timeout=case:{case}={CASE_TIMEOUT[kind][1]}" for case in fault.faulty),
        *([f"--run-deadline={DEADLINE_S[kind]}"] if DEADLINE_S[kind] else []),
    )
    return (
        *fault.chapters[1:],
        *fault.select,
        "-n", workers,
        *(limits if faulty else ()),
        f"--junitxml={junit}",
        "--native-stacks=off" if kind == "cpu" else "--native-stacks=auto",
    )  # fmt: skip


Outcome = tuple[int, RunResult, str, Path, float]


def _start(
    tmp: Path, backend: str, fault: Fault, *extra: str, workers: str | None = None
) -> Callable[[], Outcome]:
    """Start one chapter run (a child process); the returned function waits for it."""
    tmp.mkdir(parents=True, exist_ok=True)
    junit = tmp / "results.junit.xml"
    start = time.monotonic()
    args = _args(fault, junit, workers or WORKERS[_kind(fault)], backend != REFERENCE)
    wait = start_chapter(tmp, backend, *args, *extra, chapter=fault.chapters[0])

    def done() -> Outcome:
        code, run, output = wait()
        return code, run, output, junit, time.monotonic() - start

    return done


def _junit_ids(junit: Path) -> dict[str, list[ET.Element]]:
    """Case id -> its testcase elements (a case that failed in call and in teardown has two)."""
    cases: dict[str, list[ET.Element]] = {}
    for element in ET.parse(junit).getroot().iter("testcase"):
        path = element.get("classname", "").replace(".", "/") + ".py"
        cases.setdefault(f"{path}::{element.get('name')}", []).append(element)
    return cases


def check_contained(
    spec: str, fault: Fault, run: RunResult, reference: RunResult, junit: Path, page: str
) -> dict[str, object]:
    """The issue's "done when", case by case; returns the figures the GPU script's table shows."""
    got = {case.id: case for case in run.cases}
    want = {case.id: case.outcome for case in reference.cases}
    assert set(got) == set(want), {"missing": set(want) - set(got), "extra": set(got) - set(want)}
    assert run.complete, run.metadata.get("incomplete_reason")
    for case_id, (outcome, evidence) in fault.faulty.items():
        case = got[case_id]
        assert case.outcome == outcome, (case_id, case.outcome, case.message)
        assert evidence in f"{case.message}\n{case.evidence or ''}", (case_id, case.message, case.evidence)
        if outcome in ("timeout", "device-fault"):
            assert case.evidence, f"{case_id}: a {outcome} without evidence"
        if outcome == "device-fault":
            assert case.repro.startswith("compute-sanitizer --tool memcheck "), case.repro
    differ = {
        case_id: (case.outcome, want[case_id], case.message.splitlines()[:1])
        for case_id, case in got.items()
        if case_id not in fault.faulty and case.outcome != want[case_id]
    }
    assert not differ, f"{spec}: cases whose outcome differs from the reference's: {differ}"
    testcases = _junit_ids(junit)
    assert set(testcases) == set(got), {"not in JUnit": set(got) - set(testcases)}
    for case_id, (outcome, _) in fault.faulty.items():
        marks = [child.tag for element in testcases[case_id] for child in element]
        assert {"failure", "error"} & set(marks), (case_id, marks)
        assert case_id in page, f"the page does not name {case_id}"
        assert f'class="badge {outcome}"' in page
        if outcome in ("timeout", "device-fault"):
            assert "Evidence (" in page
    return {
        "cases": len(got),
        "faulty": {case_id: got[case_id].outcome for case_id in fault.faulty},
        "same_as_reference": len(got) - len(fault.faulty),
    }


def _judge(spec: str, faulty: Outcome, reference: RunResult) -> dict[str, object]:
    fault = FAULTY[spec].fault
    code, run, output, junit, wall = faulty
    assert code == 1, output
    assert wall < RUN_BOUND_S[_kind(fault)], f"{spec}: the run took {wall:.0f} s"
    results = junit.with_name("results.json")
    page = render_summary(load_results(results), [str(results)])
    summary = check_contained(spec, fault, run, reference, junit, page)
    summary = {"backend": spec, "wall_s": round(wall, 1), **summary}
    if EVIDENCE_DIR:
        keep = Path(EVIDENCE_DIR) / spec.split(":")[1]
        keep.mkdir(parents=True, exist_ok=True)
        for path in (results, junit):
            shutil.copy(path, keep / path.name)
        (keep / "page.html").write_text(page, encoding="utf-8")
        (keep / "output.txt").write_text(output, encoding="utf-8")
        (keep / "contained.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary


def _reference(tmp: Path, fault: Fault) -> RunResult:
    code, run, output, _, _ = _start(tmp, REFERENCE, fault)()
    assert code == 0, output
    return run


@pytest.mark.proof
def test_cpu_faults_are_contained_named_and_alone(tmp_path: Path) -> None:
    """Every CPU fault, each at its own case, in one run with two workers; the reference's run of the same
    selection beside it (each spends most of its time waiting: on a hang's limit, on a fresh worker)."""
    fault = ALL_CPU_FAULTS.fault
    reference = _start(tmp_path / "reference", REFERENCE, fault, workers="1")
    faulty = _start(tmp_path / "faulty", ALL_CPU, fault, "--device-probe", SIMULATED_PROBE)
    code, reference_run, output, _, _ = reference()
    assert code == 0, output
    _judge(ALL_CPU, faulty(), reference_run)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", CUDA, ids=[s.split(":")[1] for s in CUDA])
def test_cuda_fault_is_contained_named_and_alone(tmp_path: Path, spec: str) -> None:
    """One at a time: an out-of-memory beside another run on the same GPU would be that run's too."""
    if not torch.cuda.is_available():
        pytest.skip(f"{spec} is a CUDA fault: it needs a GPU (.ci/gpu/faults.sh runs it on one)")
    fault = FAULTY[spec].fault
    reference = _cached_reference(tmp_path, fault)
    _judge(spec, _start(tmp_path / "faulty", spec, fault)(), reference)


_REFERENCES: dict[tuple[str, ...], RunResult] = {}


def _cached_reference(tmp: Path, fault: Fault) -> RunResult:
    """The reference's run of a selection, once per process (the CUDA faults share theirs)."""
    key = (*fault.chapters, *fault.select)
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(tmp / "reference", fault)
        if EVIDENCE_DIR:  # what every other case was compared with, and the watchdog's cost in a green run
            (Path(EVIDENCE_DIR) / "reference").mkdir(parents=True, exist_ok=True)
            write_results(Path(EVIDENCE_DIR) / "reference" / "results.json", _REFERENCES[key])
    return _REFERENCES[key]
