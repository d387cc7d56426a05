"""Side by side: two runs (usually two backends) compared case by case, and the page that shows it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.results import CaseResult, load_results, new_run
from reports.compare import SIDE_BY_SIDE_GROUPS, side_by_side, side_by_side_group
from reports.dashboard import main
from reports.history import run_slug
from reports.inputs import LoadedRun
from reports.matrix import build_matrices
from reports.page_run import run_page
from reports.page_side_by_side import side_by_side_page
from tests.dashboard_samples import HOSTILE, other_backend_run, sample_run, write_run


def case(name: str, outcome: str, chapter: str = "mm_out", worker: str | None = None) -> CaseResult:
    return CaseResult(
        id=f"conformance/{chapter}/test_{chapter}.py::{name}",
        chapter=chapter,
        params={},
        outcome=outcome,
        message=f"{outcome} message",
        repro="python -m pytest x",
        duration_s=0.002,
        worker=worker,
    )


@pytest.mark.parametrize(
    ("a", "b", "group"),
    [
        ("passed", "passed", "same"),
        ("failed", "failed", "same"),
        ("failed", "passed", "only_a_fails"),
        ("crashed", "skipped", "only_a_fails"),
        ("xpassed", "should-failed", "only_a_fails"),
        ("passed", "error", "only_b_fails"),
        ("coverage", "failed", "only_b_fails"),
        ("failed", "crashed", "different"),  # both fail, differently
        ("passed", "skipped", "different"),
        ("passed", "should-failed", "different"),  # a should rule is not "fails"
        ("xfailed", "coverage", "different"),
        ("passed", None, "only_in_a"),
        (None, "failed", "only_in_b"),
    ],
)
def test_groups(a: str | None, b: str | None, group: str) -> None:
    assert side_by_side_group(a, b) == group


def test_every_case_id_lands_once_in_group_order() -> None:
    a = [
        case("t_same", "passed"),
        case("t_a_fails", "failed"),
        case("t_b_fails", "passed"),
        case("t_only_a", "skipped", chapter="lowering"),
        case("t_diff", "passed"),
        # Shards: the same id twice; the worst outcome speaks for it.
        case("t_sharded", "passed", worker="shard1/gw0"),
        case("t_sharded", "crashed", worker="shard2/gw0"),
    ]
    b = [
        case("t_b_fails", "error"),
        case("t_same", "passed"),
        case("t_a_fails", "passed"),
        case("t_diff", "should-failed"),
        case("t_only_b", "failed"),
        case("t_sharded", "passed"),
    ]
    rows = side_by_side(a, b)
    assert [(r.id.split("::")[1], r.group) for r in rows] == [
        ("t_a_fails", "only_a_fails"),
        ("t_sharded", "only_a_fails"),
        ("t_b_fails", "only_b_fails"),
        ("t_diff", "different"),
        ("t_only_a", "only_in_a"),
        ("t_only_b", "only_in_b"),
        ("t_same", "same"),
    ]
    sharded = next(r for r in rows if r.id.endswith("t_sharded"))
    assert sharded.a is not None
    assert sharded.a.outcome == "crashed"
    only_b = next(r for r in rows if r.group == "only_in_b")
    assert only_b.a is None
    assert only_b.b is not None
    assert {r.group for r in rows} <= set(SIDE_BY_SIDE_GROUPS)


def test_page_model_names_both_backends_and_counts_every_group() -> None:
    a, b = sample_run(hostile=False), other_backend_run()
    page = side_by_side_page(LoadedRun(a, ["a.json"]), LoadedRun(b, ["b.json"]), "../runs/a.html")
    assert (page.a.name, page.a.version, page.a.href) == ("reference_impl", "0.1.0", "../runs/a.html")
    assert (page.b.name, page.b.version, page.b.href) == (f"executorch {HOSTILE}", "1.5.1", "")
    counts = {key: n for key, _, n in page.group_counts}
    assert list(counts) == list(SIDE_BY_SIDE_GROUPS)
    assert counts == {
        "only_a_fails": 1,  # the multi_method error, which passes in B
        "only_b_fails": 1,  # float32 1x64x48 row, which fails in B
        "different": 2,  # a should-failed and a coverage gap in B where A passed
        "only_in_a": 1,  # the crashed case B does not have
        "only_in_b": 3,  # B's two hostile cases and its known failure
        "same": 41,
    }
    assert sum(counts.values()) == page.total
    assert [g.key for g in page.groups] == [k for k in SIDE_BY_SIDE_GROUPS if counts[k]]
    same = next(g for g in page.groups if g.key == "same")
    assert same.open is (len(same.rows) <= 50)
    row = next(r for g in page.groups for r in g.rows if r.id.endswith("[float32-1x64x48-row]"))
    assert (row.a.outcome, row.b.outcome) == ("passed", "failed")
    assert row.b.message == f"[mm_out/values] {HOSTILE}"
    assert row.a.duration == "250.0 ms"  # the shared number formatter
    # B's figures against A's (same suite, name and metric): the benchmark comparison machinery.
    assert page.metrics
    assert {m.verdict for m in page.metrics} <= {"same", "ambiguous", "slower", "faster", "changed", "n/a"}


def test_run_page_lists_should_known_and_coverage_apart() -> None:
    run = other_backend_run()
    run.metadata["warnings"] = [f"known-failures: case 'x' matches no collected case {HOSTILE}"]
    page = run_page(LoadedRun(run, ["b.json"]), None)
    assert [p.case.outcome for p in page.should_failures] == ["should-failed"]
    assert [p.case.outcome for p in page.coverage_gaps] == ["coverage"]
    known = [p for p in page.known_failures if p.known]
    assert len(known) == 1
    assert known[0].known.reason.startswith("fp16 conv accumulates")
    assert known[0].known.href == ""  # a javascript: link is shown as text, never as a link
    assert all(p.case.outcome in ("crashed", "error", "failed", "xpassed") for p in page.problems)
    anchors = [p.anchor for p in (*page.problems, *page.should_failures, *page.known_failures)]
    assert len(anchors) == len(set(anchors))
    assert page.warnings == run.metadata["warnings"]
    statuses = {
        cell.status for m in build_matrices(run.cases) for row in m.rows for cell in row.cells if cell.total
    }
    assert {"should", "coverage", "known"} <= statuses


def test_dashboard_writes_the_page_with_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "ref.json", sample_run())
    b = write_run(tmp_path / "upstream.json", other_backend_run())
    site = tmp_path / "site"
    assert main([str(a), "--side-by-side", str(b), "-o", str(site)]) == 0
    run_a = load_results(a)
    pages = list((site / "compare").glob("*.html"))
    assert [p.name for p in pages] == [f"{run_slug(run_a.run_id)}--vs--upstream-run-1.html"]
    html = pages[0].read_text(encoding="utf-8")
    assert HOSTILE not in html  # autoescaped
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    assert 'id="only-a-fails"' in html
    assert 'id="only-b-fails"' in html
    assert "1.5.1" in html
    assert f'href="../runs/{run_slug(run_a.run_id)}.html"' in html
    index = (site / "index.html").read_text(encoding="utf-8")
    assert f'href="compare/{pages[0].name}"' in index
    assert "wrote" in capsys.readouterr().out


def test_two_backends_in_one_build_get_the_page_automatically(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a.json", sample_run())
    b = write_run(tmp_path / "b.json", other_backend_run())
    assert main([str(a), str(b), "-o", str(tmp_path / "site")]) == 0
    assert len(list((tmp_path / "site" / "compare").glob("*--vs--upstream-run-1.html"))) == 1
    # Two runs of one backend: a history, not a comparison of backends.
    c = write_run(tmp_path / "c.json", sample_run(started_at="2025-06-03T09:30:00+00:00"))
    assert main([str(a), str(c), "-o", str(tmp_path / "site2")]) == 0
    assert not (tmp_path / "site2" / "compare").exists()


def test_unreadable_side_by_side_input_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "a.json", sample_run())
    assert main([str(a), "--side-by-side", str(tmp_path / "missing.json"), "-o", str(tmp_path / "s")]) == 2
    assert "side by side:" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_old_result_files_still_render(tmp_path: Path) -> None:
    run = dataclasses.replace(new_run({}, {}), schema_version=1, cases=[case("t", "failed")], complete=True)
    path = write_run(tmp_path / "old.json", run)
    text = path.read_text(encoding="utf-8")
    assert '"schema_version": 1' in text
    assert main([str(path), "-o", str(tmp_path / "site")]) == 0
