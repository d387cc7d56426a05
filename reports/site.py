"""Writing the static site: ``index.html`` (history), ``runs/<slug>.html`` per run, ``compare/`` pages and,
given a rule coverage table, ``coverage.html``.

Jinja2 runs with autoescaping and StrictUndefined; the only markup inserted unescaped is the SVG made
by ``reports.charts``. Every page carries a Content-Security-Policy that forbids any network access and
any script but the page's own copy-button script (allowed by its hash), so even a string that slipped
through escaping could neither run nor phone home.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from harness.formatting import show_quantity
from harness.results import atomic_write_text, utc_now
from reports import charts
from reports.compare import Comparison
from reports.history import run_slug
from reports.inputs import LoadedRun
from reports.views import (
    CoveragePage,
    history_counts,
    index_row,
    run_backend,
    run_page,
    short_time,
    show_time,
    side_by_side_page,
    sort_key_time,
)

TEMPLATE_DIR = Path(__file__).parent / "templates"
HISTORY_CHART_RUNS = 30
COVERAGE_PAGE = "coverage.html"


@dataclass
class SiteRun:
    loaded: LoadedRun
    comparison: Comparison | None
    is_new: bool

    @property
    def slug(self) -> str:
        return run_slug(self.loaded.run.run_id)


@dataclass(frozen=True)
class SiteInfo:
    """What the index says about the build itself."""

    load_errors: Sequence[str] = ()
    warnings: Sequence[str] = ()
    baseline: str = ""
    threshold_pct: float = 5.0
    #: (run A, run B) pairs compared case by case on pages of their own (``compare/A--vs--B.html``).
    side_by_side: Sequence[tuple[LoadedRun, LoadedRun]] = ()
    #: The rule coverage table, written as ``coverage.html`` and summed up on the index; None: no page.
    coverage: CoveragePage | None = None


@dataclass(frozen=True)
class SideBySideLink:
    href: str
    a_backend: str
    a_run_id: str
    b_backend: str
    b_run_id: str


def side_by_side_path(a: LoadedRun, b: LoadedRun) -> str:
    """Where the side-by-side page of runs A and B lives, relative to the site root."""
    return f"compare/{run_slug(a.run.run_id)}--vs--{run_slug(b.run.run_id)}.html"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["show_quantity"] = show_quantity
    return env


def script_hash(env: jinja2.Environment) -> str:
    """The CSP source for the inline script, computed from exactly the text the pages include."""
    source = env.get_template("dash_copy.js.j2").render()
    return "sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii")


def write_site(out_dir: Path, runs: Sequence[SiteRun], info: SiteInfo) -> list[Path]:
    """Render every page; returns the files written. Runs are shown newest first."""
    env = environment()
    common = {
        "script_hash": script_hash(env),
        "generated_at": show_time(utc_now()),
        "has_coverage": info.coverage is not None,
    }
    ordered = sorted(
        runs, key=lambda r: (sort_key_time(r.loaded.run.started_at), r.loaded.run.run_id), reverse=True
    )
    written = []
    run_template = env.get_template("dash_run.html.j2")
    for entry in ordered:
        path = out_dir / "runs" / f"{entry.slug}.html"
        html = run_template.render(page=run_page(entry.loaded, entry.comparison), root="../", **common)
        atomic_write_text(path, html)
        written.append(path)
    run_pages = {r.loaded.run.run_id: f"runs/{r.slug}.html" for r in ordered}
    side_links = []
    side_template = env.get_template("dash_side_by_side.html.j2")
    for a, b in info.side_by_side:
        href = side_by_side_path(a, b)
        a_href, b_href = (run_pages.get(x.run.run_id, "") for x in (a, b))
        page = side_by_side_page(a, b, "../" + a_href if a_href else "", "../" + b_href if b_href else "")
        atomic_write_text(out_dir / href, side_template.render(page=page, root="../", **common))
        written.append(out_dir / href)
        side_links.append(
            SideBySideLink(href, run_backend(a.run), a.run.run_id, run_backend(b.run), b.run.run_id)
        )
    if info.coverage is not None:
        coverage_html = env.get_template("dash_coverage.html.j2").render(
            page=info.coverage, root="", **common
        )
        atomic_write_text(out_dir / COVERAGE_PAGE, coverage_html)
        written.append(out_dir / COVERAGE_PAGE)
    rows = [index_row(r.loaded, f"runs/{r.slug}.html", r.comparison, r.is_new) for r in ordered]
    oldest_first = ordered[:HISTORY_CHART_RUNS][::-1]
    history_chart = charts.outcome_history_chart(
        [short_time(r.loaded.run.started_at) or r.loaded.run.run_id for r in oldest_first],
        [history_counts(r.loaded.run) for r in oldest_first],
    )
    index = env.get_template("dash_index.html.j2").render(
        rows=rows,
        history_chart=history_chart,
        load_errors=list(info.load_errors),
        warnings=list(info.warnings),
        baseline=info.baseline,
        threshold_pct=f"{info.threshold_pct:g}",
        side_by_side=side_links,
        coverage=info.coverage,
        root="",
        **common,
    )
    atomic_write_text(out_dir / "index.html", index)
    written.append(out_dir / "index.html")
    return written
