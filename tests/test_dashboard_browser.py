"""The dashboard in a real browser: headless Chromium through Playwright, served from 127.0.0.1.

Checks what only a browser can: no console or page errors (a Content-Security-Policy violation is one),
no request leaves the local server, the key elements are there and visible, and a hostile string shows
as text without running. Screenshots go to /tmp/dashboard-index.png and /tmp/dashboard-run.png (or
$DASHBOARD_SCREENSHOTS). Skips, with the reason, when Playwright or Chromium is missing; Chromium is
the system one (``nox -s browser`` installs it, when asked), not Playwright's download, or
$DASHBOARD_CHROMIUM.
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
    baseline_run,
    other_backend_run,
    sample_run,
    write_interrupted,
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
    current = write_run(results / "conformance.json", sample_run())
    write_interrupted(results / "killed.json")
    baseline = write_run(root / "baseline.json", baseline_run())
    upstream = write_run(root / "upstream.json", other_backend_run())
    args = ["-o", str(root / "site"), "--history", str(history), "--baseline", str(baseline)]
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
    context = browser.new_context(viewport={"width": 1400, "height": 900})
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
    assert repro.startswith("python -m pytest 'conformance/test_mm_out.py::")
    problem.locator("button.copy").click()
    tab.wait_for_function(
        "b => b.textContent !== 'Copy'", arg=problem.locator("button.copy").element_handle()
    )
    assert problem.locator("button.copy").inner_text() in ("Copied", "Selected")
    assert tab.locator("#failures .problem.crashed").count() == 1
    assert tab.locator("#skips .skip-group").count() == 3
    assert tab.locator("#benchmarks table.records").count() == 3
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
    for path in ("index.html", site["run"], site["side"]):
        tab.goto(server + path)
        # Wide tables scroll inside their own box; the page itself never scrolls sideways.
        assert tab.evaluate("document.documentElement.scrollWidth") <= 390, path
    assert_clean(watch)
