"""The contract as rules: every normative sentence of the plug-in protocol and the SPEC, quoted, with the rule
ids that enforce it (``entries.py``), the text it is held to (``text.py``) and the audit that holds it there
(``audit.py``); and the rule table (``rule_table.py``), every rule id with its chapters, level and clause.
``python -m conformance.catalogue`` prints the sentences, ``python -m conformance.common.rules`` the rules.

Nothing here imports torch or a chapter: the catalogue is data, read by the chapters (their rule ids, through
``conformance.common.rules``), the levels, and the coverage table (``conformance.suite.rule_coverage``).
"""

from __future__ import annotations

from conformance.catalogue.entries import CATALOGUE, ENTRIES, UNCOVERED
from conformance.catalogue.entry import Entry, Status
from conformance.catalogue.legacy import (
    LEGACY_FAMILIES,
    LEGACY_IDS,
    SUITE_WIDE,
    canonical_rule_id,
    legacy_rule_id,
    pattern_names_rule,
)
from conformance.catalogue.rule import CHAPTERS, ID, Level, Rule, is_rule_id
from conformance.catalogue.rule_table import RULE_TABLE

__all__ = [
    "CATALOGUE",
    "CHAPTERS",
    "ENTRIES",
    "ID",
    "LEGACY_FAMILIES",
    "LEGACY_IDS",
    "RULES_BY_ID",
    "RULE_TABLE",
    "SUITE_WIDE",
    "UNCOVERED",
    "Entry",
    "Level",
    "Rule",
    "Status",
    "canonical_rule_id",
    "for_rule",
    "is_rule_id",
    "legacy_rule_id",
    "named_rule_ids",
    "pattern_names_rule",
    "patterns",
    "rule_index",
]


def rule_index(table: tuple[Rule, ...]) -> dict[str, Rule]:
    """Every rule id -> its row; an id two rows make is an error (one owner per rule)."""
    found: dict[str, Rule] = {}
    for row in table:
        for rule_id in row.ids:
            if rule_id in found:
                raise ValueError(
                    f"rule table: {rule_id!r} is made by {found[rule_id].pattern!r} and {row.pattern!r}"
                )
            found[rule_id] = row
    return found


#: Every rule id of the table -> its row, in the table's order.
RULES_BY_ID: dict[str, Rule] = rule_index(RULE_TABLE)


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
