"""The dashboard: pages and their content, shard merging, history, escaping, incomplete runs, bad inputs."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import jinja2
import pytest

from harness.formatting import show_metric, show_quantity
from harness.results import SCHEMA_VERSION, dumps_run, load_results
from reports import charts
from reports.dashboard import main
from reports.history import run_slug
from reports.matrix import build_matrices, case_row_label, natural_key
from reports.site import environment
from tests.dashboard_samples import (
    HOSTILE,
    HOSTILE_IMG,
    baseline_run,
    benchmarks,
    case,
    sample_run,
    sweep,
    write_interrupted,
    write_run,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


class TagCollector(HTMLParser):
    """Element names and event-handler attributes, as a browser's parser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.handlers: list[tuple[str, str]] = []

    @classmethod
    def of(cls, html: str) -> TagCollector:
        collector = cls()
        collector.feed(html)
        return collector

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.names.append(tag)
        self.handlers += [(tag, name) for name, _ in attrs if name.startswith("on")]


def run_pages(site: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted((site / "runs").glob("*.html"))}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One realistic build shared by the read-only tests: a run, an interrupted run, a baseline, history."""
    root = tmp_path_factory.mktemp("dash")
    results = root / "results"
    results.mkdir()
    run = sample_run()
    write_run(results / "conformance.json", run)
    write_interrupted(results / "killed.json")
    (results / "conformance.junit.xml").write_text("<testsuites/>", encoding="utf-8")
    base = write_run(root / "baseline.json", baseline_run())
    site, history = root / "site", root / "history"
    code = main([str(results), "-o", str(site), "--baseline", str(base), "--history", str(history)])
    return {"code": code, "site": site, "history": history, "run": run, "root": root}


def page_of(built: dict[str, object], run_id: str) -> str:
    return (Path(str(built["site"])) / "runs" / f"{run_slug(run_id)}.html").read_text(encoding="utf-8")


def test_build_writes_index_and_one_page_per_run(built) -> None:
    site = Path(str(built["site"]))
    assert built["code"] == 0  # a regression without --fail-on-regression does not fail the build
    assert (site / "index.html").exists()
    assert len(run_pages(site)) == 2


def test_run_page_shows_environment_matrix_failures_skips_benchmarks_traffic(built) -> None:
    html = page_of(built, built["run"].run_id)
    # Environment: GPUs with UUIDs, driver, torch, CUDA, host.
    for fact in (
        "GPU-5f1c0a2e-7b3d-4c1e-9a8f-100000000000",
        "580.65.06",
        "2.13.0+cu130",
        "13.0",
        "gpu-node-1",
    ):
        assert fact in html
    assert "140.4 GiB" in html
    # Matrix: chapters, dtype columns, shape and model rows, a failing cell linking to its failure.
    assert 'id="matrix"' in html
    for label in ("mm_out", "multi_method", "257x129x65", "tiny_llm", "bfloat16", "test_options_roundtrip"):
        assert f">{label}<" in html
    assert re.search(r'<a class="cell fail" href="#case-\d+" title="1 passed, 1 failed">1/2</a>', html)
    assert '<span class="cell crash" ' in html or '<a class="cell crash" ' in html
    assert '<span class="cell skip" title="2 skipped">2 skipped</span>' in html
    # The legend says what a cell counts, as the cells do: passed/run, skipped apart.
    legend = html[html.index('id="matrix"') : html.index('<div class="matrix-grid">')]
    assert "passed/run" in legend
    assert "failing/total" not in html
    assert '<span class="cell pass">2/2 <small class="skips">+1 skipped</small></span>' in legend
    # Failures: crash first, with the message in <pre> and the one-line repro.
    failures = html[html.index('id="failures"') : html.index('id="skips"')]
    assert failures.index(">crashed<") < failures.index(">failed<")
    assert "<pre>worker &#39;gw1&#39; crashed while running this case (signal 11: SIGSEGV)</pre>" in failures
    assert (
        "<code>python -m pytest &#39;conformance/multi_method/test_multi_method.py::"
        "test_kv_cache_stays_on_gpu[bfloat16-tiny_llm]&#39; -p harness.pytest_plugin</code>" in failures
    )
    assert '<button class="copy" type="button">Copy</button>' in failures
    # Skips grouped by reason, with a count.
    skips = html[html.index('id="skips"') : html.index('id="benchmarks"')]
    assert '<span class="badge skipped">2</span> <span class="reason">large shapes need 40 GiB' in skips
    # Benchmarks: every metric as value ± spread with unit; verdicts against the baseline; charts.
    bench = html[html.index('id="benchmarks"') : html.index('id="traffic"')]
    assert '<span class="value">1.312 ms</span><span class="spread-line">± 0.013 · n=50</span>' in bench
    assert "TFLOP/s" in bench
    assert "×" in bench
    for verdict in ("slower", "faster", "ambiguous"):
        assert f">{verdict}<" in bench
    assert "throttle_reasons: sw_thermal" in bench
    if charts.available():
        assert bench.count('<svg class="chart"') >= 3
    else:  # matplotlib is optional at run time: the page says the charts are missing, and why
        assert "matplotlib is not installed" in bench
    # Traffic: scaled bytes, and "unsupported" shown as such rather than as a number.
    traffic = html[html.index('id="traffic"') : html.index('id="baseline"')]
    assert "KiB" in traffic
    assert "GB/s" in traffic
    assert "unsupported: NVML field not available" in traffic
    # Baseline section: the newly failing case is named.
    assert "newly failing" in html
    assert (
        "test_values_match_float64_reference[bfloat16-257x129x65-col]" in html[html.index('id="baseline"') :]
    )


def test_incomplete_run_renders_with_a_banner(built) -> None:
    pages = run_pages(Path(str(built["site"])))
    incomplete = [html for html in pages.values() if 'id="incomplete-banner"' in html]
    assert len(incomplete) == 1
    html = incomplete[0]
    assert "rebuilt from its journal" in html
    assert "gpu-node-2" in html
    assert '<div class="tile"><div class="n">20</div><div class="l">cases</div></div>' in html
    complete_page = page_of(built, built["run"].run_id)
    assert 'id="incomplete-banner"' not in complete_page


def test_index_lists_runs_newest_first_with_verdicts(built) -> None:
    index = (Path(str(built["site"])) / "index.html").read_text(encoding="utf-8")
    rows = index[index.index("<tbody>") :]
    assert rows.index("2025-06-03 10:00 UTC") < rows.index("2025-06-02 09:30 UTC")
    assert rows.count("this build") == 2
    assert ">incomplete<" in rows
    assert ">regression<" in rows
    assert "2× NVIDIA H200" in rows
    assert f'href="runs/{run_slug(built["run"].run_id)}.html"' in rows
    assert ('<svg class="chart"' in index) == charts.available()  # outcome history chart


def test_junit_files_are_skipped_without_error(built) -> None:
    assert built["code"] == 0


def test_hostile_strings_are_escaped_everywhere(built) -> None:
    site = Path(str(built["site"]))
    for path in [site / "index.html", *(site / "runs").glob("*.html")]:
        html = path.read_text(encoding="utf-8")
        assert HOSTILE not in html, path
        tags = TagCollector.of(html)
        assert "img" not in tags.names, path
        assert tags.names.count("script") <= 1, path  # our own copy-button script only
        assert not tags.handlers, path  # no on*= attribute on any element
    html = page_of(built, built["run"].run_id)
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html


def test_pages_are_self_contained_and_pin_their_script_by_hash(built) -> None:
    html = page_of(built, built["run"].run_id)
    assert "<link" not in html
    assert not re.search(r'(src|href)="(https?:)?//', html)
    script = re.search(r"<script>(.*?)</script>", html, re.S)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode("utf-8")).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in html
    assert "default-src 'none'" in html


def test_jinja_environment_escapes_and_is_strict() -> None:
    env = environment()
    assert env.autoescape is True
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_history_accumulates_and_keeps_verdicts(tmp_path: Path) -> None:
    history, site = tmp_path / "history", tmp_path / "site"
    first = write_run(tmp_path / "a.json", sample_run(started_at="2025-06-01T08:00:00+00:00", hostile=False))
    base = write_run(tmp_path / "base.json", baseline_run())
    assert main([str(first), "-o", str(site), "--history", str(history), "--baseline", str(base)]) == 0
    second = write_run(tmp_path / "b.json", sample_run(started_at="2025-06-02T08:00:00+00:00", hostile=False))
    assert main([str(second), "-o", str(site), "--history", str(history)]) == 0
    # Building the second run again must not duplicate it.
    assert main([str(second), "-o", str(site), "--history", str(history)]) == 0
    assert len(list(history.glob("*.dashboard.json"))) == 2
    assert len(run_pages(site)) == 2
    index = (site / "index.html").read_text(encoding="utf-8")
    assert index.index("2025-06-02 08:00") < index.index("2025-06-01 08:00")
    assert index.count(">this build<") == 1
    assert ">regression<" in index  # the first run's verdict, recorded when it was added, is still shown
    # History entries are ordinary result files.
    stored = load_results(history / f"{run_slug(load_results(second).run_id)}.json")
    assert len(stored.cases) == len(load_results(second).cases)


def test_unreadable_history_entries_are_skipped_with_a_warning(tmp_path: Path, capsys) -> None:
    history = tmp_path / "history"
    history.mkdir()
    (history / "broken.json").write_text("{", encoding="utf-8")
    run = write_run(tmp_path / "a.json", sample_run(hostile=False))
    assert main([str(run), "-o", str(tmp_path / "site"), "--history", str(history)]) == 0
    assert "history entry skipped" in capsys.readouterr().err
    assert "broken.json" in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")


def test_shards_of_one_run_merge_and_show_where_each_ran(tmp_path: Path) -> None:
    one = sample_run(host="gpu-node-1", hostile=False, run_id="20250602T093000Z-abc123")
    two = sample_run(host="gpu-node-7", hostile=False, run_id="20250602T093000Z-abc123")
    two = dataclasses.replace(two, cases=[case("runtime", "test_shard_two", {}, "passed")], benchmarks=[])
    paths = [write_run(tmp_path / "shard-0.json", one), write_run(tmp_path / "shard-1.json", two)]
    site = tmp_path / "site"
    assert main([*map(str, paths), "-o", str(site)]) == 0
    pages = run_pages(site)
    assert list(pages) == ["20250602T093000Z-abc123.html"]
    html = pages["20250602T093000Z-abc123.html"]
    shards = html[html.index('id="shards"') :]
    for fact in ("shard-0.json", "shard-1.json", "gpu-node-1", "gpu-node-7"):
        assert fact in shards
    assert "GPU-5f1c0a2e-7b3d-4c1e-9a8f-700000000000" in html
    assert ">test_shard_two<" in html  # the second shard's case, in the matrix
    assert f'<div class="n">{len(one.cases) + 1}</div>' in html


def test_merge_flag_joins_runs_with_different_ids(tmp_path: Path) -> None:
    conformance = write_run(tmp_path / "conformance.json", sample_run(hostile=False))
    bench_run = dataclasses.replace(sample_run(hostile=False), cases=[])
    bench = write_run(tmp_path / "bench.json", bench_run)
    assert main([str(conformance), str(bench), "-o", str(tmp_path / "separate")]) == 0
    assert len(run_pages(tmp_path / "separate")) == 2
    assert main([str(conformance), str(bench), "--merge", "-o", str(tmp_path / "merged")]) == 0
    assert len(run_pages(tmp_path / "merged")) == 1


def test_default_inputs_are_results_json_into_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "results").mkdir()
    write_run(tmp_path / "results" / "conformance.json", sample_run(hostile=False))
    (tmp_path / "results" / "conformance.junit.xml").write_text("<testsuites/>", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    assert (tmp_path / "site" / "index.html").exists()


BAD_FILES = {
    "truncated.json": lambda text: text[: len(text) // 2],
    "foreign.json": lambda text: json.dumps({"schema": "someone-elses-format", "data": []}),
    "future.json": lambda text: text.replace(f'"schema_version": {SCHEMA_VERSION}', '"schema_version": 99'),
    "garbage.json": lambda text: "\x00\x01 not json at all",
    "wrong-type.json": lambda text: text.replace('"complete": true', '"complete": "yes"'),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_alone_exits_2_naming_it_and_writes_nothing(tmp_path: Path, name: str, capsys) -> None:
    bad = tmp_path / name
    bad.write_text(BAD_FILES[name](dumps_run(sample_run(hostile=False))), encoding="utf-8")
    assert main([str(bad), "-o", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("error: ")
    assert str(bad) in err
    assert not (tmp_path / "site").exists()


def test_missing_file_and_empty_directory_exit_2(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "nope.json"), "-o", str(tmp_path / "site")]) == 2
    assert "nope.json" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "-o", str(tmp_path / "site")]) == 2
    assert "no result files" in capsys.readouterr().err


def test_bad_file_beside_good_ones_renders_the_rest_and_still_exits_2(tmp_path: Path, capsys) -> None:
    good = write_run(tmp_path / "good.json", sample_run(hostile=False))
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "aoti-conformance-results", "schema_version": 1, "ru', encoding="utf-8")
    assert main([str(good), str(bad), "-o", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(bad) in err
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'id="load-errors"' in index
    assert "bad.json" in index
    assert len(run_pages(tmp_path / "site")) == 1


def test_cli_runs_as_a_module_and_never_imports_the_backend_or_suite(tmp_path: Path) -> None:
    result = write_run(tmp_path / "r.json", sample_run(hostile=False))
    code = (
        "import sys, runpy; sys.argv = ['reports.dashboard', sys.argv[1], '-o', sys.argv[2]]\n"
        "try:\n    runpy.run_module('reports.dashboard', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('reference_impl', 'conformance')]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(result), str(tmp_path / "site")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_odd_but_schema_valid_content_still_renders(tmp_path: Path) -> None:
    """The schema fixes only top-level types: whatever a backend puts deeper must not break a page."""
    run = sample_run(hostile=False)
    run = dataclasses.replace(
        run,
        environment={"gpus": "lots", "env": ["x"], "hostname": 5, "cpu_count": "many", "shards": "x"},
        metadata={"backend": 7, "shards": {"a": 1}, "incomplete_reason": ["?"]},
        benchmarks=[
            {"suite": None, "metrics": {"t": "fast"}, "params": [1, 2], "conditions": "hot"},
            {"metrics": {"t": {"value": "x", "unit": 5, "spread": "y", "better": "up"}}, "primary": ["t"]},
            {"suite": "s", "metrics": {"t": {"value": float("inf"), "unit": "s"}}, "extra": {"k": [1]}},
            {"suite": "s", "metrics": {"t": {"value": True, "unit": "s", "spread": None}}},
        ],
        traffic=[{}],
    )
    site = tmp_path / "site"
    assert main([str(write_run(tmp_path / "odd.json", run)), "-o", str(site)]) == 0
    html = run_pages(site)[f"{run_slug(run.run_id)}.html"]
    assert "lots" not in html  # a string is not a list of GPUs
    assert "extra=k=1" in html


# ---------------------------------------------------------------------------------------------- pieces


def test_matrix_rows_and_columns_fall_back_gracefully() -> None:
    cases = [
        case("mm_out", "test_a", {"dtype": "float16", "shape": "33x17x9"}, "passed"),
        case("mm_out", "test_a", {"dtype": "float16", "shape": "33x17x9"}, "failed"),
        case("mm_out", "test_b", {"dtype": "weird"}, "skipped"),
        case("lowering", "test_c", {"model": "tiny_llm"}, "passed"),
        case("lowering", "test_d", {}, "crashed"),
    ]
    assert [case_row_label(c) for c in cases] == ["33x17x9", "33x17x9", "test_b", "tiny_llm", "test_d"]
    lowering, mm_out = build_matrices(cases)
    assert mm_out.dtypes == ("float16", "weird")
    assert lowering.dtypes == ("—",)
    first = mm_out.rows[0].cells[0]
    assert (first.status, first.label, first.title) == ("fail", "1/2", "1 passed, 1 failed")
    assert mm_out.rows[1].cells[1].text == "1 skipped"
    assert [row.cells[0].status for row in lowering.rows] == ["crash", "pass"]
    assert natural_key("9x9") < natural_key("33x17x9") < natural_key("257x1")


@pytest.mark.parametrize(
    ("outcomes", "status", "text"),
    [
        (["passed", "passed", "passed"], "pass", "3/3"),
        # The reported defect: a green "1/2" that meant 1 passed and 1 skipped, under a legend saying
        # failing/total. Skipped cases are not in passed/run; they are counted apart.
        (["passed", "skipped"], "pass", "1/1 +1 skipped"),
        (["passed", "failed", "skipped", "skipped"], "fail", "1/2 +2 skipped"),
        (["failed", "failed", "passed"], "fail", "1/3"),
        (["crashed"], "crash", "0/1"),
        (["should-failed", "passed"], "should", "1/2"),
        (["xfailed"], "known", "0/1"),
        (["coverage", "skipped"], "coverage", "0/1 +1 skipped"),
        (["skipped", "skipped"], "skip", "2 skipped"),
    ],
)
def test_matrix_cell_text_is_passed_of_run_with_skips_apart(outcomes, status, text) -> None:
    cases = [
        case("mm_out", "test_a", {"dtype": "float16", "shape": "9x9", "n": str(n)}, o)
        for n, o in enumerate(outcomes)
    ]
    (matrix,) = build_matrices(cases)
    cell = matrix.rows[0].cells[0]
    assert (cell.status, cell.text) == (status, text)


def test_metric_values_are_scaled_with_their_spread() -> None:
    assert show_metric({"unit": "s", "value": 0.00123, "spread": 0.00001, "n": 50}).text == "1.230 ± 0.010 ms"
    assert show_metric({"unit": "bytes", "value": 3 * 2**30, "spread": 2**20}).text == "3.000 ± 0.00098 GiB"
    assert show_metric({"unit": "x", "value": 0.98, "spread": 0.01}).text == "0.9800 ± 0.010 ×"
    assert show_metric({"unit": "TFLOP/s", "value": 870.1}).text == "870.1 TFLOP/s"
    assert show_metric({"unit": "B/s", "value": None, "status": "unsupported"}).value == "unsupported"
    assert show_quantity(2.5e9, "B/s") == "2.500 GB/s"


def test_charts_escape_labels_and_degrade_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    svg = charts.bar_chart(
        "time", [charts.Bar(HOSTILE, 1.0, 0.1, 1.1, 0.1), charts.Bar(HOSTILE_IMG, 2, 0)], "s", "lower"
    )
    assert svg is not None
    assert svg.startswith('<svg class="chart"')
    assert "<script" not in svg
    assert "<img" not in svg
    monkeypatch.setattr(charts, "available", lambda: False)
    assert charts.bar_chart("time", [charts.Bar("a", 1.0, 0.1)], "s", "lower") is None


def test_charts_of_more_than_max_bars_say_how_many_they_show() -> None:
    """A suite of 45 records draws 40 bars: the chart says so on itself, the page under it."""
    from reports import suite_tables

    assert charts.bars_note(charts.MAX_BARS) == ""
    assert charts.bars_note(45) == "showing the first 40 of 45"
    (suite,) = suite_tables.suite_views("benchmarks", sweep(45), {})
    assert len(suite.rows) == 45  # the table keeps every record
    if not charts.available():
        assert suite.charts == []
        return
    (chart,) = suite.charts
    assert chart.note == "showing the first 40 of 45"
    assert ">showing the first 40 of 45<" in chart.svg
    assert 'aria-label="time, log scale: 40 of 45 bars"' in chart.svg  # times: a log axis
    (small,) = suite_tables.suite_views("benchmarks", sweep(12), {})
    assert small.charts[0].note == ""
    assert "showing" not in small.charts[0].svg


def test_run_page_says_under_a_chart_what_it_leaves_out(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = sample_run(hostile=False, sweep_records=45)
    site = tmp_path / "site"
    assert main([str(write_run(tmp_path / "r.json", run)), "-o", str(site)]) == 0
    html = run_pages(site)[f"{run_slug(run.run_id)}.html"]
    assert html.count('<figcaption class="chart-note">showing the first 40 of 45 records') == 1


def test_conditions_shared_by_a_suite_are_shown_once_and_long_ones_fold() -> None:
    """Twenty conditions per record made every benchmark row 600 px tall: the ones every record shares go
    above the table once, the rest fold into a <details> unless they are few and short."""
    from reports import suite_tables

    suites = suite_tables.suite_views("benchmarks", benchmarks(hostile=False), {})
    mm_out = next(s for s in suites if s.suite == "mm_out")
    common = dict(mm_out.common_conditions)
    assert common["gpu_uuid"] == "GPU-cb0b0038-3f41-ae94-266e-db7ebcd5ac4b"
    assert common["blocking_kernel"].startswith("batches=2")
    for row in mm_out.rows:
        assert {key for key, _ in row.conditions} == {"power_w", "stop_reason", "temperature_c"}
        assert not row.conditions_inline  # a 40-character stop reason folds
    threads = next(s for s in suites if s.suite == "thread_scaling")
    assert threads.common_conditions == [("sm_clock_mhz", "1755")]
    # A throttled record keeps its warning in its row; the others keep their short "none", inline.
    assert [row.warnings for row in threads.rows][-1] == ["throttle_reasons: sw_thermal"]
    assert all(row.conditions_inline for row in threads.rows)


def test_shards_of_one_machine_count_each_gpu_once_and_show_the_worker_pinning() -> None:
    """Two shards from one 2-GPU machine (pinned workers + the multi-GPU shard): 2 GPUs, not 4."""
    import dataclasses as _dc

    from harness.results import CaseResult, merge_runs, new_run
    from reports import page_common, page_run

    env = {
        "hostname": "gpu-box",
        "gpus": [
            {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-a"},
            {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-b"},
        ],
    }
    case = CaseResult("t::a", "mm_out", {}, "passed", "", "", 0.1, "gw0")
    pinned = _dc.replace(
        new_run(env, {"worker_gpus": {"gw0": "0", "gw1": "1"}}),
        cases=[case, _dc.replace(case, id="t::b", worker="gw1")],
    )
    multi = _dc.replace(new_run(env, {}), cases=[_dc.replace(case, id="t::c")])
    run = merge_runs([pinned, multi])
    assert page_common.gpu_summary(run) == "2× NVIDIA H200"
    rows = {(r.worker, r.pinned_to, r.gpu) for r in page_run.worker_rows(run)}
    assert rows == {
        ("shard1/gw0", "CUDA_VISIBLE_DEVICES=0", "NVIDIA H200 GPU-a"),
        ("shard1/gw1", "CUDA_VISIBLE_DEVICES=1", "NVIDIA H200 GPU-b"),
        ("shard2/gw0", "not pinned", "every visible GPU"),
    }


def test_cpu_only_workers_are_not_said_to_use_gpus() -> None:
    import dataclasses as _dc

    from harness.results import CaseResult, new_run
    from reports import page_run

    case = CaseResult("t::a", "mm_out", {}, "passed", "", "", 0.1, "gw0")
    run = _dc.replace(new_run({"hostname": "laptop", "gpus": []}, {}), cases=[case])
    assert [(r.worker, r.pinned_to, r.gpu) for r in page_run.worker_rows(run)] == [
        ("gw0", "not pinned", "CPU only")
    ]


def test_a_suite_table_keeps_to_a_few_columns_and_writes_each_long_note_once() -> None:
    """Issue 27: one column per metric made a 12-metric suite 12,723 px wide, and a figure's missing-value
    reason filled each of its cells. Now: the primary figure and the ratios (four columns at most), the
    rest folded into the row; a missing figure reads n/a with a numbered note below the table."""
    from reports import suite_tables

    why = "invalid: missed polls: two counter samples were 278.3 ms apart, more than the safe 33.6 ms"
    metrics = {
        "nvml_bytes": {"unit": "B", "value": None, "spread": None, "better": "lower", "note": why},
        "runtime_bytes": {"unit": "B", "value": 100.0, "spread": 0.0, "better": "lower"},
        "agreement": {"unit": "x", "value": None, "spread": None, "better": "near-1", "note": why},
        "speed": {"unit": "x", "value": 1.5, "spread": 0.1, "better": "higher"},
        **{
            f"extra_{n}": {"unit": "s", "value": 0.001 * n, "spread": 0.0, "better": "lower"}
            for n in range(4)
        },
    }
    records = [
        {
            "suite": "t",
            "name": f"t[{n}]",
            "params": {"n": str(n)},
            "primary": "nvml_bytes",
            "metrics": metrics,
        }
        for n in range(9)
    ]
    (suite,) = suite_tables.suite_views("traffic", records, {})
    assert [c.name for c in suite.metrics] == ["nvml_bytes", "agreement", "speed", "runtime_bytes"]
    assert suite.metrics[1].direction == "closer to 1 is better"  # not "lower is better"
    assert suite.notes == [why]  # once, for eighteen cells
    row = suite.rows[0]
    assert row.metrics[0].shown.value == "n/a"
    assert row.metrics[0].note_ref == 1
    assert [column.name for column, _ in row.more] == [f"extra_{n}" for n in range(4)]
    assert not suite.show_names  # the parameters tell the rows apart
