"""A plain single-page HTML summary of one run (or merged shards), rendered with autoescaping Jinja2.

The page is computed here as a small view model; the template only lays it out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from harness.results import OUTCOMES, CaseResult, RunResult

TEMPLATE_DIR = Path(__file__).parent / "templates"
# Outcomes listed one by one with message and repro: everything that needs a person to look at it.
PROBLEM_OUTCOMES = ("crashed", "error", "failed", "xpassed")
# Listed apart, after the problems: not wrong (they never fail a run by default), but worth reading.
NOTE_OUTCOMES = (
    ("should-failed", "Should-level failures (a policy, optimisation or performance rule)"),
    ("xfailed", "Known failures (declared; failing as declared)"),
    ("coverage", "Coverage gaps (never a failure)"),
)


@dataclass(frozen=True)
class ChapterView:
    name: str
    total: int
    counts: list[tuple[str, int]]
    skip_reasons: list[tuple[str, int]]


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_summary(run: RunResult) -> str:
    return _environment().get_template("summary.html.j2").render(**summary_context(run))


def summary_context(run: RunResult) -> dict[str, Any]:
    summary = run.summary()
    outcome_counts = [(name, count) for name, count in summary["outcomes"].items() if count]
    return {
        "run": run,
        "backend": backend_label(run.metadata.get("backend")),
        "incomplete_reason": run.metadata.get("incomplete_reason"),
        "environment_rows": environment_rows(run.environment),
        "shards": [environment_rows(shard) for shard in run.environment.get("shards", [])],
        "total": summary["total"],
        "outcome_counts": outcome_counts,
        "chapters": chapter_views(run.cases),
        "problems": problem_cases(run.cases),
        "notes": [
            (outcome, title, [case for case in run.cases if case.outcome == outcome])
            for outcome, title in NOTE_OUTCOMES
            if any(case.outcome == outcome for case in run.cases)
        ],
        "warnings": [str(w) for w in run.metadata.get("warnings") or [] if isinstance(w, str)],
    }


def backend_label(backend: object) -> str:
    """``name version (spec)`` from ``{"name", "version", "spec"}`` metadata; a plain string as is."""
    if isinstance(backend, dict):
        name = " ".join(str(backend[key]) for key in ("name", "version") if backend.get(key))
        spec = backend.get("spec")
        label = f"{name} ({spec})" if name and spec else name or str(spec or "")
        return label or "not recorded"
    if backend:
        return str(backend)
    return "not recorded"


def environment_rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    """The environment facts a reader looks for first, as label/value pairs; absent facts are left out."""
    rows: list[tuple[str, str]] = []

    def add(label: str, value: object) -> None:
        if value is not None and value != "":
            rows.append((label, str(value)))

    add("Host", env.get("hostname"))
    add("Platform", env.get("platform"))
    add("Python", env.get("python"))
    add("CPU", env.get("cpu"))
    add("torch", env.get("torch"))
    if "torch" in env:
        add("torch CUDA", env.get("torch_cuda") or "none (CPU build)")
        add("CUDA available", "yes" if env.get("cuda_available") else "no")
    gpus = env.get("gpus")
    if isinstance(gpus, list):
        add("GPUs", "; ".join(_gpu_label(gpu) for gpu in gpus) if gpus else "none")
    add("Driver", env.get("driver_version"))
    for name, value in (env.get("env") or {}).items():
        add(name, value)
    return rows


def _gpu_label(gpu: object) -> str:
    if not isinstance(gpu, dict):
        return str(gpu)
    if "error" in gpu:
        return f"{gpu.get('index')}: {gpu['error']}"
    memory = gpu.get("total_memory_bytes")
    size = f" ({memory / 2**30:.1f} GiB)" if isinstance(memory, (int, float)) else ""
    uuid = f" {gpu['uuid']}" if gpu.get("uuid") else ""
    return f"{gpu.get('index')}: {gpu.get('name', '?')}{size}{uuid}"


def chapter_views(cases: list[CaseResult]) -> list[ChapterView]:
    by_chapter: dict[str, list[CaseResult]] = {}
    for case in cases:
        by_chapter.setdefault(case.chapter, []).append(case)
    views = []
    for name in sorted(by_chapter):
        chapter_cases = by_chapter[name]
        counts = Counter(case.outcome for case in chapter_cases)
        skipped = [case for case in chapter_cases if case.outcome == "skipped"]
        reasons = Counter(case.message or "(no reason given)" for case in skipped)
        views.append(
            ChapterView(
                name=name,
                total=len(chapter_cases),
                counts=[(outcome, counts[outcome]) for outcome in OUTCOMES if counts[outcome]],
                skip_reasons=reasons.most_common(),
            )
        )
    return views


def problem_cases(cases: list[CaseResult]) -> list[CaseResult]:
    """Crashes first, then errors, failures and unexpected passes; in run order within each."""
    rank = {outcome: i for i, outcome in enumerate(PROBLEM_OUTCOMES)}
    return sorted((case for case in cases if case.outcome in rank), key=lambda case: rank[case.outcome])
