"""Reading the rule coverage table that ``python -m tests.rule_coverage --json`` prints.

The dashboard shows it as a page of its own (``coverage.html``): every rule id with its level, whether a
broken backend proves that a chapter fails on it (``proven``; ``proven-gpu`` where only a GPU run can),
why none does (``not-checkable``: no backend can break it; ``gap``, a to-do, only in files written before
gaps failed the self-tests) or that nothing covers it (``missing``), how many cases check it and which
broken backends prove it. The table reaches the dashboard as data, a JSON file, never by importing the
suite: ``reports`` does not import ``conformance``.

The file is a list of rows, one per rule id of the rule table, as ``conformance.suite.rule_coverage.row_dict``
writes them::

    [{"rule": "mm_out/values", "level": "must", "chapters": ["mm_out"], "cases": ["conformance/..."],
      "broken_backends": ["tests.broken.basic:WrongValues"], "spec": ['SPEC §1c: "..."'],
      "exemption": null, "exemption_reason": null, "status": "proven"}, ...]

It is read as untrusted input: anything that is not that shape is an error naming the file, and every
string is shown escaped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: The name the dashboard picks up from a results directory (``python -m tests.rule_coverage --json
#: > results/rule-coverage.json``); such a file is never read as a result file.
COVERAGE_FILE = "rule-coverage.json"

#: Statuses as the page shows them, most urgent first. The table's own ``NO CASE`` and ``NO BROKEN
#: BACKEND`` (and anything unknown) are ``missing``: the self-test fails on them, so they need a person.
STATUSES = ("missing", "gap", "not-checkable", "proven-gpu", "proven")
_KNOWN = frozenset(STATUSES) - {"missing"}
_MISSING_REASONS = {
    "NO CASE": "no case checks this rule",
    "NO BROKEN BACKEND": "no broken backend proves it, and it is not exempt",
}


class CoverageFileError(ValueError):
    """The coverage file cannot be read; the message names the file and says why, on one line."""


@dataclass(frozen=True)
class CoverageRule:
    rule: str
    level: str
    status: str  # one of STATUSES
    raw_status: str  # as the file says it (``NO CASE`` for a missing one)
    chapters: tuple[str, ...]
    cases: int
    broken_backends: tuple[str, ...]
    reason: str


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} is not a list of strings")
    return tuple(value)


def _row(entry: object) -> CoverageRule:
    if not isinstance(entry, dict):
        raise ValueError("a row is not an object")
    rule = entry.get("rule")
    if not isinstance(rule, str) or not rule:
        raise ValueError("a row has no rule id")
    raw = entry.get("status")
    raw = raw if isinstance(raw, str) else ""
    status = raw if raw in _KNOWN else "missing"
    reason = entry.get("exemption_reason")
    reason = reason if isinstance(reason, str) else ""
    if status == "missing" and not reason:
        reason = _MISSING_REASONS.get(raw, f"status {raw!r}" if raw else "no status given")
    level = entry.get("level")
    return CoverageRule(
        rule=rule,
        level=level if isinstance(level, str) else "",
        status=status,
        raw_status=raw,
        chapters=_strings(entry.get("chapters"), f"{rule}: chapters"),
        cases=len(_strings(entry.get("cases"), f"{rule}: cases")),
        broken_backends=_strings(entry.get("broken_backends"), f"{rule}: broken_backends"),
        reason=reason,
    )


def load_coverage(path: str | os.PathLike[str]) -> list[CoverageRule]:
    """The rows of a coverage file, in its order; ``CoverageFileError`` naming the file when unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CoverageFileError(f"{path}: cannot read the rule coverage file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CoverageFileError(f"{path}: rule coverage file is not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise CoverageFileError(
            f"{path}: not a rule coverage table (want the JSON list `python -m tests.rule_coverage "
            "--json` prints)"
        )
    try:
        return [_row(entry) for entry in data]
    except ValueError as exc:
        raise CoverageFileError(f"{path}: not a rule coverage table: {exc}") from exc
