"""Rule ids and their levels, read from the rule table (``conformance/catalogue/rule_table.py``), the one
place a rule is written down.

A chapter names each rule it checks through the table, at module level, so a rule id the table lacks stops
the chapter on import with the id and the file: ``VALUES = rule_id("mm_out/values")``, then
``assert_exact(VALUES, ...)``. A family's ids, keyed by the chapter's parameter, come from
:func:`family_ids` (``BAD_INPUT_RULES = family_ids("mm_out/{bad_input}", BAD_INPUTS)``).

Every rule id is *must* (a wrong result, aliasing, a crash, lost or changed data, a missing contract error)
or *should* (a conservative policy, a missing optimisation, a performance contract). A failed *must* rule
fails the run; a failed *should* rule is reported apart (outcome ``should-failed``) and fails the run only
with ``--strict-should``. Op coverage ("op X is not mapped") is neither: chapters report it with
``checks.coverage_gap`` (outcome ``coverage``) and it never fails a run.

``python -m conformance.common.rules`` prints the table: every rule (a family as its pattern and values), its
level, the chapters that check it and its clause; ``--ids`` every rule id with its level.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

from conformance.catalogue import CHAPTERS, RULE_TABLE, RULES_BY_ID, Level, Rule

__all__ = ["CHAPTERS", "Level", "UnknownRule", "family_ids", "level_of", "main", "rule_id", "rule_of"]

TABLE_FILE = "conformance/catalogue/rule_table.py"

#: ``[rule-id]`` at the start of a failure message.
_RULE_ID = re.compile(r"^\[([^\[\]\s]+)\]")


class UnknownRule(LookupError):
    """A chapter named a rule id the table does not have; the message names the id and where it was named."""

    def __str__(self) -> str:
        return str(self.args[0])


def _caller(depth: int) -> str:
    """``file:line`` of the code ``depth`` frames up (the chapter that named the id)."""
    frame = sys._getframe(depth + 1)
    path = Path(frame.f_code.co_filename)
    root = Path(__file__).resolve().parents[2]
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    return f"{shown.as_posix()}:{frame.f_lineno}"


def _unknown(text: str, where: str, hint: str = "") -> UnknownRule:
    return UnknownRule(
        f"unknown rule id {text!r} named in {where}: every rule id is a row of {TABLE_FILE} "
        f"(add the row, or fix the id){hint}"
    )


def rule_id(text: str) -> str:
    """``text`` if it is a rule id of the table, else :class:`UnknownRule` naming it and the caller's file."""
    if text not in RULES_BY_ID:
        raise _unknown(text, _caller(1))
    return text


def family_ids(pattern: str, values: Iterable[str]) -> dict[str, str]:
    """``{value: rule id}`` of a one-field family of the table (``"mm_out/{bad_input}"``) for ``values``, the
    keys of a chapter's parameter table: a value the family lacks is an :class:`UnknownRule`."""
    rows = [row for row in RULE_TABLE if row.pattern == pattern and len(row.values) == 1]
    where = _caller(1)
    if not rows:
        raise _unknown(pattern, where, " — it is not a one-field family of the table")
    ((field, allowed),) = rows[0].values
    ids = {value: pattern.format(**{field: value}) for value in values}
    for value, made in ids.items():
        if value not in allowed:
            raise _unknown(made, where, f" — {pattern!r} has {field} in {list(allowed)}")
    return ids


def level_of(rule: str) -> Level:
    """The level of rule id ``rule`` (the text between the brackets of a failure message). An id the table
    lacks (a failure from elsewhere, an older result file) is *must*: it fails the run rather than hide."""
    row = RULES_BY_ID.get(rule)
    return Level.MUST if row is None else row.level


def rule_of(message: str) -> str | None:
    """The rule id a failure message starts with: ``[mm_out/values] mm_out(..): ..`` -> ``mm_out/values``."""
    match = _RULE_ID.match(message.lstrip())
    return match.group(1) if match else None


# ========================================================================================== the listing


def _row_lines(row: Rule, width: int) -> list[str]:
    chapters = ", ".join(row.chapters) or "the known-failures plugin"
    lines = [f"{row.pattern:<{width}} {row.level.value:<7} {row.clause}  [{chapters}]"]
    notes = [f"{field}: {', '.join(values)}" for field, values in row.values]
    notes += [f"no broken backend: {row.exempt}"] if row.exempt else []
    indent = " " * (width + 8)
    for note in notes:  # wrapped under the row, so a family's values never run off the screen
        lines += textwrap.wrap(
            note, 120, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
        )
    return lines


def table(rows: Sequence[Rule] = RULE_TABLE) -> str:
    """The text ``python -m conformance.common.rules`` prints."""
    width = max(len(row.pattern) for row in rows) + 2
    lines = [f"{'rule id (a family: pattern, values)':<{width}} level   clause  [chapters that check it]"]
    lines.append("-" * 120)
    for row in rows:
        lines += _row_lines(row, width)
    ids = [i for row in rows for i in row.ids]
    should = sum(row.level is Level.SHOULD for row in rows for _ in row.ids)
    lines += ["", f"{len(ids)} rule ids ({should} should, {len(ids) - should} must) in {len(rows)} rows"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.common.rules",
        description=f"The rule table ({TABLE_FILE}): every rule, its level (must/should), the chapters whose "
        "cases check it and the clause it holds a backend to.",
    )
    parser.add_argument("--ids", action="store_true", help="print every rule id and its level, one a line")
    args = parser.parse_args(argv)
    if args.ids:
        print("\n".join(f"{rule} {row.level.value}" for rule, row in RULES_BY_ID.items()))
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
