"""The device-placement chapter fails backends that slip on placement, naming the rule, and passes the
reference. Each case runs the real chapter in a subprocess, as a user would, and reads the result file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conformance.test_suite_catches_broken_backends import run_chapter

CHAPTER = "conformance/device_placement/test_device_placement.py"
RUNTIME_OPTIONS = "conformance/runtime_options/test_runtime_options.py"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for this chapter")


def not_passed(run) -> dict[str, tuple[str, str]]:
    return {c.id: (c.outcome, c.message) for c in run.cases if c.outcome not in ("passed", "skipped")}


def test_reference_passes_the_placement_chapter(tmp_path: Path) -> None:
    code, run, output = run_chapter(
        tmp_path, "reference_impl:BACKEND", "-k", "validated or conflict", chapter=CHAPTER
    )
    assert code == 0, output
    assert not_passed(run) == {}
    assert sum(c.outcome == "passed" for c in run.cases) == 15


@pytest.mark.proof
def test_silently_dropped_unknown_methods_fail_validation(tmp_path: Path) -> None:
    """Upstream's ``propagate_device_config.get(name, ...)`` ignores a misspelt method: caught anywhere."""
    backend = "tests.broken.placement:DROPS_UNKNOWN_METHODS"
    code, run, output = run_chapter(tmp_path, backend, "-k", "validated", chapter=CHAPTER)
    assert code == 1, output
    bad = not_passed(run)
    assert len(bad) == 4, bad  # 2 keys x (unknown method, wrong case)
    assert all("unknown-method" in case or "misspelt-case" in case for case in bad), bad
    assert all(
        "[device_placement/validation]" in message and "succeeded" in message for _, message in bad.values()
    )


@needs_cuda
def test_host_inputs_accepted_for_a_device_input_method_fail(tmp_path: Path) -> None:
    backend = "tests.broken.placement:ACCEPTS_HOST_INPUTS"
    code, run, output = run_chapter(tmp_path, backend, "-k", "rejects_wrong_inputs and host", chapter=CHAPTER)
    assert code == 1, output
    bad = not_passed(run)
    assert list(bad) == [f"{CHAPTER}::test_device_input_method_rejects_wrong_inputs[host-tensor]"], bad
    assert "[device_placement/bad-input]" in next(iter(bad.values()))[1]


@needs_cuda
def test_pageable_copies_fail_the_pinned_memory_rule(tmp_path: Path) -> None:
    backend = "tests.broken.placement:COPIES_THROUGH_PAGEABLE_MEMORY"
    select = ("-k", "skip_copy_matrix and float32 and llm-unset", "--strict-should")
    code, run, output = run_chapter(tmp_path, backend, *select, chapter=RUNTIME_OPTIONS)
    assert code == 1, output
    bad = not_passed(run)
    assert bad, output
    assert all("[runtime_options/pinned-host-memory]" in message for _, message in bad.values()), bad
    assert all("Pageable" in message for _, message in bad.values()), bad
