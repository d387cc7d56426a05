"""A red run's likely cause first: the failed rules ranked by how many failures each one explains.

A backend that breaks an every-call invariant (it writes into its caller's inputs, say) fails cases all
over the suite, each in its own chapter's words; ranked by their own rules, those consequences bury the
cause. The contract monitor (``conformance/common/contract_monitor.py``) names the broken invariant in the
case where it happened, under its ``contract/`` rules. Here a failure counts under the invariant it saw: its
own when the monitor failed it, else the first invariant broken earlier in the same worker process (the
state a later case inherits), else its own rule. Every failure keeps its own rule and repro in the result
file; this only orders the headline. One owner for the terminal, the page, the JUnit file and the CI
summary. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from harness.outcomes import FAILING

#: The rule family of the invariants every call must keep (the contract monitor's): a failure under one
#: explains the failures that follow it in the same process.
INVARIANT_FAMILY = "contract/"
#: What a failure without a rule id (a crash, an error outside the checks) is counted under.
NO_RULE = "(no rule id: a crash or an error outside the checks)"


class _Case(Protocol):
    """What ranking needs of a case: a result file's ``CaseResult``, or a terminal summary's own record."""

    @property
    def id(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def rule(self) -> str | None: ...
    @property
    def worker(self) -> str | None: ...
    @property
    def started_s(self) -> float | None: ...


@dataclass
class Cause:
    """One rule of the headline and the failures it explains."""

    rule: str
    #: Failures that name this rule themselves.
    own: int = 0
    #: Failures under another rule, in a worker where this invariant had broken earlier.
    after: int = 0
    #: The ids of the cases it explains, in the order they ran.
    cases: list[str] = field(default_factory=list)

    @property
    def explained(self) -> int:
        return self.own + self.after

    @property
    def shown(self) -> str:
        """``[rule]`` (the rule as the terminal and known-failure files spell it), or ``NO_RULE``."""
        return self.rule if self.rule == NO_RULE else f"[{self.rule}]"

    def words(self) -> str:
        """``76  [contract/inputs-untouched]  (8 its own, 68 after it in the same worker)``, counts only
        where some came after it."""
        text = f"{self.explained:>5}  {self.shown}"
        return (
            f"{text}  ({self.own} its own, {self.after} after it in the same worker)" if self.after else text
        )


def is_invariant(rule: str | None) -> bool:
    return bool(rule) and str(rule).startswith(INVARIANT_FAMILY)


def likely_causes(cases: Iterable[_Case]) -> list[Cause]:
    """The causes of the failing ``cases`` (``harness.outcomes.FAILING``), the most failures explained
    first (ties: the earliest seen first)."""
    failing = [case for case in cases if case.outcome in FAILING]
    failing.sort(key=lambda c: (c.started_s is None, c.started_s or 0.0))
    broken: dict[str, str] = {}  # worker → the first invariant broken in it
    causes: dict[str, Cause] = {}
    for case in failing:
        own = str(case.rule) if case.rule else NO_RULE
        earlier = broken.get(case.worker) if case.worker else None
        if is_invariant(own):
            if case.worker:
                broken.setdefault(case.worker, own)
            rule, after = own, False
        elif earlier is not None:
            rule, after = earlier, True
        else:
            rule, after = own, False
        cause = causes.setdefault(rule, Cause(rule))
        cause.cases.append(case.id)
        if after:
            cause.after += 1
        else:
            cause.own += 1
    return sorted(causes.values(), key=lambda c: -c.explained)


def headline(causes: list[Cause]) -> str | None:
    """The one line a reader acts on, ``likely cause: [rule] (N of M failures)``; None: nothing failed."""
    if not causes:
        return None
    total = sum(c.explained for c in causes)
    first = causes[0]
    return f"likely cause: {first.shown} ({first.explained} of {total} failure{'s' if total != 1 else ''})"


def junit_properties(cases: Iterable[_Case]) -> list[tuple[str, str]]:
    """The JUnit file's testsuite properties: ``likely-cause`` (the headline) and ``failed-rules`` (every
    cause, the most explained first); none where nothing failed."""
    ranked = likely_causes(cases)
    line = headline(ranked)
    if line is None:
        return []
    return [("likely-cause", line), ("failed-rules", "; ".join(" ".join(c.words().split()) for c in ranked))]
