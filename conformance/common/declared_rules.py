"""Which rules each case checks: declared beside the case, read only here.

A case declares every rule id it can fail with as a ``rules`` mark: on the test function (or a module's
``pytestmark``) when all its cases check the same rules, and on a parameter when the parameter picks the rule
(``pytest.param(..., marks=pytest.mark.rules(BAD_INPUT_RULES[name]))``; :func:`params` builds those from a
mapping). A case's declared rules are the union of its marks and of what its fixtures imply: a case handed
the backend checks the contract monitor's rules too, since each of its calls passes through the monitor
(``conformance/common/contract_monitor.py``), whatever the case itself checks.

Two readers, both through :func:`declared`: the outcome plugin (``conformance/suite/outcomes.py``), for which
a failure naming a rule its case does not declare is a suite error (rule ``suite/undeclared-rule``, counted
with the suite's self-checks, never as the backend's), and the coverage table
(``conformance/suite/rule_coverage.py``), which lists each rule's cases from pytest's own collection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import pytest

from conformance.common.contract_monitor import RULES as MONITOR_RULES
from conformance.common.rules import rule_id

if TYPE_CHECKING:
    from _pytest.mark import ParameterSet  # what pytest.param returns; pytest 8 does not export it

__all__ = ["IMPLIED", "MARKER", "MARKER_HELP", "UNDECLARED", "declared", "params", "undeclared"]

MARKER = "rules"
MARKER_HELP = (
    "rules(*ids): the rule ids the case can fail with; a failure under any other is a suite error "
    "(conformance/common/declared_rules.py)"
)
#: The rule of the suite error a failure under an undeclared rule becomes.
UNDECLARED = rule_id("suite/undeclared-rule")
#: Fixture -> the rules every case that asks for it (directly or through another fixture) checks: the
#: backend comes wrapped in the contract monitor, which can fail any case under its own rules. One
#: suite-wide declaration, instead of the monitor's five ids copied onto a thousand cases.
IMPLIED: Mapping[str, tuple[str, ...]] = {"backend": MONITOR_RULES}


def declared(item: pytest.Item) -> frozenset[str]:
    """The rule ids ``item`` declares: its ``rules`` marks (function, class, module, parameters) and those
    its fixtures imply (:data:`IMPLIED`)."""
    marked = {rule for mark in item.iter_markers(MARKER) for rule in mark.args}
    fixtures = set(getattr(item, "fixturenames", ()))
    implied = {rule for fixture, rules in IMPLIED.items() if fixture in fixtures for rule in rules}
    return frozenset(marked | implied)


def params(rules_by_value: Mapping[str, str | Iterable[str]]) -> list[ParameterSet]:
    """One ``pytest.param`` per key, with the key as its id, declaring the rule id(s) that key picks: for
    ``@pytest.mark.parametrize("rule", params(BAD_INPUT_RULES))``, where the case fails under
    ``BAD_INPUT_RULES[rule]``."""
    return [
        pytest.param(
            value,
            id=value,
            marks=pytest.mark.rules(*([rules] if isinstance(rules, str) else sorted(rules))),
        )
        for value, rules in rules_by_value.items()
    ]


def undeclared(item: pytest.Item, rules: Iterable[str | None]) -> str | None:
    """The suite error's message when a failure of ``item`` names a rule (of ``rules``) it does not declare,
    else None: the case, the rule and the declared set."""
    have = declared(item)
    missing = sorted({rule for rule in rules if rule is not None and rule not in have})
    if not missing:
        return None
    named = ", ".join(missing)
    return (
        f"[{UNDECLARED}] {item.nodeid}: failed under {named}, which the case does not declare "
        f"(it declares: {', '.join(sorted(have)) or 'nothing'}); a suite error, not the backend's: add the "
        f"rule to the case's @pytest.mark.rules(...), or fix the rule its check names"
    )
