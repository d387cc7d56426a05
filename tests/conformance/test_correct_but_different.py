"""The other side of every differential rule: a backend that differs from the reference only where the
contract allows it (``tests/different_backends.py``) passes the differential chapter's exhaustive round,
its state machine and its option calls, on the CPU target (never crying wolf at a backend not ours)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.test_suite_catches_broken_backends import run_chapter
from tests.different_backends import DIFFERENT

CHAPTER = "conformance/differential/test_differential.py"
SELECT = ("-k", "(every_argument or protocol_calls or execute_calls or option_calls) and not cuda")


@pytest.mark.proof
@pytest.mark.parametrize("spec", DIFFERENT, ids=[s.split(":")[1].lower() for s in DIFFERENT])
def test_a_correct_but_different_backend_passes(tmp_path: Path, spec: str) -> None:
    code, run, output = run_chapter(tmp_path, spec, *SELECT, "--generated-no-shrink", chapter=CHAPTER)
    assert code == 0, output
    assert [c.id for c in run.cases if c.outcome not in ("passed", "skipped")] == [], output
    assert sum(c.outcome == "passed" for c in run.cases) >= 4, output
