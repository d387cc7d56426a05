"""Rule ids as older releases of the suite wrote them, mapped to today's: the one place that knows them.

Each chapter's rules are one family named after the chapter (``device_placement/pcie``, never
``placement/pcie``); the families that are no chapter keep their names (:data:`SUITE_WIDE`). Ids written
before that, in a known-failures file or an older result file, still mean what they meant:
:func:`canonical_rule_id` turns an old id into today's, and :func:`pattern_names_rule` matches a glob written
in either spelling as it matched then (``bad-inputs/wrong-dtype-*`` matches ``bad_inputs/wrong-dtype-int64``;
``skip-copy/*`` matches the skip-copy option's rules, now in ``runtime_options``, and never the option API's
``runtime_options/round-trip``, once ``options/round-trip``).

Nothing here imports torch or a chapter (``conformance.catalogue`` is data).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

#: Families that are no chapter: the contract monitor's (every case handed the backend), the suite's own
#: declarations and premises, the known-failures plugin's.
SUITE_WIDE: tuple[str, ...] = ("contract", "suite", "known-failures")

#: Old family -> the family of the chapter that owns its rules: ``placement/x`` is ``device_placement/x``.
LEGACY_FAMILIES: dict[str, str] = {
    "bad-inputs": "bad_inputs",
    "format": "program_format",
    "multi-method": "multi_method",
    "options": "runtime_options",
    "skip-copy": "runtime_options",
    "copies": "runtime_options",
    "placement": "device_placement",
    "streams": "streams_threads",
    "traffic": "traffic_meter",
    "view-pass": "lowering",
}
#: Old ids whose new name is more than a new family: a leaf that would collide in its new family keeps the
#: word that told it apart (``placement/pcie`` is ``device_placement/pcie``), and the one rule of a family
#: that is gone (``runtime``) joins its owner's.
LEGACY_IDS: dict[str, str] = {
    "skip-copy/pcie": "device_placement/skip-copy-pcie",
    "runtime/lower": "lowering/lower",
}
#: Where two families became one, the leaves all but one of them brought; the rest of the family was the
#: other's (``runtime_options/round-trip`` was ``options/round-trip``, ``lowering/outcome`` was
#: ``view-pass/outcome``). What an old glob over one of them (``skip-copy/*``) matched, and only that.
MERGED_LEAVES: dict[str, tuple[str, ...]] = {
    "skip-copy": (
        "option", "output-device", "values", "d2h-bytes", "h2d-bytes", "d2h-copy", "no-d2h-copy",
        "cpu-target",
    ),
    "copies": ("pinned-host-memory",),
    "lowering": (
        "zoo-lowers", "zoo", "unsupported-kernels", "unsupported-is-valueerror", "failure-not-sticky",
    ),
}  # fmt: skip

#: Today's family -> the old families whose ids it holds (``lowering`` is one of its own).
_SOURCES: dict[str, tuple[str, ...]] = {}
for _old, _new in {**LEGACY_FAMILIES, "lowering": "lowering"}.items():
    _SOURCES[_new] = (*_SOURCES.get(_new, ()), _old)
_RENAMED = {new: old for old, new in LEGACY_IDS.items()}
#: The families older ids were written in that no id of today is.
_OLD_FAMILIES = frozenset({*LEGACY_FAMILIES, *(old.partition("/")[0] for old in LEGACY_IDS)})
_WILDCARD = re.compile(r"[*?\[]")


def canonical_rule_id(rule: str) -> str:
    """Today's id of ``rule``: an old id (or a pattern in an old family) mapped, anything else unchanged."""
    if rule in LEGACY_IDS:
        return LEGACY_IDS[rule]
    family, slash, rest = rule.partition("/")
    if slash and family in LEGACY_FAMILIES:
        return f"{LEGACY_FAMILIES[family]}/{rest}"
    return rule


def legacy_rule_id(rule: str) -> str | None:
    """How older releases wrote today's ``rule``; None where they wrote it as it is (``mm_out/values``)."""
    if rule in _RENAMED:
        return _RENAMED[rule]
    family, _, rest = rule.partition("/")
    sources = _SOURCES.get(family, ())
    if len(sources) > 1:
        brought = [old for old in sources if rest in MERGED_LEAVES.get(old, ())]
        sources = tuple(brought) or tuple(old for old in sources if old not in MERGED_LEAVES)
    old = sources[0] if sources else family
    return None if old == family else f"{old}/{rest}"


def is_legacy(pattern: str) -> bool:
    """Whether ``pattern`` (an id, or a glob over ids) is written in an old family."""
    family = pattern.partition("/")[0]
    return family in _OLD_FAMILIES


def _glob(pattern: str, text: str) -> bool:
    return fnmatch.fnmatchcase(text, pattern)


def pattern_names_rule(pattern: str, rule: str, match: Callable[[str, str], bool] = _glob) -> bool:
    """Whether ``pattern``, a glob over rule ids in either spelling (``match(pattern, text)``: the caller's
    glob), names today's ``rule``. A pattern in an old family matches what it matched then, the ids of today
    whose old name it matches, and nothing else; a pattern whose family is itself a glob (``*/values``)
    matches either spelling; any other pattern, today's ids."""
    old = legacy_rule_id(rule)
    if is_legacy(pattern):
        return old is not None and match(pattern, old)
    if _WILDCARD.search(pattern.partition("/")[0]):
        return match(pattern, rule) or (old is not None and match(pattern, old))
    return match(pattern, rule)
