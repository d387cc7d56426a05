"""The conformance matrix at a glance: per chapter, one row per shape/model and one column per dtype.

A case's dtype is ``params["dtype"]``; its row is ``params["shape"]``, else ``params["model"]``, else the
test's name taken from the id (what is left once the parametrisation is removed). Cases without a dtype
go to a "—" column. Every cell aggregates the cases that fall in it; its status (colour) is the worst
outcome, its text ``passed/run`` (of the cases that ran, how many passed) plus ``+k skipped`` apart.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from harness.outcomes import Outcome
from harness.results import OUTCOMES, CaseResult

NO_DTYPE = "—"
_DTYPE_ORDER = ("float32", "float16", "bfloat16", "float64")
# Cell status, worst first; the first status any case in the cell has wins. Only crash and fail mean
# "wrong" (red/purple); should (a policy or performance rule failed), known (a declared known failure)
# and coverage (the backend does not cover it) have colours of their own.
CELL_STATUSES: tuple[str, ...] = ("crash", "fail", "should", "known", "coverage", "pass", "notrun", "skip")
# crash: harness.outcomes.CRASH_LIKE; crash and fail together: FAILING.
_STATUS_OF_OUTCOME: dict[Outcome, str] = {
    Outcome.CRASHED: "crash",
    Outcome.TIMEOUT: "crash",
    Outcome.DEVICE_FAULT: "crash",
    Outcome.NOT_RUN: "notrun",
    Outcome.ERROR: "fail",
    Outcome.FAILED: "fail",
    Outcome.XPASSED: "fail",
    Outcome.SHOULD_FAILED: "should",
    Outcome.XFAILED: "known",
    Outcome.COVERAGE: "coverage",
    Outcome.PASSED: "pass",
    Outcome.SKIPPED: "skip",
}


@dataclass(frozen=True)
class Cell:
    """The cases of one matrix cell. Its colour (``status``) is the worst outcome among them; its text says
    how many of the cases that ran passed (``passed/run``, skipped cases excluded) and, apart, how many
    were skipped, so a green ``1/1 +1 skipped`` is never read as "1 of 2 failed"."""

    status: str  # one of CELL_STATUSES, or "" for an empty cell
    total: int
    counts: tuple[tuple[str, int], ...]
    anchor: str  # the first problem case's anchor on the page, "" when there is none

    @property
    def passed(self) -> int:
        return dict(self.counts).get(Outcome.PASSED, 0)

    @property
    def skipped(self) -> int:
        return dict(self.counts).get(Outcome.SKIPPED, 0)

    @property
    def not_run(self) -> int:
        return dict(self.counts).get(Outcome.NOT_RUN, 0)

    @property
    def run(self) -> int:
        """The cases that ran: every case but the skipped and the not-run ones."""
        return self.total - self.skipped - self.not_run

    @property
    def label(self) -> str:
        """``passed/run``; empty when nothing ran (the cell is all skipped, see ``skip_label``)."""
        return f"{self.passed}/{self.run}" if self.run else ""

    @property
    def skip_label(self) -> str:
        """``+k skipped`` (and ``+k not run``) beside a ``passed/run`` label; alone when nothing ran."""
        parts = [f"{n} {what}" for n, what in ((self.skipped, "skipped"), (self.not_run, "not run")) if n]
        if not parts:
            return ""
        return " ".join(f"+{part}" for part in parts) if self.run else " ".join(parts)

    @property
    def text(self) -> str:
        """Everything the cell shows, as one line of text."""
        return " ".join(part for part in (self.label, self.skip_label) if part)

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
