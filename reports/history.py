"""The run history kept between dashboard builds: a directory of result files plus small sidecars.

Layout of ``--history DIR``: ``<slug>.json`` is the run (shards already merged) as an ordinary result
file, so any tool that reads result files reads it; ``<slug>.dashboard.json`` keeps what only the
dashboard knows: the source file names and the baseline verdict recorded when the run was added (a
later build may have another baseline, or none). Building the same run again replaces both.

History is an archive the dashboard writes itself: an entry that cannot be read is skipped with a
warning instead of failing every later build.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.results import ResultFileError, atomic_write_text, load_results, write_results
from reports.compare import Comparison
from reports.inputs import LoadedRun

SIDECAR_SUFFIX = ".dashboard.json"
SIDECAR_VERSION = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class HistoryRun:
    loaded: LoadedRun
    comparison: Comparison | None


def run_slug(run_id: str) -> str:
    """A file name for a run id: readable, and unique because a short hash is added when it was altered."""
    safe = _SAFE.sub("-", run_id).strip(".-") or "run"
    if safe == run_id and len(safe) <= 80:
        return safe
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:10]
    return f"{safe[:60]}-{digest}"


def load_history(directory: Path) -> tuple[list[HistoryRun], list[str]]:
    """Every readable run in the directory, and one warning line per entry that was skipped."""
    runs: list[HistoryRun] = []
    warnings: list[str] = []
    if not directory.is_dir():
        return runs, warnings
    for path in sorted(directory.glob("*.json")):
        if path.name.endswith(SIDECAR_SUFFIX):
            continue
        try:
            run = load_results(path)
        except ResultFileError as exc:
            warnings.append(f"history entry skipped: {exc}")
            continue
        sources, comparison = _read_sidecar(path.with_name(path.stem + SIDECAR_SUFFIX), warnings)
        runs.append(HistoryRun(LoadedRun(run, sources or [str(path)]), comparison))
    return runs, warnings


def save_to_history(directory: Path, entry: HistoryRun) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    slug = run_slug(entry.loaded.run.run_id)
    target = directory / f"{slug}.json"
    write_results(target, entry.loaded.run)
    sidecar: dict[str, Any] = {
        "version": SIDECAR_VERSION,
        "sources": entry.loaded.sources,
        "comparison": None if entry.comparison is None else entry.comparison.to_dict(),
    }
    atomic_write_text(directory / f"{slug}{SIDECAR_SUFFIX}", json.dumps(sidecar, indent=1, sort_keys=True))
    return target


def _read_sidecar(path: Path, warnings: list[str]) -> tuple[list[str], Comparison | None]:
    if not path.exists():
        return [], None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        sources = [str(s) for s in data.get("sources") or []]
        raw = data.get("comparison")
        return sources, None if raw is None else Comparison.from_dict(raw)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.append(f"history entry {path}: sidecar ignored ({type(exc).__name__}: {exc})")
        return [], None
