"""The site's pages, registered in one place (:data:`PAGES`): for each, its template and the files it
writes from a build's runs, each file with its view model. ``reports.site`` renders whatever is listed
here, in this order; adding a page is one more entry (its view model lives in a ``reports.page_*``
module)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from reports.compare import Comparison
from reports.history import run_slug
from reports.inputs import LoadedRun
from reports.page_compare_many import compare_many_page
from reports.page_coverage import CoveragePage
from reports.page_index import history_chart, index_row, side_by_side_link
from reports.page_run import run_page
from reports.page_side_by_side import side_by_side_page

COVERAGE_PAGE = "coverage.html"


@dataclass
class SiteRun:
    loaded: LoadedRun
    comparison: Comparison | None
    is_new: bool

    @property
    def slug(self) -> str:
        return run_slug(self.loaded.run.run_id)

    @property
    def href(self) -> str:
        """Its run page, relative to the site root."""
        return f"runs/{self.slug}.html"


@dataclass(frozen=True)
class SiteInfo:
    """What the index says about the build itself."""

    load_errors: Sequence[str] = ()
    warnings: Sequence[str] = ()
    baseline: str = ""
    threshold_pct: float = 5.0
    #: Runs compared case by case on pages of their own (``compare/A--vs--B.html``): a pair gets the
    #: two-run page, three runs or more one page with a column each (``compare/A--vs--B--vs--C.html``).
    side_by_side: Sequence[tuple[LoadedRun, ...]] = ()
    #: The rule coverage table, written as ``coverage.html`` and summed up on the index; None: no page.
    coverage: CoveragePage | None = None


@dataclass(frozen=True)
class PageFile:
    """One HTML file of a page: where it goes (relative to the site root), the way back to the root from
    there, and the template's variables (the view model)."""

    path: str
    root: str
    variables: dict[str, Any]


@dataclass(frozen=True)
class Page:
    """A kind of page: its template, and the files it writes for runs (newest first) and a build's info."""

    template: str
    files: Callable[[Sequence[SiteRun], SiteInfo], Iterator[PageFile]]


#: Longest side-by-side file name (before ``.html``) made of all the run slugs; beyond, a hash stands for
#: the runs after the first (a slug can be 80 characters, and file systems stop at 255).
MAX_COMPARE_NAME = 200


def side_by_side_path(*runs: LoadedRun) -> str:
    """Where the side-by-side page of these runs lives, relative to the site root: their slugs in column
    order, ``--vs--`` between them (stable: the same runs in the same order give the same name)."""
    slugs = [run_slug(loaded.run.run_id) for loaded in runs]
    name = "--vs--".join(slugs)
    if len(name) > MAX_COMPARE_NAME:
        digest = hashlib.sha256("\n".join(slugs).encode("utf-8")).hexdigest()[:10]
        name = f"{slugs[0][:60]}--vs--{len(slugs) - 1}-more-{digest}"
    return f"compare/{name}.html"


def run_files(runs: Sequence[SiteRun], info: SiteInfo) -> Iterator[PageFile]:
    """``runs/<slug>.html`` per run."""
    for entry in runs:
        yield PageFile(entry.href, "../", {"page": run_page(entry.loaded, entry.comparison)})


def side_by_side_files(runs: Sequence[SiteRun], info: SiteInfo) -> Iterator[PageFile]:
    """``compare/<A>--vs--<B>.html`` per pair; each side links its run page where the site has one."""
    for pair in info.side_by_side:
        if len(pair) == 2:
            (a, b), (a_href, b_href) = pair, _run_hrefs(runs, pair)
            yield PageFile(side_by_side_path(a, b), "../", {"page": side_by_side_page(a, b, a_href, b_href)})


def compare_many_files(runs: Sequence[SiteRun], info: SiteInfo) -> Iterator[PageFile]:
    """``compare/<A>--vs--<B>--vs--<C>.html`` per set of three runs or more, a column each."""
    for several in info.side_by_side:
        if len(several) > 2:
            page = compare_many_page(several, _run_hrefs(runs, several))
            yield PageFile(side_by_side_path(*several), "../", {"page": page})


def _run_hrefs(runs: Sequence[SiteRun], compared: Sequence[LoadedRun]) -> list[str]:
    """Each compared run's page as seen from ``compare/``; "" where the site has none."""
    run_pages = {r.loaded.run.run_id: r.href for r in runs}
    return [f"../{run_pages[x.run.run_id]}" if x.run.run_id in run_pages else "" for x in compared]


def coverage_files(runs: Sequence[SiteRun], info: SiteInfo) -> Iterator[PageFile]:
    """``coverage.html``, given a rule coverage table."""
    if info.coverage is not None:
        yield PageFile(COVERAGE_PAGE, "", {"page": info.coverage})


def index_files(runs: Sequence[SiteRun], info: SiteInfo) -> Iterator[PageFile]:
    """``index.html``: the run history, the build's errors and warnings, links to the other pages."""
    variables = {
        "rows": [index_row(r.loaded, r.href, r.comparison, r.is_new) for r in runs],
        "history_chart": history_chart([r.loaded.run for r in runs]),
        "load_errors": list(info.load_errors),
        "warnings": list(info.warnings),
        "baseline": info.baseline,
        "threshold_pct": f"{info.threshold_pct:g}",
        "side_by_side": [side_by_side_link(side_by_side_path(*s), s) for s in info.side_by_side],
        "coverage": info.coverage,
    }
    yield PageFile("index.html", "", variables)


#: Every page of the site, rendered in this order (the index last: it links the others).
PAGES: tuple[Page, ...] = (
    Page("dash_run.html.j2", run_files),
    Page("dash_side_by_side.html.j2", side_by_side_files),
    Page("dash_compare_many.html.j2", compare_many_files),
    Page("dash_coverage.html.j2", coverage_files),
    Page("dash_index.html.j2", index_files),
)
