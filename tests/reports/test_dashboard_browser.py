"""The dashboard in a real browser: headless Chromium through Playwright, served from 127.0.0.1.

Checks what only a browser can: no console or page errors (a Content-Security-Policy violation is one),
no request leaves the local server, the key elements are there and visible, and a hostile string shows
as text without running, and the layout at a 1280 px wide window (nothing off-screen, benchmark rows
compact). Screenshots go to /tmp/dashboard-*.png (index, run, run-levels, side-by-side, coverage, and
example-bench when examples/runs has a bench result) or $DASHBOARD_SCREENSHOTS. Skips, with the reason,
when Playwright or Chromium is missing; Chromium is the system one (``nox -s browser`` installs it, when
asked), not Playwright's download, or $DASHBOARD_CHROMIUM.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from harness.results import load_results
from reports import charts
from reports.dashboard import main
from reports.history import run_slug
from tests.dashboard_samples import (
    HOSTILE,
    RULE_COVERAGE,
    baseline_run,
    other_backend_run,
    sample_run,
    write_interrupted,
    write_rule_coverage,
    write_run,
)

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SCREENSHOTS = Path(os.environ.get("DASHBOARD_SCREENSHOTS", "/tmp"))
WIDTH = 1280  # the laptop window the layout must fit (issue 14)
MAX_BENCH_ROW_PX = 90  # a benchmark row is one line of figures (two with a verdict), never a page
EXAMPLE_BENCH = sorted(Path(__file__).resolve().parents[2].glob("examples/runs/*/bench.json"))


def find_chromium() -> str | None:
    # The same places noxfile.py's `_chromium` looks (`nox -s browser` installs the /usr/bin one).
    candidates = [os.environ.get("DASHBOARD_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")]
    candidates.append(shutil.which("chromium-browser"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: `nox -s browser` installs Debian's (root, apt-get), or set DASHBOARD_CHROMIUM",
)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("browser")
    history = root / "history"
    # The oldest run in the history is another backend's, with should-failed, coverage and known failures.
    older = write_run(root / "older.json", other_backend_run(started_at="2025-05-30T09:30:00+00:00"))
    assert main([str(older), "-o", str(root / "site"), "--history", str(history)]) == 0
    results = root / "results"
    results.mkdir()
    # 45 records of one suite: more than a chart draws; the phases nox -s conformance stores.
    current = write_run(results / "conformance.json", sample_run(sweep_records=45, phases=True))
    write_interrupted(results / "killed.json")
    baseline = write_run(root / "baseline.json", baseline_run())
    upstream = write_run(root / "upstream.json", other_backend_run())
    coverage = write_rule_coverage(root / "rule-coverage.json")
    args = ["-o", str(root / "site"), "--history", str(history), "--baseline", str(baseline)]
    args += ["--coverage", str(coverage)]
    code = main([str(results), *args, "--side-by-side", str(upstream)])
    assert code == 0
    killed = load_results(results / "killed.json")
    run_id = load_results(current).run_id
    return {
        "dir": root / "site",
        "run": f"runs/{run_slug(run_id)}.html",
        "killed": f"runs/{run_slug(killed.run_id)}.html",
        "side": f"compare/{run_slug(run_id)}--vs--upstream-run-1.html",
        "older": f"runs/{run_slug(load_results(older).run_id)}.html",
    }


@pytest.fixture(scope="module")
def server(site: dict[str, Any]) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site["dir"]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        except sync_api.Error as exc:
            pytest.skip(f"Chromium at {CHROMIUM} did not start under Playwright: {exc}")
        yield chromium
        chromium.close()


class Watch:
    """Console errors, page errors and every request a page makes, with foreign requests refused."""

    def __init__(self, page: Any, origin: str) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.foreign: list[str] = []
        self.origin = urlsplit(origin).netloc
        page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        url = route.request.url
        self.requests.append(url)
        parts = urlsplit(url)
        if parts.scheme in ("data", "about") or (parts.scheme == "http" and parts.netloc == self.origin):
            route.continue_()
        else:
            self.foreign.append(url)
            route.abort()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[tuple[Any, Watch]]:
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.rstrip("/"))
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    watch = Watch(tab, server)
    yield tab, watch
    context.close()


def assert_clean(watch: Watch) -> None:
    assert watch.errors == [], watch.errors
    assert watch.foreign == [], watch.foreign
    assert watch.requests, "no request was seen at all"


def test_index_lists_the_history(page, server) -> None:
    tab, watch = page
    tab.goto(server + "index.html")
    rows = tab.locator("#runs tbody tr")
    assert rows.count() == 3
    assert rows.first.locator("td.when").inner_text() == "2025-06-03 10:00 UTC"
    assert tab.locator("#runs .badge.regression").count() >= 1
    if charts.available():
        assert tab.locator("svg.chart").first.is_visible()
    assert tab.locator("header.top").evaluate("e => getComputedStyle(e).position") == "sticky"
    tab.screenshot(path=str(SCREENSHOTS / "dashboard-index.png"), full_page=True)
    assert_clean(watch)


def test_run_page_shows_everything_and_runs_nothing_hostile(page, server, site) -> None:
    tab, watch = page
    tab.goto(server + "index.html")
    tab.locator(f'#runs a[href="{site["run"]}"]').click()
    tab.wait_for_load_state("load")
    assert tab.url.endswith(site["run"])
    # The hostile backend name is shown as text, and nothing it carried ran.
    assert HOSTILE in tab.locator("h1").inner_text()
    assert tab.evaluate("typeof window.__pwned") == "undefined"
    assert tab.locator("img").count() == 0
    # Matrix, failures with repro, skips, benchmark tables with charts, traffic, baseline verdicts.
    assert tab.locator("#matrix .matrix").count() >= 4
    failing_cell = tab.locator("#matrix a.cell.fail").first
    assert failing_cell.is_visible()
    failing_cell.click()
    assert "#case-" in tab.url
    problem = tab.locator("#failures .problem").filter(has_text="test_values_match_float64_reference")
    assert "max abs error" in problem.locator("pre").inner_text()
    repro = problem.locator(".repro code").inner_text()
    assert repro.startswith("python -m pytest 'conformance/mm_out/test_mm_out.py::")
    problem.locator("button.copy").click()
    tab.wait_for_function(
        "b => b.textContent !== 'Copy'", arg=problem.locator("button.copy").element_handle()
    )
    assert problem.locator("button.copy").inner_text() in ("Copied", "Selected")
    assert tab.locator("#failures .problem.crashed").count() == 1
    assert tab.locator("#skips .skip-group").count() == 3
    assert tab.locator("#benchmarks table.records").count() == 4
    assert "1.312" in tab.locator("#benchmarks table.records").first.inner_text()
    if charts.available():
        svgs = tab.locator("#benchmarks svg.chart")
        assert svgs.count() >= 3
        svgs.first.scroll_into_view_if_needed()
        assert svgs.first.is_visible()
        assert svgs.first.bounding_box()["height"] > 50
    assert "unsupported" in tab.locator("#traffic").inner_text()
    assert tab.locator("#baseline .badge.slower").count() >= 1
    assert tab.locator("#incomplete-banner").count() == 0
    tab.goto(server + site["run"])
    tab.screenshot(path=str(SCREENSHOTS / "dashboard-run.png"), full_page=True)
    assert tab.evaluate("typeof window.__pwned") == "undefined"
    assert_clean(watch)


def test_interrupted_run_has_a_banner(page, server, site) -> None:
    tab, watch = page
    tab.goto(server + site["killed"])
    banner = tab.locator("#incomplete-banner")
    assert banner.is_visible()
    assert "interrupted" in banner.inner_text()
    assert tab.locator("#matrix .cell.pass").count() > 0
    assert_clean(watch)


def test_side_by_side_page_compares_two_backends(page, server, site) -> None:
    tab, watch = page
    tab.goto(server + "index.html")
    tab.locator(f'#side-by-side a[href="{site["side"]}"]').click()
    tab.wait_for_load_state("load")
    assert tab.url.endswith(site["side"])
    # Both backends with their versions in the header; the hostile one shown as text, nothing ran.
    assert "reference" in tab.locator("#run-a").inner_text()
    assert "0.1.0" in tab.locator("#run-a").inner_text()
    assert HOSTILE in tab.locator("#run-b h2").inner_text()
    assert "1.5.1" in tab.locator("#run-b").inner_text()
    assert tab.evaluate("typeof window.__pwned") == "undefined"
    # Every group that has cases, each row with both outcomes.
    for anchor in ("only-a-fails", "only-b-fails", "different", "only-in-a", "only-in-b", "same"):
        assert tab.locator(f"#{anchor} table.side tbody tr").count() >= 1, anchor
    only_b = tab.locator("#only-b-fails tbody tr").first
    assert only_b.locator(".badge.passed").is_visible()
    assert only_b.locator(".badge.failed").is_visible()
    assert tab.locator("#different .badge.should-failed").count() == 1
    assert tab.locator("#only-in-b .badge.xfailed").count() == 1
    assert tab.locator("#group-counts .tile").count() == 6
    # The run page of A is one click away.
    assert tab.locator("#run-a a").get_attribute("href").startswith("../runs/")
    tab.screenshot(path=str(SCREENSHOTS / "dashboard-side-by-side.png"), full_page=True)
    assert_clean(watch)


def test_run_page_separates_should_known_and_coverage(page, server, site) -> None:
    tab, watch = page
    tab.goto(server + site["older"])
    # Nothing but real failures is red: a should rule, a known failure and a coverage gap have sections
    # and matrix colours of their own.
    assert tab.locator("#should .problem.should-failed").count() == 1
    assert "rule=mm_out/no-host-sync" in tab.locator("#should .chips").inner_text()
    assert tab.locator("#known .problem.xfailed").count() == 2  # the declared one and an xfail marker
    known = tab.locator("#known .problem.xfailed").filter(has=tab.locator(".known-reason"))
    assert known.count() == 1
    assert "fp16 conv accumulates" in known.locator(".known-reason").inner_text()
    assert known.locator(".known-reason a").count() == 0  # a javascript: link stays text
    assert tab.locator("#coverage .problem.coverage").count() == 1
    assert tab.locator("#failures .problem.should-failed, #failures .problem.coverage").count() == 0
    for status in ("should", "known", "coverage"):
        assert tab.locator(f"#matrix .cell.{status}").first.is_visible(), status
    tile = tab.locator(".tile.should-failed")
    assert tile.evaluate("e => getComputedStyle(e).backgroundColor") != tab.locator(".tile.failed").evaluate(
        "e => getComputedStyle(e).backgroundColor"
    )
    assert tab.evaluate("typeof window.__pwned") == "undefined"
    tab.screenshot(path=str(SCREENSHOTS / "dashboard-run-levels.png"), full_page=True)
    assert_clean(watch)


def test_pages_fit_a_phone_screen(page, server, site) -> None:
    tab, watch = page
    tab.set_viewport_size({"width": 390, "height": 844})
    for path in ("index.html", site["run"], site["side"], "coverage.html"):
        tab.goto(server + path)
        # Wide tables scroll inside their own box; the page itself never scrolls sideways.
        assert tab.evaluate("document.documentElement.scrollWidth") <= 390, path
    assert_clean(watch)


def fits_the_window(tab: Any) -> None:
    assert tab.evaluate("document.documentElement.scrollWidth") <= WIDTH, tab.url


def test_index_fits_1280_px_with_the_verdict_column_on_screen(page, server) -> None:
    """Issue 14: at 1280 px the "Verdict vs baseline" column was off-screen, scrolled out of its table."""
    tab, watch = page
    tab.goto(server + "index.html")
    fits_the_window(tab)
    wrap = tab.locator("#runs").locator("xpath=..")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth"), "the run table overflows its box"
    verdict = tab.locator("#runs thead th").last
    assert verdict.inner_text().lower() == "verdict vs baseline"
    column = verdict.bounding_box()
    assert column["x"] + column["width"] <= WIDTH
    assert column["x"] + column["width"] <= wrap.bounding_box()["x"] + wrap.bounding_box()["width"] + 0.5
    for cell in tab.locator("#runs tbody td.verdict").all():  # every row's verdict, badge included
        box = cell.locator(".badge").bounding_box()
        assert box["x"] + box["width"] <= WIDTH
    assert_clean(watch)


def test_benchmark_rows_are_compact(page, server, site) -> None:
    """Issue 14: twenty-odd conditions per record made every row 626 px tall (a 73,000 px page)."""
    tab, watch = page
    tab.goto(server + site["run"])
    rows = tab.locator("#benchmarks table.records tbody tr")
    assert rows.count() == 11 + 45  # the sample's 11 records and the 45 of the sweep
    heights = rows.evaluate_all("rows => rows.map(r => r.getBoundingClientRect().height)")
    assert max(heights) <= MAX_BENCH_ROW_PX, heights
    # Conditions every record shares are shown once per suite; the rest fold, still one click away.
    shared = tab.locator("#benchmarks-1 + details.common-conditions")
    assert "shared by every record" in shared.locator("summary").inner_text()
    shared.locator("summary").click()
    assert shared.get_by_text("gpu_uuid=GPU-cb0b0038-3f41-ae94-266e-db7ebcd5ac4b").is_visible()
    first = tab.locator("#benchmarks table.records").first.locator("td.conditions details").first
    first.locator("summary").click()
    assert "stop_reason=converged" in first.inner_text()
    fits_the_window(tab)
    assert_clean(watch)


def test_a_chart_of_more_than_40_records_says_so(page, server, site) -> None:
    if not charts.available():
        pytest.skip("matplotlib is not installed: no charts")
    tab, watch = page
    tab.goto(server + site["run"])
    figure = tab.locator("#benchmarks figure").filter(has=tab.locator("figcaption.chart-note"))
    assert figure.count() == 1  # the 45-record sweep; the suites of fewer records say nothing
    caption = figure.locator("figcaption")
    caption.scroll_into_view_if_needed()
    assert caption.is_visible()
    assert caption.inner_text().startswith("showing the first 40 of 45 records")
    assert "showing the first 40 of 45" in figure.locator("svg.chart").inner_html()  # on the chart too
    assert_clean(watch)


def test_run_page_shows_where_the_time_went(page, server, site) -> None:
    tab, watch = page
    tab.goto(server + site["run"])
    section = tab.locator("#time")
    section.scroll_into_view_if_needed()
    assert section.is_visible()
    phases = tab.locator("#phases tbody tr")
    assert phases.count() == 5 + 1  # every phase and the end-to-end total
    assert "cases (shared GPU)" in phases.nth(1).inner_text()
    assert "74 %" in phases.nth(1).inner_text()
    assert "730.0 s" in phases.last.inner_text()
    assert tab.locator("table.chapter-seconds tbody tr").first.locator("td").first.inner_text() == "mm_out"
    fits_the_window(tab)
    tab.goto(server + site["older"])  # a run without phases: no section, no link
    assert tab.locator("#time").count() == 0
    assert tab.locator('header a[href="#time"]').count() == 0
    assert_clean(watch)


def test_rule_coverage_page(page, server) -> None:
    tab, watch = page
    tab.goto(server + "index.html")
    assert "2 missing" in tab.locator("#rule-coverage").inner_text()
    tab.locator("header.top nav a", has_text="Rule coverage").click()
    tab.wait_for_load_state("load")
    assert tab.url.endswith("/coverage.html")
    rows = tab.locator("#rules tbody tr")
    assert rows.count() == len(RULE_COVERAGE)
    assert rows.first.locator(".badge.missing").is_visible()
    proven = tab.locator("#status-proven")
    assert "tests.broken.basic:WRONG_VALUES" in proven.locator("td.backends").inner_text()
    assert proven.locator("td.num").inner_text() == "3"
    assert HOSTILE in tab.locator("#status-gap td.reason").inner_text()  # shown as text
    assert tab.evaluate("typeof window.__pwned") == "undefined"
    wrap = tab.locator("#rules").locator("xpath=..")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth"), "the coverage table overflows its box"
    reason = tab.locator("#rules thead th").last.bounding_box()
    assert reason["x"] + reason["width"] <= WIDTH
    tab.locator("#coverage-summary a.tile.gap").click()
    assert tab.url.endswith("#status-gap")
    fits_the_window(tab)
    tab.screenshot(path=str(SCREENSHOTS / "dashboard-coverage.png"), full_page=True)
    assert_clean(watch)


def test_matrix_legend_says_what_cells_count(page, server, site) -> None:
    tab, watch = page
    tab.goto(server + site["run"])
    assert "passed/run" in tab.locator("#matrix h2").inner_text()
    assert "+1 skipped" in tab.locator("#matrix-legend").inner_text()
    assert tab.locator("#matrix .cell.skip").first.inner_text() == "2 skipped"
    assert_clean(watch)


@pytest.mark.skipif(not EXAMPLE_BENCH, reason="no examples/runs/*/bench.json in this checkout")
@pytest.mark.proof
def test_a_real_bench_run_has_compact_rows(browser, tmp_path: Path) -> None:
    """The run issues 14 and 27 were reported on: a full bench of 77 records (54 of one suite), which fits
    the window, every table in its box, each long note once."""
    site = tmp_path / "site"
    assert main([str(EXAMPLE_BENCH[0]), "-o", str(site)]) == 0
    handler = functools.partial(QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    try:
        tab = context.new_page()
        watch = Watch(tab, f"http://127.0.0.1:{httpd.server_address[1]}/")
        tab.goto(
            f"http://127.0.0.1:{httpd.server_address[1]}/"
            + next(site.glob("runs/*.html")).relative_to(site).as_posix()
        )
        heights = tab.locator("#benchmarks table.records tbody tr").evaluate_all(
            "rows => rows.map(r => r.getBoundingClientRect().height)"
        )
        assert len(heights) >= 50
        assert max(heights) <= MAX_BENCH_ROW_PX, max(heights)
        fits_the_window(tab)
        # Issue 27: the mm_out table was 2,471 px wide in a 1,196 px box, speed_vs_torch_mm out of sight.
        widths = tab.locator("table.records").evaluate_all(
            "ts => ts.map(t => [t.scrollWidth, t.closest('.table-wrap').clientWidth])"
        )
        assert all(table <= box for table, box in widths), widths
        header = tab.locator("#benchmarks table.records").first.locator("thead th", has_text="TORCH_MM").first
        assert header.bounding_box()["x"] + header.bounding_box()["width"] <= WIDTH
        # A reason repeated in nine cells is written once, below its table; the cells say n/a [k].
        if "missed polls" in EXAMPLE_BENCH[0].read_text():
            assert tab.locator("td.num", has_text="missed polls").count() == 0
            assert tab.locator("ol.notes li", has_text="invalid: missed polls").count() == 1
            assert tab.locator("sup.note-ref").count() >= 2
        if charts.available():  # times on a log axis: the microsecond bars are not hidden
            assert (
                tab.locator("#benchmarks svg.chart").first.get_attribute("aria-label").startswith("time, log")
            )
        if charts.available() and len(heights) > charts.MAX_BARS:
            assert tab.locator("figcaption.chart-note").count() >= 1
        tab.locator("#benchmarks").screenshot(path=str(SCREENSHOTS / "dashboard-example-bench.png"))
        assert_clean(watch)
    finally:
        context.close()
        httpd.shutdown()
        httpd.server_close()


def test_one_page_compares_four_backends(browser, tmp_path: Path) -> None:
    """Issue 30: reference vs AOTI (default and checked) vs ExecuTorch on one page, which fits the window
    (and a phone's, its table scrolling in its box), runs nothing hostile, and folds the agreeing cases."""
    from tests.reports.test_compare_many import four_runs

    paths = [write_run(tmp_path / f"{r.run_id}.json", r) for r in four_runs()]
    site = tmp_path / "site"
    assert main([str(paths[0]), "--side-by-side", ",".join(map(str, paths[1:])), "-o", str(site)]) == 0
    handler = functools.partial(QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{httpd.server_address[1]}/"
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    try:
        tab = context.new_page()
        watch = Watch(tab, origin)
        tab.goto(origin + "index.html")
        tab.locator("#side-by-side a").click()
        tab.wait_for_load_state("load")
        assert tab.url.endswith("ref-run--vs--aoti-run--vs--aoti-checked-run--vs--et-run.html")
        assert tab.evaluate("typeof window.__pwned") == "undefined"
        assert tab.locator(".side-run").count() == 4
        assert HOSTILE in tab.locator("#run-d h2").inner_text()
        assert tab.locator("#differ-table thead th").count() == 2 + 4
        assert tab.locator("#differ-table tbody tr").count() == 5
        assert tab.locator("#rules tbody tr").count() == 2
        assert tab.locator("#rules .badge.xfailed", has_text="known failure").is_visible()
        assert not tab.locator("#same-table").is_visible()  # folded until asked
        tab.locator("#same summary").click()
        assert tab.locator("#same-table").is_visible()
        fits_the_window(tab)
        tab.screenshot(path=str(SCREENSHOTS / "dashboard-compare-many.png"), full_page=True)
        tab.set_viewport_size({"width": 390, "height": 844})
        assert tab.evaluate("document.documentElement.scrollWidth") <= 390
        assert_clean(watch)
    finally:
        context.close()
        httpd.shutdown()
        httpd.server_close()
