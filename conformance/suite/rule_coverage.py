"""Rule coverage: every rule id of the rule table -> the cases that check it and the broken backends that
prove a chapter fails on it.

:func:`coverage_rows` returns one row per rule id for the dashboard's coverage page. The rules, their levels,
clauses and exemptions are the rule table's (``conformance/catalogue/rule_table.py``); the sentences of the
SPEC and the protocol each rule enforces are the sentence catalogue's (``python -m conformance.catalogue``).
What this module finds:

* **cases** — what each case declares (``@pytest.mark.rules``, read by
``conformance/common/declared_rules.py``),
  from pytest's own collection of the chapters (:func:`collected_cases`): the node ids are pytest's, and a
  case's rules are those a failure of it may name; one naming any other is a suite error at run time.
* **broken backends** — given, not found: the broken backends and their declarations (which rules each
  must make its chapter fail) live with the self-tests that prove them, in ``tests/``, and product code
  never imports tests. ``python -m tests.rule_coverage`` passes them in (:class:`Proof`); this module's
  own command prints the table without them. Where every broken backend of a rule needs CUDA the status is
  ``proven-gpu``: the CPU self-tests skip those, and only a GPU run of them (``.ci/gpu/followup.sh``) is the
  proof.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.catalogue import CATALOGUE, CHAPTERS, RULES_BY_ID, for_rule
from conformance.common.declared_rules import declared
from conformance.common.rules import level_of
from harness.backend_loader import DEFAULT_BACKEND

__all__ = ["CHAPTERS", "ROOT", "Case", "Proof", "Row", "collected_cases", "coverage_rows", "main"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Proof:
    """A broken backend (``module:attr``, as ``--backend`` takes it) that its chapter fails on ``rules``; the
    self-tests in ``tests/`` run it to prove that. ``cuda``: the failing cases need a CUDA device."""

    spec: str
    rules: tuple[str, ...]
    cuda: bool = False


# =============================================================================================== cases


@dataclass(frozen=True)
class Case:
    """One case pytest collects: its node id, and the rule ids it declares."""

    id: str
    chapter: str
    rules: frozenset[str]


class _Declarations:
    """A pytest plugin keeping every collected case with the rules it declares."""

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            chapter = (
                item.path.parent.name if CHAPTERS.get(item.path.parent.name) == item.path else item.path.stem
            )
            self.cases.append(Case(item.nodeid, chapter, declared(item)))


def collected_cases(chapters: Sequence[str] = tuple(CHAPTERS)) -> list[Case]:
    """Every case pytest collects from the chapters ``conformance/<chapter>/test_<chapter>.py``, with the rule
    ids it declares (``conformance/common/declared_rules.py``): pytest's own collection, in this process,
    against the reference backend (whichever backend a run tests, the cases are the same). Its output is shown
    only on failure."""
    plugin = _Declarations()
    args = [
        "--collect-only", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
        "--rootdir", str(ROOT), "--backend", DEFAULT_BACKEND,
        *(str(CHAPTERS[chapter]) for chapter in chapters),
    ]  # fmt: skip
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = pytest.main(args, plugins=[plugin])
    if code != pytest.ExitCode.OK:
        tail = output.getvalue()[-4000:]
        raise RuntimeError(f"collecting the chapters failed (pytest exit {code}):\n{tail}")
    return plugin.cases


# ================================================================================================ rows


@dataclass(frozen=True)
class Row:
    """One rule id: its level, the chapter(s) and cases that check it, what proves a chapter fails on it."""

    rule: str
    level: str
    chapters: list[str]
    cases: list[str]
    broken_backends: list[str]
    spec: list[str] = field(default_factory=list)
    """The sentences of the protocol and the SPEC this rule enforces, as the catalogue quotes them."""
    exemption: str | None = None
    exemption_reason: str | None = None
    gpu_only: bool = False
    """Every broken backend that proves it needs CUDA: CPU self-tests skip them, a GPU run proves them."""

    @property
    def status(self) -> str:
        if not self.cases:
            return "not-checkable" if self.exemption == "not-checkable" else "NO CASE"
        if self.broken_backends:
            return "proven-gpu" if self.gpu_only else "proven"
        if self.exemption is not None:
            return self.exemption
        return "NO BROKEN BACKEND"


def coverage_rows(cases: Sequence[Case] | None = None, proofs: Sequence[Proof] = ()) -> list[Row]:
    """One row per rule id of the rule table, and per rule id a case checks that the table lacks (the
    self-test fails on those), sorted by rule id."""
    cases = collected_cases() if cases is None else cases
    by_rule: dict[str, list[Case]] = {}
    for case in cases:
        for rule in case.rules:
            by_rule.setdefault(rule, []).append(case)
    rows = []
    for rule in sorted(set(RULES_BY_ID) | set(by_rule)):
        proving = [p for p in proofs if rule in p.rules]
        exempt = RULES_BY_ID[rule].exempt if rule in RULES_BY_ID else ""
        rows.append(
            Row(
                rule=rule,
                level=level_of(rule).value,
                chapters=sorted({c.chapter for c in by_rule.get(rule, [])}),
                cases=sorted(c.id for c in by_rule.get(rule, [])),
                broken_backends=sorted(p.spec for p in proving),
                spec=[entry.cite() for entry in for_rule(rule, CATALOGUE)],
                exemption="not-checkable" if exempt else None,
                exemption_reason=exempt or None,
                gpu_only=bool(proving) and all(p.cuda for p in proving),
            )
        )
    return rows


def row_dict(row: Row) -> dict[str, Any]:
    return {**asdict(row), "status": row.status}


def render(rows: Sequence[Row], *, show_cases: bool = False) -> str:
    width = max(len(r.rule) for r in rows) + 2
    lines = [f"{'rule id':<{width}} level   cases  status             broken backend(s) / reason", "-" * 110]
    for row in rows:
        proof = ", ".join(b.split(":")[1] for b in row.broken_backends) or (row.exemption_reason or "")
        lines.append(f"{row.rule:<{width}} {row.level:<7} {len(row.cases):>5}  {row.status:<18} {proof}")
        if show_cases:
            lines += [f"{'':<{width}}   {case}" for case in row.cases]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    lines += ["", "summary: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))]
    return "\n".join(lines)


def main(
    argv: Sequence[str] | None = None,
    proofs: Sequence[Proof] | None = None,
    prog: str = "python -m conformance.suite.rule_coverage",
) -> int:
    """The table; ``proofs`` are the broken backends, which ``python -m tests.rule_coverage`` passes in."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Every rule id, the cases that check it and the broken backends that prove a chapter "
        "fails on it (the cases' declarations, from pytest's collection; the broken backends are given by "
        "python -m tests.rule_coverage).",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--cases", action="store_true", help="list every case under its rule")
    parser.add_argument("-o", "--output", type=Path, help="write the table to this file (default: stdout)")
    args = parser.parse_args(argv)
    if proofs is None:
        print(
            "note: no broken backends given (they live in tests/, which product code never imports): the "
            "statuses below count none; python -m tests.rule_coverage gives them",
            file=sys.stderr,
        )
    rows = coverage_rows(proofs=proofs or ())
    if args.json:
        text = json.dumps([row_dict(r) for r in rows], indent=2)
    else:
        text = render(rows, show_cases=args.cases)
    if args.output is None:
        print(text)
    else:  # the front door runs it in the background, its stderr in a log: the table apart
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
