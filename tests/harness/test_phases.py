"""The per-phase table of a run: parsed from the front door's flags, stored in every shard so a merged run
keeps it, and printed with each chapter's case-seconds."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from harness import phases
from harness.results import load_results, merge_runs, new_run_id
from tests.dashboard_samples import sample_run, write_run


def test_phase_flag_parses_name_seconds_and_detail() -> None:
    assert phases.parse_phase("prelower@1.5=71.5=54 programs, 15 processes") == phases.Phase(
        "prelower", 71.5, "54 programs, 15 processes", 1.5
    )
    assert phases.parse_phase("report=0.2") == phases.Phase("report", 0.2, "", 0.0)


@pytest.mark.parametrize(
    "bad", ["prelower", "=3", "prelower=", "prelower=soon", "prelower=-1", "prelower@-2=3", "prelower@x=3"]
)
def test_bad_phase_flag_names_the_form(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"NAME\[@START\]=SECONDS\[=DETAIL\]"):
        phases.parse_phase(bad)


def test_phases_survive_merging_the_shards_and_a_missing_shard_is_left_alone(tmp_path: Path) -> None:
    run_id = "20261123T120000Z-1-conformance"
    main = write_run(tmp_path / "conformance.json", dataclasses.replace(sample_run(), run_id=run_id))
    alone = write_run(
        tmp_path / "conformance-exclusive.json", dataclasses.replace(sample_run(), run_id=run_id)
    )
    crashed = tmp_path / "conformance-multi-gpu.json"  # only a journal: not rewritten
    table = [phases.Phase("prelower", 70.0, "cuda+cpu"), phases.Phase("cases (shared GPU)", 40.0, "", 2.5)]
    assert phases.store_phases([main, alone, crashed], table) == [main, alone]
    assert not crashed.exists()
    merged = merge_runs([load_results(main), load_results(alone)])
    assert phases.phases_from_metadata(merged.metadata) == table


def test_table_shows_share_of_the_total_and_chapter_case_seconds(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.json", sample_run())
    chapters = phases.chapter_seconds([path, tmp_path / "absent.json"])
    run = load_results(path)
    assert chapters == pytest.approx(
        {c: sum(x.duration_s for x in run.cases if x.chapter == c) for c in {x.chapter for x in run.cases}}
    )
    # prelower overlaps the cases: the run is 100 s end to end, not the 130 s the phases sum to
    run = [phases.Phase("prelower", 40.0, "", 0.0), phases.Phase("cases", 90.0, "8 workers", 10.0)]
    assert phases.run_wall(run) == 100.0
    text = phases.format_table(run, chapters)
    assert "prelower" in text
    assert "40%" in text
    assert "90%" in text
    assert "100.0s" in text
    assert all(name in text for name in chapters)


def test_shards_of_one_run_share_the_front_doors_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFORMANCE_RUN_ID", "20261123T120000Z-1-conformance")
    assert new_run_id() == "20261123T120000Z-1-conformance"
    monkeypatch.delenv("CONFORMANCE_RUN_ID")
    assert new_run_id() != new_run_id()


def test_a_shards_timeline_says_when_its_cases_ran_within_its_phase(tmp_path: Path) -> None:
    run = sample_run()
    path = tmp_path / "shard.json"
    run.metadata[phases.TIMELINE_KEY] = {
        "session_start": 1000.5,
        "first_case": 1004.0,
        "last_case_end": 1030.0,
        "workers_done": 1031.0,
        "final_write": 1032.0,
    }
    write_run(path, run)
    words = phases.case_window_words(path, 1000.0, 1033.5)
    assert words == "cases from +4.0 s to -3.5 s (workers done -2.5 s)"
    run.metadata[phases.TIMELINE_KEY]["workers_done"] = None  # no xdist
    write_run(path, run)
    assert phases.case_window_words(path, 1000.0, 1033.5) == "cases from +4.0 s to -3.5 s"
    run.metadata[phases.TIMELINE_KEY]["first_case"] = None  # no case ran
    write_run(path, run)
    assert phases.case_window_words(path, 1000.0, 1033.5) is None
    assert phases.case_window_words(tmp_path / "missing.json", 1000.0, 1033.5) is None


def test_a_timeline_keeps_the_earliest_start_and_the_latest_stop_and_the_collections_span() -> None:
    line = phases.Timeline(session_start=10.0)
    line.case_ran(12.0, 13.0)
    line.case_ran(11.5, 12.5)
    line.case_ran(None, "not a time")  # a report without times changes nothing
    line.collected(11.2)
    line.collected(10.9)
    assert line.to_json(final_write=14.0) == {
        "session_start": 10.0,
        "first_collected": 10.9,
        "last_collected": 11.2,
        "first_case": 11.5,
        "last_case_end": 13.0,
        "workers_done": None,
        "final_write": 14.0,
    }
