"""One row of the rule table (``rule_table.py``): a rule id, or a family of them, with the chapters whose
cases check it, its level, the clause a backend breaks when a check fails with it and, where no backend can
break it, why.

One grammar for every id (:data:`ID`): ``family/name``, more ``/parts`` allowed, lower case letters, digits,
``-``, ``_`` and ``.`` (``mm_out/values``, ``lowering/source-mutated/policy``). A *family* writes the part a
chapter fills from its parameters as ``{field}``, as the chapter's table keys it, and lists the values:
``mm_out/{bad_input}`` with ``bad_input=("none-out", ...)`` is one rule id per value, each a row of the
coverage table. A family is a shorthand for rows that share everything but that part; its ids are the
rules (levels, broken backends, known failures and results name them, never the pattern).

The sentences of the contract a rule enforces are not here: the sentence catalogue (``entries.py``) quotes
each sentence once and names the rules that enforce it, so a rule's sentences are a lookup
(:func:`conformance.catalogue.for_rule`), never a second copy.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from enum import Enum

from conformance.catalogue.chapters import chapter_files

#: A rule id. Paths (``x.py``, ``x.json``) have the shape and are not rule ids.
ID = re.compile(r"[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*(?:/[a-z0-9_][a-z0-9_.-]*)+")
_NOT_IDS = frozenset({"n/a"})
_FIELD = re.compile(r"\{([a-z_]+)\}")

#: The chapters: name -> test module, read from the folders (``chapters.py``).
CHAPTERS = chapter_files()


def is_rule_id(text: str) -> bool:
    """Whether ``text`` has a rule id's shape (the table says whether it is one)."""
    return bool(ID.fullmatch(text)) and text not in _NOT_IDS and not text.endswith((".py", ".json"))


class Level(str, Enum):
    """*must*: a wrong result, aliasing, a crash, lost or changed data, a missing contract error: fails the
    run. *should*: a conservative policy, a missing optimisation, a performance contract: reported apart
    (outcome ``should-failed``), failing the run only with ``--strict-should``."""

    MUST = "must"
    SHOULD = "should"


@dataclass(frozen=True)
class Rule:
    pattern: str
    """A rule id, or a family's pattern with ``{field}`` parts (``values`` lists what fills them)."""
    chapters: tuple[str, ...]
    """The chapters whose cases check it (names of :data:`CHAPTERS`); none for the plugin's own rule."""
    clause: str
    """What a backend must do, in one sentence: what a failure naming this rule says it broke."""
    level: Level = Level.MUST
    values: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """A family's fields, each with the values that fill it."""
    exempt: str = ""
    """Why no broken backend proves it: no backend can break it (the suite's own checks, the meter)."""

    def __post_init__(self) -> None:
        fields = _FIELD.findall(self.pattern)
        if sorted(fields) != sorted(name for name, _ in self.values):
            raise ValueError(f"rule table: {self.pattern!r} has fields {fields}, values for {self.values}")
        if not self.clause.strip():
            raise ValueError(f"rule table: {self.pattern!r} says nothing (its clause is empty)")
        unknown = set(self.chapters) - set(CHAPTERS)
        if unknown:
            raise ValueError(f"rule table: {self.pattern!r} names chapters that do not exist: {unknown}")
        bad = [i for i in self.ids if not is_rule_id(i)]
        if bad or not self.ids:
            raise ValueError(f"rule table: {self.pattern!r} makes ids outside the grammar: {bad}")

    @property
    def ids(self) -> tuple[str, ...]:
        """Every rule id of the row: the pattern itself, or one per combination of the family's values."""
        if not self.values:
            return (self.pattern,)
        names = [name for name, _ in self.values]
        return tuple(
            self.pattern.format(**dict(zip(names, combo, strict=True)))
            for combo in itertools.product(*(values for _, values in self.values))
        )

    @property
    def is_family(self) -> bool:
        return bool(self.values)


def must(
    pattern: str, clause: str, *, also: tuple[str, ...] = (), exempt: str = "", **values: tuple[str, ...]
) -> Rule:
    """A *must* rule (a family where ``values`` fill the pattern's ``{field}`` parts). ``also``: chapters
    besides its own (:func:`chapter`) whose cases check it."""
    return Rule(pattern, also, clause, Level.MUST, tuple(values.items()), exempt)


def should(
    pattern: str, clause: str, *, also: tuple[str, ...] = (), exempt: str = "", **values: tuple[str, ...]
) -> Rule:
    """A *should* rule, as :func:`must`."""
    return Rule(pattern, also, clause, Level.SHOULD, tuple(values.items()), exempt)


def chapter(name: str, *rows: Rule) -> tuple[Rule, ...]:
    """The rows of one chapter: each is checked by its cases (and by those of the chapters ``also`` adds)."""
    return tuple(replace(row, chapters=(name, *row.chapters)) for row in rows)
