"""Writing the static site: every page ``reports.pages.PAGES`` lists (``index.html`` (history),
``runs/<slug>.html`` per run, ``compare/`` pages and, given a rule coverage table, ``coverage.html``),
through one Jinja environment.

Jinja2 runs with autoescaping and StrictUndefined; the only markup inserted unescaped is the SVG made
by ``reports.charts``. Every page carries a Content-Security-Policy that forbids any network access and
any script but the page's own copy-button script (allowed by its hash), so even a string that slipped
through escaping could neither run nor phone home.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from pathlib import Path

import jinja2

from harness.formatting import show_quantity
from harness.results import atomic_write_text, utc_now
from reports.page_common import show_time, sort_key_time
from reports.pages import PAGES, SiteInfo, SiteRun

TEMPLATE_DIR = Path(__file__).parent / "templates"


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
    for page in PAGES:
        template = env.get_template(page.template)
        for file in page.files(ordered, info):
            path = out_dir / file.path
            atomic_write_text(path, template.render(**file.variables, root=file.root, **common))
            written.append(path)
    return written
