"""The conformance matrix at a glance: per chapter, one row per shape/model and one column per dtype.

A case's dtype is ``params["dtype"]``; its row is ``params["shape"]``, else ``params["model"]``, else the
test's name taken from the id (what is left once the parametrisation is removed). Cases without a dtype
go to a "—" column. Every cell aggregates the cases that fall in it; its status is the worst outcome.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from harness.results import OUTCOMES, CaseResult

NO_DTYPE = "—"
_DTYPE_ORDER = ("float32", "float16", "bfloat16", "float64")
# Cell status, worst first; the first status any case in the cell has wins. Only crash and fail mean
# "wrong" (red/purple); should (a policy or performance rule failed), known (a declared known failure)
# and coverage (the backend does not cover it) have colours of their own.
CELL_STATUSES: tuple[str, ...] = ("crash", "fail", "should", "known", "coverage", "pass", "skip")
_STATUS_OF_OUTCOME = {
    "crashed": "crash",
    "error": "fail",
    "failed": "fail",
    "xpassed": "fail",
    "should-failed": "should",
    "xfailed": "known",
    "coverage": "coverage",
    "passed": "pass",
    "skipped": "skip",
}
# The outcomes a cell of each status counts in its label ("k/n").
_LABEL_OUTCOMES = {
    "crash": ("crashed", "error", "failed", "xpassed"),
    "fail": ("crashed", "error", "failed", "xpassed"),
    "should": ("should-failed",),
    "known": ("xfailed",),
    "coverage": ("coverage",),
}


@dataclass(frozen=True)
class Cell:
    status: str  # one of CELL_STATUSES, or "" for an empty cell
    total: int
    counts: tuple[tuple[str, int], ...]
    anchor: str  # the first problem case's anchor on the page, "" when there is none

    @property
    def label(self) -> str:
        if not self.total:
            return ""
        counts = dict(self.counts)
        if self.status in _LABEL_OUTCOMES:
            count = sum(counts.get(o, 0) for o in _LABEL_OUTCOMES[self.status])
            return f"{count}/{self.total}"
        if self.status == "pass":
            good = counts.get("passed", 0)
            return f"{good}/{self.total}" if good != self.total else str(self.total)
        return str(self.total)

    @property
    def title(self) -> str:
        return ", ".join(f"{count} {outcome}" for outcome, count in self.counts) or "no cases"


@dataclass(frozen=True)
class MatrixRow:
    label: str
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class ChapterMatrix:
    chapter: str
    dtypes: tuple[str, ...]
    rows: tuple[MatrixRow, ...]
    totals: tuple[tuple[str, int], ...]


def case_dtype(case: CaseResult) -> str:
    return case.params.get("dtype") or NO_DTYPE


def case_row_label(case: CaseResult) -> str:
    for key in ("shape", "model"):
        if case.params.get(key):
            return case.params[key]
    return test_name(case.id)


def test_name(case_id: str) -> str:
    """``path::Class::test_x[params]`` → ``test_x``; anything unexpected comes back as given."""
    name = case_id.rsplit("::", 1)[-1]
    return name.split("[", 1)[0] or case_id


def build_matrices(cases: Iterable[CaseResult], anchors: dict[int, str] | None = None) -> list[ChapterMatrix]:
    """One matrix per chapter, chapters sorted by name; ``anchors`` maps ``id(case)`` to a page anchor."""
    anchors = anchors or {}
    grouped: dict[str, dict[tuple[str, str], list[CaseResult]]] = {}
    for case in cases:
        cells = grouped.setdefault(case.chapter, {})
        cells.setdefault((case_row_label(case), case_dtype(case)), []).append(case)
    matrices = []
    for chapter in sorted(grouped):
        cells = grouped[chapter]
        dtypes = tuple(sorted({dtype for _, dtype in cells}, key=_dtype_key))
        labels = sorted({label for label, _ in cells}, key=natural_key)
        rows = tuple(
            MatrixRow(label, tuple(_cell(cells.get((label, dtype), []), anchors) for dtype in dtypes))
            for label in labels
        )
        outcome_counts = Counter(case.outcome for group in cells.values() for case in group)
        totals = tuple((o, outcome_counts[o]) for o in OUTCOMES if outcome_counts[o])
        matrices.append(ChapterMatrix(chapter, dtypes, rows, totals))
    return matrices


def _cell(cases: list[CaseResult], anchors: dict[int, str]) -> Cell:
    if not cases:
        return Cell("", 0, (), "")
    counts = Counter(case.outcome for case in cases)
    statuses = {_STATUS_OF_OUTCOME.get(case.outcome, "fail") for case in cases}
    status = next(s for s in CELL_STATUSES if s in statuses)
    anchor = next((anchors[id(c)] for c in cases if id(c) in anchors), "")
    ordered = tuple((o, counts[o]) for o in OUTCOMES if counts[o])
    return Cell(status, len(cases), ordered, anchor)


def _dtype_key(dtype: str) -> tuple[int, str]:
    if dtype in _DTYPE_ORDER:
        return (_DTYPE_ORDER.index(dtype), dtype)
    return (len(_DTYPE_ORDER) + (1 if dtype == NO_DTYPE else 0), dtype)


def natural_key(text: str) -> list[tuple[int, int | str]]:
    """Sort "9x9" before "33x17x9" before "257x129x65": digit runs compare as numbers."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part]
