"""One row of the catalogue: a sentence of the contract (quoted verbatim), where it stands, and what holds a
backend to it.

Three kinds, one constructor each, so a row reads like what it says:

* :func:`enforced` — the rule ids (fnmatch patterns) whose cases fail a backend that breaks the sentence;
* :func:`informative` — the sentence binds no backend under test (it describes upstream, our reference's
  insides, the suite's own behaviour or a measured fact), with the one-line reason;
* :func:`uncovered` — a normative sentence no rule enforces yet: a gap, listed in ``UNCOVERED`` (an
  allowance the self-tests print and that must shrink to empty), with what is missing.

A quote is a whole sentence or a verbatim fragment of one (whitespace aside). One sentence may be split
into several rows, one per clause, when its clauses stand differently (one enforced, one a gap); two rows
never quote overlapping text.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal

Status = Literal["enforced", "informative", "uncovered"]
STATUSES: tuple[Status, ...] = ("enforced", "informative", "uncovered")


@dataclass(frozen=True)
class Entry:
    source: str
    """``protocol.py: <section>`` (``Errors``, ``Part mm_out``, ...) or ``SPEC §<n>`` (``§1b``, ...)."""
    quote: str
    rules: tuple[str, ...] = ()
    status: Status = "enforced"
    reason: str = ""
    """Informative: why it binds no backend. Uncovered: what no rule checks yet."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"catalogue: status {self.status!r} is not one of {STATUSES}: {self.quote!r}")
        if (self.status == "enforced") != bool(self.rules):
            raise ValueError(f"catalogue: an {self.status} entry has rules={self.rules!r}: {self.quote!r}")
        if self.status != "enforced" and not self.reason.strip():
            raise ValueError(f"catalogue: an {self.status} entry needs its reason: {self.quote!r}")
        if not self.quote.strip():
            raise ValueError(f"catalogue: an entry of {self.source!r} quotes nothing")

    def enforced_by(self, rule: str) -> bool:
        """Whether rule id ``rule`` is one of the rules (patterns) that enforce this sentence."""
        return any(fnmatch.fnmatchcase(rule, pattern) for pattern in self.rules)

    def cite(self) -> str:
        """``SPEC §1b: "quote"`` — how the coverage table names the sentence a rule enforces."""
        return f'{self.source}: "{" ".join(self.quote.split())}"'


def enforced(source: str, quote: str, *rules: str) -> Entry:
    return Entry(source, quote, tuple(rules))


def informative(source: str, quote: str, reason: str) -> Entry:
    return Entry(source, quote, (), "informative", reason)


def uncovered(source: str, quote: str, missing: str) -> Entry:
    return Entry(source, quote, (), "uncovered", missing)
