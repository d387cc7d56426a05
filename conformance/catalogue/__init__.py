"""The contract as rules: every normative sentence of the plug-in protocol and the SPEC, quoted, with the rule
ids that enforce it (``entries.py``), the text it is held to (``text.py``) and the audit that holds it there
(``audit.py``). ``python -m conformance.catalogue`` prints it.

Nothing here imports torch or a chapter: the catalogue is data, read by the coverage table
(``conformance.rule_coverage``: which sentence a rule enforces) and by its self-tests.
"""

from __future__ import annotations

from conformance.catalogue.entries import CATALOGUE, ENTRIES, UNCOVERED
from conformance.catalogue.entry import Entry, Status

__all__ = ["CATALOGUE", "ENTRIES", "UNCOVERED", "Entry", "Status", "for_rule", "named_rule_ids", "patterns"]


def for_rule(rule: str, catalogue: tuple[Entry, ...] = CATALOGUE) -> list[Entry]:
    """The entries whose sentence rule id ``rule`` enforces."""
    return [entry for entry in catalogue if entry.enforced_by(rule)]


def patterns(catalogue: tuple[Entry, ...] = CATALOGUE) -> list[str]:
    """Every rule pattern the catalogue names, without repeats, in order."""
    return list(dict.fromkeys(p for entry in catalogue for p in entry.rules))


def named_rule_ids(catalogue: tuple[Entry, ...] = CATALOGUE) -> set[str]:
    """The rule ids the catalogue names outright (patterns without wildcards): the coverage table lists
    them even when no case checks them any more, so a renamed rule shows as a sentence nobody enforces."""
    return {p for p in patterns(catalogue) if not any(c in p for c in "*?[")}
