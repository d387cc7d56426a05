"""Rule levels: every rule id is *must* (a wrong result, aliasing, a crash, lost or changed data, a missing
contract error) or *should* (a conservative policy, a missing optimisation, a performance contract).

A failed *must* rule fails the run; a failed *should* rule is reported apart and fails the run only with
``--strict-should``. Op coverage ("op X is not mapped") is neither: chapters report it with
``checks.coverage_gap`` and it never fails a run.
"""

from __future__ import annotations

import fnmatch
from enum import Enum


class Level(str, Enum):
    MUST = "must"
    SHOULD = "should"


#: Rule-id patterns (fnmatch) that are *should*; every other rule id is *must*.
SHOULD_RULES: tuple[str, ...] = (
    # --- view pass (conformance/view_pass_cases.py) ---
    # --- end view pass ---
    # --- runtime and device placement ---
    "copies/pinned-host-memory",
    # --- end runtime and device placement ---
)


def level_of(rule: str) -> Level:
    """The level of rule id ``rule`` (the text between the brackets of a failure message)."""
    return Level.SHOULD if any(fnmatch.fnmatchcase(rule, p) for p in SHOULD_RULES) else Level.MUST
