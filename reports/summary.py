"""A plain single-page HTML summary of one run (or merged shards): what ``python -m reports`` writes.

It renders the same view model as the dashboard's run page (``reports.page_run.run_page``), with the same
Jinja environment (``reports.site.environment``: autoescaping, strict); only the layout is its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.results import RunResult
from reports.inputs import LoadedRun
from reports.page_run import run_page
from reports.site import environment

# The notable outcomes listed after the problems, in this order: not wrong (they never fail a run by
# default), but worth reading. Field of ``RunPage`` and section title.
NOTE_SECTIONS = (
    ("should_failures", "Should-level failures (a policy, optimisation or performance rule)"),
    ("known_failures", "Known failures (declared; failing as declared)"),
    ("coverage_gaps", "Coverage gaps (never a failure)"),
)


def render_summary(run: RunResult, sources: Sequence[str] = ()) -> str:
    """The page for ``run``; ``sources`` are the result files it was read from, one per shard."""
    page = run_page(LoadedRun(run, list(sources)), None)
    notes = [(title, getattr(page, field)) for field, title in NOTE_SECTIONS if getattr(page, field)]
    return environment().get_template("summary.html.j2").render(page=page, notes=notes)
