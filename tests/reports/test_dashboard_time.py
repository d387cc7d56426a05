"""Where a run's time went: the phase table from ``metadata["phases"]`` and case-seconds per chapter, on the
dashboard's run page and on the summary page, both from the one view model
(``reports.page_run.time_view``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.phases import Phase, phases_from_metadata, run_wall
from harness.results import merge_runs
from reports.dashboard import main
from reports.history import run_slug
from reports.inputs import LoadedRun
from reports.page_run import run_page, time_view
from reports.summary import render_summary
from tests.dashboard_samples import PHASES, case, sample_run, write_run


def test_phases_become_rows_with_their_share_of_the_end_to_end_time() -> None:
    run = sample_run(hostile=False, phases=True)
    time = time_view(run)
    assert time is not None
    assert run_wall(phases_from_metadata(run.metadata)) == 730.0  # the report ends at 725 + 5 s
    assert time.total == "730.0 s"
    rows = {row.name: row for row in time.phases}
    assert list(rows) == [p["name"] for p in PHASES]  # in the order the run stored them
    shared = rows["cases (shared GPU)"]
    assert (shared.start, shared.wall, shared.share, shared.detail) == (
        "5.000 s",
        "540.0 s",
        "74 %",
        "8 workers on 2 GPUs",
    )
    assert (rows["prelower"].start, rows["prelower"].share) == (
        "0 s",
        "25 %",
    )  # overlaps: shares need not add up
    assert rows["report"].share == "0.68 %"


def test_case_seconds_are_summed_per_chapter_most_expensive_first() -> None:
    run = sample_run(hostile=False, phases=True)
    run.cases = [
        dataclasses.replace(case("mm_out", "test_a", {"n": str(n)}, "passed"), duration_s=1.5)
        for n in range(4)
    ] + [
        dataclasses.replace(case("lowering", "test_b", {}, "passed"), duration_s=90.0),
        dataclasses.replace(case("runtime", "test_c", {}, "skipped"), duration_s=0.0),
    ]
    time = time_view(run)
    assert time is not None
    assert [(c.chapter, c.cases, c.seconds, c.share) for c in time.chapters] == [
        ("lowering", 1, "90.00 s", "94 %"),
        ("mm_out", 4, "6.000 s", "6.2 %"),
        ("runtime", 1, "0 s", "0 %"),
    ]
    assert time.case_seconds == "96.00 s"


def test_a_plain_pytest_run_has_no_phases_and_no_section(tmp_path: Path) -> None:
    run = sample_run(hostile=False)
    assert time_view(run) is None
    assert run_page(LoadedRun(run, []), None).time is None
    summary = render_summary(run)
    assert 'id="time"' not in summary
    assert "Where the time went" not in summary
    site = tmp_path / "site"
    assert main([str(write_run(tmp_path / "r.json", run)), "-o", str(site)]) == 0
    html = (site / "runs" / f"{run_slug(run.run_id)}.html").read_text(encoding="utf-8")
    assert 'id="time"' not in html
    assert 'href="#time"' not in html


def test_both_pages_show_the_same_phase_table(tmp_path: Path) -> None:
    run = sample_run(hostile=False, phases=True)
    site = tmp_path / "site"
    assert main([str(write_run(tmp_path / "r.json", run)), "-o", str(site)]) == 0
    dashboard = (site / "runs" / f"{run_slug(run.run_id)}.html").read_text(encoding="utf-8")
    summary = render_summary(run)
    for html in (dashboard, summary):
        assert 'id="time"' in html
        table = html[html.index('id="phases"') : html.index("</table>", html.index('id="phases"'))]
        assert (
            '<tr><td>cases (shared GPU)</td><td class="num">5.000 s</td><td class="num">540.0 s</td>'
            '<td class="num">74 %</td><td>8 workers on 2 GPUs</td></tr>'
        ) in table
        assert "total (end to end)" in table
        assert "730.0 s" in table
        chapters = html[html.index('class="chapter-seconds"') :]
        # The sample's 25 mm_out cases of 0.25 s each.
        assert '<tr><td>mm_out</td><td class="num">25</td><td class="num">6.250 s</td>' in chapters
    assert '<a href="#time">Time</a>' in dashboard


def test_phases_survive_merging_shards_into_one_page() -> None:
    one = sample_run(hostile=False, phases=True, run_id="r")
    two = dataclasses.replace(
        sample_run(hostile=False, phases=True, run_id="r"), cases=[case("runtime", "t", {}, "passed")]
    )
    merged = merge_runs([one, two])
    time = time_view(merged)
    assert time is not None
    assert time.total == "730.0 s"
    assert phases_from_metadata(merged.metadata)[0] == Phase("prelower", 180.0, "15 processes", 0.0)
