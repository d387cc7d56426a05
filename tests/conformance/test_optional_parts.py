"""Every part the protocol calls optional is optional in every chapter, for every combination of them.

A minimal backend (``tests/minimal_backends.py``: the reference's parts, any subset of the optional ones,
each target in ``lowering_devices`` or not, placement keys in ``lower_options`` or not,
``mm_out_calls``, ``mm_out_path``, ``known_failures``) must run every chapter with 0 failures and 0 errors:
a case that needs a part the backend lacks is skipped, and says which part.

Running the whole suite once per combination (6,144 of them) is out of the question; the proof runs each
case once per combination *that can make a difference to it* (``tests/conformance/part_probe.py``). A case
learns which parts exist only by looking them up, and the minimal backend records every lookup: a run's
outcome holds for every combination that agrees with it on what the run looked up. Each case is run, in one
child process, first with every part present, then again for every other setting of what that run looked up,
and so on for anything a new run looks up, until every combination is covered; the test checks that
coverage itself. The session's own start (configure, the preflight) is proven the same way, one child per
setting of the two things it looks up. The cases run are one parametrisation per test and non-data
parameter (the cheapest model and dtype, one view-pass graph): data does not decide which parts a case
uses. On a GPU machine the same test also proves the CUDA cases (on a CPU one they skip before touching the
backend, which the probe sees as looking nothing up).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from conformance.catalogue.chapters import CHAPTERS as CHAPTER_FILES
from tests.chapter_runner import ChapterRun
from tests.minimal_backends import ATTRIBUTE_DIMENSION, DIMENSIONS, MinimalBackend, describe, parse

ROOT = Path(__file__).resolve().parents[2]
#: Every chapter, in two children run side by side (about equal cost each); a new chapter joins the second.
CHAPTERS = sorted(CHAPTER_FILES)
FIRST_GROUP = ("bad_inputs", "program_format", "streams_threads", "multi_method", "differential")
GROUPS = {
    "runtime-chapters": [c for c in CHAPTERS if c in FIRST_GROUP],
    "the-others": [c for c in CHAPTERS if c not in FIRST_GROUP],
}
#: The generated cases (Hypothesis) draw a tenth of their CI budget of examples: every run of a case draws
#: the same ones (derandomised), and which parts a case uses does not depend on how many.
GENERATED_EXAMPLES = "--generated-examples=0.1"
#: What a skip because of the backend's parts says (conformance/common/parts.py,
#: programs.require_lowering_device).
PART_REASON = re.compile(r"does not implement protocol part '(\w+)'|lowers only for")
FAILING = ("failed", "error", "crashed")


def probe(tmp_path: Path, spec: str, *select: str) -> tuple[int, list[dict[str, Any]], str]:
    """Run ``select`` under the part probe against ``tests.minimal_backends:<spec>`` in a child process."""
    out, log = tmp_path / "probe.jsonl", tmp_path / "output.txt"
    args = [
        *select, f"--backend=tests.minimal_backends:{spec}", "-p", "tests.conformance.part_probe",
        f"--probe-out={out}", "--probe-representatives", "-q", "-p", "no:cacheprovider", "--progress-every=0",
        GENERATED_EXAMPLES,
    ]  # fmt: skip
    code = ChapterRun(args, ROOT, {**os.environ, "PYTHONPATH": str(ROOT)}, log).wait(timeout=900)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return code, records, log.read_text()


def setting(assignment: Mapping[str, str], dimension: str) -> str:
    return assignment.get(dimension, DIMENSIONS[dimension][0])


def uncovered(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The combinations of the dimensions these runs looked up that no run speaks for: a run speaks for
    every combination that agrees with its assignment on every dimension it looked up."""
    dims = sorted(
        {d for run in runs for d in run["looked_up"]} | {d for run in runs for d in run["assignment"]}
    )
    missing = []
    for values in itertools.product(*(DIMENSIONS[d] for d in dims)):
        combination = dict(zip(dims, values, strict=True))
        if not any(
            all(combination[d] == setting(run["assignment"], d) for d in run["looked_up"]) for run in runs
        ):
            missing.append(combination)
    return missing


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.proof
def test_every_combination_of_optional_parts_runs_every_chapter_without_a_failure(
    tmp_path: Path, group: str
) -> None:
    code, records, output = probe(tmp_path, "full", *(f"conformance/{c}/test_{c}.py" for c in GROUPS[group]))
    assert code in (0, 5), output  # 5: every case deselected or run by the probe (it reports nothing)
    cases = [r for r in records if r["case"] != "<session>"]
    assert cases, output
    broken = [
        f"{r['case']} with {describe(run['assignment'])}: {run['outcome']}: {run['message'][:300]}"
        for r in cases
        for run in r["runs"]
        if run["outcome"] in FAILING
    ]
    assert not broken, "\n".join(broken[:20])
    # A case that runs with every part but skips without some says which part (or which target) it lacks.
    silent = [
        f"{r['case']} with {describe(run['assignment'])}: {run['message'][:200]!r}"
        for r in cases
        if r["runs"][0]["outcome"] != "skipped"
        for run in r["runs"][1:]
        if run["outcome"] == "skipped" and not PART_REASON.search(run["message"])
    ]
    assert not silent, "skipped without naming the part:\n" + "\n".join(silent[:20])
    holes = {r["case"]: uncovered(r["runs"]) for r in cases}
    assert not any(holes.values()), {case: combos[:3] for case, combos in holes.items() if combos}
    # The numbers this proves, for the record (pytest -s shows them).
    explored = sum(len(r["runs"]) for r in cases)
    print(f"{group}: {len(cases)} cases, {explored} runs, 0 failures, every combination covered")


#: What a session's start looks up (configure: known_failures; sessionstart: preflight): the three other
#: settings than the chapter runs' own, each in a child of its own with one cheap case.
SESSION_SETTINGS = ["preflight=absent", "known_failures=empty", "preflight=absent,known_failures=empty"]
ONE_CASE = (
    "conformance/lowering/test_lowering.py::test_view_pass_verdicts[call-method-user/reads]"  # no compile
)


@pytest.mark.parametrize("spec", SESSION_SETTINGS)
@pytest.mark.proof
def test_every_combination_starts_a_session(tmp_path: Path, spec: str) -> None:
    code, records, output = probe(tmp_path, spec, ONE_CASE)
    assert code in (0, 5), output
    session = next(r for r in records if r["case"] == "<session>")
    assert set(session["looked_up"]) <= {"known_failures", "preflight"}, session
    (case,) = [r for r in records if r["case"] == ONE_CASE]
    assert all(run["outcome"] not in FAILING for run in case["runs"]), case
    if "preflight=absent" not in spec:
        assert "nothing to build (minimal backend)" in output  # the preflight ran and said so


def test_the_probe_sees_what_the_suite_can_see() -> None:
    """Every protocol attribute is one the minimal backend records; a missing one raises the
    AttributeError of a missing attribute (name and object set), which the suite turns into a skip."""
    from conformance.common.parts import PART_OF_ATTRIBUTE, missing_part_reason

    assert set(PART_OF_ATTRIBUTE) <= set(ATTRIBUTE_DIMENSION) | {"lowering_devices"}  # per target: below
    backend = MinimalBackend(parse("runtime_options=absent,lowers_cuda=no"))
    assert "cpu" in backend.lowering_devices
    assert backend.probe.looked_up == {"lowers_cpu"}  # it asked about one target: it learnt about that one
    assert list(backend.lowering_devices) == ["cpu"]
    assert backend.probe.looked_up == {"lowers_cpu", "lowers_cuda"}
    with pytest.raises(AttributeError) as missing:
        backend.get_option  # noqa: B018
    assert missing.value.name == "get_option"
    assert missing.value.obj is backend
    reason = missing_part_reason(backend, missing.value)
    assert reason == "backend 'minimal' does not implement protocol part 'runtime_options' " + (
        "(lacks ['set_option', 'get_option'])"
    )
    # Both sides: an AttributeError for another object, or for an attribute the backend has, is a failure.
    with pytest.raises(AttributeError) as other:
        object().get_option  # type: ignore[attr-defined]  # noqa: B018
    assert missing_part_reason(backend, other.value) is None
    assert missing_part_reason(backend, AttributeError("'x' object has no attribute 'execute'")) is None
    assert missing_part_reason(backend, ValueError("get_option")) is None


def test_the_suite_reads_lowering_devices_only_through_the_protocol_helper() -> None:
    """Why the probe need not try a backend without ``lowering_devices`` apart from one that lists both
    targets: ``protocol.lowering_devices()`` gives that default for it, and nothing else reads it."""
    import ast

    offenders = []
    for path in sorted((ROOT / "conformance").rglob("*.py")):
        if path.name == "protocol.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            named = isinstance(node, ast.Attribute) and node.attr == "lowering_devices"
            looked_up = isinstance(node, ast.Call) and any(
                isinstance(a, ast.Constant) and a.value == "lowering_devices" for a in node.args
            )
            if named or looked_up:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
    from conformance.protocol import DEFAULT_LOWERING_DEVICES, lowering_devices

    assert lowering_devices(object()) == DEFAULT_LOWERING_DEVICES == ("cpu", "cuda")
    assert lowering_devices(MinimalBackend()) == ("cpu", "cuda")


@pytest.mark.proof
def test_a_missing_part_reached_by_a_case_is_a_skip_naming_it(tmp_path: Path) -> None:
    """The safety net, end to end: a case that touches a part without asking for it first (one written for
    the purpose, run with the suite's conftest as a plugin) is skipped, the part named."""
    chapter = tmp_path / "test_touches_a_part.py"
    chapter.write_text(
        "def test_touches_the_runtime_option_without_asking(backend):\n"
        "    backend.get_option('skip_copy_output_to_cpu_for_method')\n"
    )
    log = tmp_path / "output.txt"
    backend = "--backend=tests.minimal_backends:runtime_options=absent"
    args = [str(chapter), "-p", "conformance.conftest", backend, "-p", "no:cacheprovider", "-rs"]
    args += ["--no-preflight", "--progress-every=0"]
    code = ChapterRun(args, ROOT, {**os.environ, "PYTHONPATH": str(ROOT)}, log).wait(timeout=300)
    output = log.read_text()
    assert code == 0, output
    assert "1 skipped" in output
    assert "does not implement protocol part 'runtime_options'" in output
