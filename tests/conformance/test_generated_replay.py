"""A failing generated case names the suite's own replay option, never an edit of the test (issue 48 item 3):
its message says ``--generated-replay=BLOB``, and the case's repro with that option fails again the same way
on the same example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conformance.test_suite_catches_broken_backends import run_chapter

CHAPTER = "conformance/differential/test_differential.py"
BROKEN = "tests.broken.surface:OPTIONS_PER_THREAD"


@pytest.mark.proof
def test_a_generated_failure_replays_with_the_option_its_message_names(tmp_path: Path) -> None:
    found, again_dir = tmp_path / "found", tmp_path / "again"
    found.mkdir()
    again_dir.mkdir()
    code, run, output = run_chapter(found, BROKEN, "-k", "option_calls", chapter=CHAPTER)
    assert code == 1, output
    (case,) = [c for c in run.cases if c.outcome == "failed"]
    assert "@reproduce_failure" not in case.message + output
    blob = re.search(r"--generated-replay=(\S+)", case.message)
    assert blob is not None, case.message
    replay = f"--generated-replay={blob.group(1)}"
    code, again, output = run_chapter(
        tmp_path / "again", BROKEN, "-k", "option_calls", replay, chapter=CHAPTER
    )
    assert code == 1, output
    (replayed,) = [c for c in again.cases if c.outcome == "failed"]
    assert replayed.rule == case.rule == "differential/option-read-back"
    assert replayed.message.splitlines()[0] == case.message.splitlines()[0]
