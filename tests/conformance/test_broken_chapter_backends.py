"""Every broken backend declared in ``tests/broken/*.py`` makes its chapter fail, naming the rules it
declares (``breaks``), and the reference passes the same selection. Each runs the real chapter in a
subprocess, as a user would (``run_chapter``), and reads the verdict from the result file. A declaration
whose proof lives in another self-test (``proven_by``) is checked to point at a test that exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _pytest.mark.expression import Expression

from harness.results import RunResult
from tests.conformance.test_suite_catches_broken_backends import run_chapter
from tests.rule_coverage import ROOT, BrokenBackend, broken_backends

BACKENDS = broken_backends()
RUN_HERE = [b for b in BACKENDS if b.breaks.proven_by is None]
PROVEN_ELSEWHERE = [b for b in BACKENDS if b.breaks.proven_by is not None]
#: Outcomes of a case that broke a rule: failed (must, or should under --strict-should), should-failed.
BROKE = ("failed", "should-failed", "error")
_RULES = re.compile(r"\[([^\[\]\s]+)\]")


def _args(broken: BrokenBackend) -> tuple[str, ...]:
    """The declared selection, with ``--strict-should`` where the broken rules are *should*."""
    return (*broken.breaks.select, *(("--strict-should",) if broken.breaks.strict_should else ()))


def _runnable_here(broken: BrokenBackend) -> bool:
    """Whether this machine runs the failing cases: CUDA where they need it, and enough GPUs."""
    if not broken.breaks.cuda:
        return True
    return torch.cuda.is_available() and torch.cuda.device_count() >= broken.breaks.gpus


def _skip_without_cuda(broken: BrokenBackend) -> None:
    if not _runnable_here(broken):
        gpus = f"{broken.breaks.gpus} CUDA devices" if broken.breaks.gpus > 1 else "CUDA"
        pytest.skip(
            f"{broken.spec} breaks {list(broken.breaks.rules)} only where {gpus} run the cases "
            f"({torch.cuda.device_count()} present)"
        )


def broke(run: RunResult) -> dict[str, str]:
    return {case.id: case.message for case in run.cases if case.outcome in BROKE}


@pytest.mark.parametrize("broken", RUN_HERE, ids=[b.spec.split(":")[1] for b in RUN_HERE])
@pytest.mark.proof
def test_chapter_fails_the_broken_backend_on_the_rules_it_breaks(
    tmp_path: Path, broken: BrokenBackend
) -> None:
    _skip_without_cuda(broken)
    code, run, output = run_chapter(tmp_path, broken.spec, *_args(broken), chapter=broken.breaks.chapter)
    assert code == 1, output
    failed = broke(run)
    assert failed, output
    declared = set(broken.breaks.rules)
    # A case the contract monitor failed first names the case's own rule after the monitor's: either counts.
    rules = {case.id: {case.rule, *_RULES.findall(case.message)} for case in run.cases if case.id in failed}
    assert all(named & declared for named in rules.values()), {c: (rules[c], failed[c]) for c in failed}
    named = {rule for message in failed.values() for rule in _RULES.findall(message)}
    assert declared <= named, f"declared but never failed: {sorted(declared - named)}"


def reference_selections() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Id -> (chapter, selection): one pytest selection covering every broken backend's cases in a chapter
    (one run per chapter: each run is a fresh interpreter importing torch, so fewer runs keep the
    self-tests fast). Selections judged on device-wide counters (``alone``) get a run of their own,
    id ``<chapter>-alone``, so the GPU run can give it the GPU to itself; those needing two GPUs get
    ``<chapter>-multi-gpu``, so a one-GPU run never selects cases it can only skip."""
    keywords: dict[tuple[str, str], list[str]] = {}
    for broken in RUN_HERE:
        if not _runnable_here(broken):
            continue
        select = list(broken.breaks.select)
        # ('-k', expr), then options that only change how a failure is reported (--generated-no-shrink):
        # the reference passes, so its run of the merged selection needs none of them.
        assert len(select) >= 2, f"{broken.spec}: select must be ('-k', expr, [--option ...])"
        assert select[0] == "-k", f"{broken.spec}: select must be ('-k', expr, [--option ...])"
        assert all(a.startswith("--") for a in select[2:]), f"{broken.spec}: options after the -k expression"
        suffix = "-alone" if broken.breaks.alone else "-multi-gpu" if broken.breaks.gpus > 1 else ""
        keywords.setdefault((broken.breaks.chapter, suffix), []).append(f"({select[1]})")
    return {
        chapter.split("/")[-1] + suffix: (chapter, ("-k", " or ".join(sorted(set(ks)))))
        for (chapter, suffix), ks in sorted(keywords.items())
    }


SELECTIONS = reference_selections()


@pytest.mark.parametrize("key", list(SELECTIONS))
@pytest.mark.proof
def test_reference_passes_each_selection(tmp_path: Path, key: str) -> None:
    """The same cases against the reference: a broken backend fails them for what it broke, not because
    the cases fail anyone (*should* rules included)."""
    chapter, selection = SELECTIONS[key]
    select = (*selection, "--strict-should")
    code, run, output = run_chapter(tmp_path, "reference_impl:BACKEND", *select, chapter=chapter)
    assert code == 0, output
    assert broke(run) == {}
    assert any(case.outcome == "passed" for case in run.cases), output


@pytest.mark.parametrize("broken", PROVEN_ELSEWHERE, ids=[b.spec.split(":")[1] for b in PROVEN_ELSEWHERE])
def test_proof_elsewhere_exists_and_runs_that_backend(broken: BrokenBackend) -> None:
    path, _, test = (broken.breaks.proven_by or "").partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    functions = {
        node.name: ast.get_source_segment(source, node)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef)
    }
    assert test in functions, f"{broken.breaks.proven_by} does not exist"
    attr = broken.spec.split(":")[1]
    module = broken.spec.split(":")[0].rsplit(".", 1)[1]
    assert attr in source or module in source, f"{path} never uses {broken.spec}"


@pytest.fixture(scope="module")
def collected() -> list[str]:
    """Every case id of the suite, as ``pytest --collect-only`` lists them (CUDA cases too: they are
    collected everywhere and skipped where no GPU runs them)."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "conformance", "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=300)
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids, proc.stdout + proc.stderr
    return ids


def selected(ids: list[str], chapter: str, expression: str) -> list[str]:
    """The cases of ``chapter`` that ``-k expression`` selects, matched as pytest's ``-k`` does: a
    case-insensitive substring of the case's name (with its parameters) or of its module's file name."""
    compiled = Expression.compile(expression)
    picked = []
    for case in ids:
        path, _, name = case.partition("::")
        if path != chapter:
            continue
        names = (name.lower(), Path(path).name.lower())
        if compiled.evaluate(lambda sub, *_, names=names, **__: any(sub.lower() in n for n in names)):
            picked.append(case)
    return picked


@pytest.mark.parametrize("broken", BACKENDS, ids=[b.spec.split(":")[1] for b in BACKENDS])
@pytest.mark.proof
def test_every_declared_selection_selects_cases(collected: list[str], broken: BrokenBackend) -> None:
    """On any machine: a selection that matches no case (a renamed test) would make the proof of a
    CUDA-only broken backend exit 5 on the GPU instead of failing it; caught here, before the GPU run."""
    select = list(broken.breaks.select)
    if not select:
        return
    assert select[0] == "-k", f"{broken.spec}: select must start with -k"
    assert selected(collected, broken.breaks.chapter, select[1]), (
        f"{broken.spec}: -k {select[1]!r} selects no case of {broken.breaks.chapter}"
    )
