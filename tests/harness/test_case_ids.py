"""Case ids stored before the chapters were folders (``conformance/test_<chapter>.py::...``) keep naming their
cases: the one mapping (``harness/case_ids.py``), and each reader of stored ids that goes through it — the
known-failures matcher, the recorded case seconds, the comparison with an older run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.catalogue.chapters import CHAPTERS
from conformance.suite.known_failures import KnownFailure, first_match, load_file
from harness.case_ids import current_case_id
from harness.case_order import SCHEMA, load_seconds
from harness.results import CaseResult
from reports.compare import align_cases, compare_cases

ROOT = Path(__file__).resolve().parents[2]
CASE = "test_bad_inputs_are_rejected_and_change_nothing[one-input-fewer-cpu-program]"
OLD = f"conformance/test_bad_inputs.py::{CASE}"
NEW = f"conformance/bad_inputs/test_bad_inputs.py::{CASE}"


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_chapters_old_id_maps_to_its_folder(chapter: str) -> None:
    """The mapping's rule and the chapters' folders agree, chapter by chapter."""
    today = CHAPTERS[chapter].relative_to(ROOT).as_posix()
    assert current_case_id(f"conformance/test_{chapter}.py::test_x[a-b]") == f"{today}::test_x[a-b]"
    assert current_case_id(f"conformance/test_{chapter}.py") == today
    assert current_case_id(f"{today}::test_x") == f"{today}::test_x"  # today's ids stay as they are


def test_a_glob_over_old_chapter_files_maps_to_one_over_the_folders() -> None:
    pattern = current_case_id("conformance/test_*.py::test_pipeline_*[*asr-*]")
    assert pattern == "conformance/*/test_*.py::test_pipeline_*[*asr-*]"
    entry = KnownFailure("conformance/test_*.py::test_pipeline_*[*asr-*]", None, "r", "", "x")
    assert entry.matches_case("conformance/multi_method/test_multi_method.py::test_pipeline_x[cpu-asr-f]")


@pytest.mark.parametrize(
    "other",
    ["tests/conformance/test_mm_out.py::t", "conformance/models/test_x.py::t", "test_mm_out.py::t", ""],
)
def test_other_ids_stay_as_they_are(other: str) -> None:
    assert current_case_id(other) == other


def test_an_old_path_known_failure_still_matches_its_moved_case(tmp_path: Path) -> None:
    stored = tmp_path / "known.toml"
    stored.write_text(
        '[[known_failures]]\ncase = "conformance/test_bad_inputs.py::test_bad_inputs_are_rejected_and_change_'
        'nothing[*-cpu-program]"\nrule = "inputs/*"\nreason = "written before the chapter folders"\n',
        encoding="utf-8",
    )
    entries = load_file(stored)
    assert first_match(entries, NEW, "inputs/count") is entries[0]
    assert first_match(entries, OLD, "inputs/count") is entries[0]  # as written, too
    assert first_match(entries, NEW.replace("bad_inputs/test_bad", "mm_out/test_bad"), "inputs/count") is None
    today = KnownFailure(NEW, None, "r", "", "x")
    assert today.matches_case(NEW)
    assert not today.matches_case(NEW.replace("[one", "[two"))


def test_recorded_case_seconds_of_old_ids_read_as_todays(tmp_path: Path) -> None:
    recorded = tmp_path / "case_seconds.json"
    recorded.write_text(json.dumps({"schema": SCHEMA, "seconds": {OLD: 3.5}}), encoding="utf-8")
    assert load_seconds(recorded)[NEW] == 3.5


def _case(case_id: str, outcome: str) -> CaseResult:
    return CaseResult(case_id, "bad_inputs", {}, outcome, "", "", 0.1, None)


def test_an_older_runs_ids_compare_with_todays() -> None:
    """``nox -s compare`` against a run from before the folders: the same case, no lost or new cases."""
    before = [_case(OLD, "passed"), _case("conformance/test_mm_out.py::t", "passed")]
    now = [_case(NEW, "failed"), _case("conformance/mm_out/test_mm_out.py::t", "passed")]
    assert [(c.id, c.change) for c in compare_cases(now, before)] == [(NEW, "newly_failing")]
    assert all(row.agree or row.id == NEW for row in align_cases(before, now))
    assert len(align_cases(before, now)) == 2
