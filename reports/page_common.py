"""What several pages show the same way: backend labels, GPU and host summaries, times, outcome counts
and verdict wording, computed from a run as plain strings.

Every page's view model (``reports.page_*``) takes these from here, so the index, a run page and a
side-by-side page cannot word the same fact differently. Strings taken from result files stay untouched;
the autoescaping templates escape them.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from harness.results import RunResult
from reports.compare import CASE_CHANGE_LABELS, COVERAGE_CHANGES, Comparison

#: Metric verdicts, most urgent first: how comparison tables are ordered.
VERDICT_ORDER = ("slower", "ambiguous", "changed", "faster", "n/a", "same")


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


def run_backend(run: RunResult) -> str:
    """The backend label; merged shards that disagree list each distinct backend."""
    if run.metadata.get("backend"):
        return backend_label(run.metadata["backend"])
    labels = [backend_label(s.get("backend")) for s in run.metadata.get("shards", []) if isinstance(s, dict)]
    distinct = list(dict.fromkeys(label for label in labels if label != "not recorded"))
    return " + ".join(distinct) if distinct else "not recorded"


def as_list(value: object) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    # Result files are validated only down to the top-level types; anything deeper may be odd.
    return value if isinstance(value, list) else []


def shard_environments(run: RunResult) -> list[dict[str, Any]]:
    shards = run.environment.get("shards")
    if isinstance(shards, list) and shards:
        return [s if isinstance(s, dict) else {} for s in shards]
    return [run.environment]


def gpu_summary(run: RunResult) -> str:
    """``2× NVIDIA H200`` over all shards; ``CPU only`` when no shard saw a GPU."""
    names: Counter[str] = Counter()
    seen: set[str] = set()
    for number, env in enumerate(shard_environments(run)):
        for position, gpu in enumerate(as_list(env.get("gpus"))):
            name = str(gpu.get("name", "unknown GPU")) if isinstance(gpu, dict) else str(gpu)
            # Shards of one machine list the same GPUs: count each physical GPU (by UUID) once.
            uuid = gpu.get("uuid") if isinstance(gpu, dict) else None
            identity = str(uuid) if uuid else f"{env.get('hostname')}|{number}|{position}"
            if identity not in seen:
                seen.add(identity)
                names[name] += 1
    if not names:
        return "CPU only"
    return ", ".join(f"{count}× {name}" if count > 1 else name for name, count in names.items())


def hosts(run: RunResult) -> list[str]:
    return list(dict.fromkeys(str(env.get("hostname") or "unknown host") for env in shard_environments(run)))


def show_time(stamp: str | None) -> str:
    """``2025-01-01 12:00 UTC`` for an ISO 8601 stamp; anything else as given."""
    if not stamp:
        return ""
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    zone = "UTC" if moment.utcoffset() is not None and not moment.utcoffset() else moment.strftime("%z")
    return f"{moment:%Y-%m-%d %H:%M} {zone}".strip()


def short_time(stamp: str) -> str:
    """``06-02 09:30`` for a chart axis; empty when the stamp is not ISO 8601."""
    try:
        return f"{datetime.fromisoformat(stamp):%m-%d %H:%M}"
    except ValueError:
        return ""


def sort_key_time(stamp: str) -> float:
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return float("-inf")
    return moment.timestamp()


def column_letter(number: int) -> str:
    """A, B, ... Z, then 27, 28 ...: the short name of the run in column ``number`` (from 0) of a
    side-by-side page, as the two-run page calls its runs A and B."""
    return chr(ord("A") + number) if number < 26 else str(number + 1)


def outcome_counts(run: RunResult) -> list[tuple[str, int]]:
    return [(outcome, count) for outcome, count in run.summary()["outcomes"].items() if count]


def verdict_detail(comparison: Comparison | None) -> str:
    if comparison is None:
        return ""
    parts = [f"{n} {v}" for v, n in comparison.metric_counts().items() if n and v != "same"]
    parts += [f"{n} {CASE_CHANGE_LABELS[c]}" for c, n in comparison.case_counts().items() if n]
    if comparison.narrowed and any(comparison.case_counts()[c] for c in COVERAGE_CHANGES):
        parts.append("narrowed: lost and newly skipped cases do not gate")
    return ", ".join(parts) or "no changes beyond the threshold"
