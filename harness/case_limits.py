"""Each case's time limit: a default, per-chapter and per-marker overrides, and one case's own marker.

Rules come, each over the one before for the same key, from the suite (``suite_rules``: the conformance
suite's own, from its conftest), from the ini option ``case_timeouts`` (one rule a line, in a project that
loads the plugin) and from ``--case-timeout`` (repeatable):

* ``SECONDS`` or ``default=SECONDS`` — every case without a more specific rule;
* ``chapter:NAME=SECONDS`` — the cases of chapter NAME (``conformance/NAME/test_NAME.py``);
* ``marker:NAME=SECONDS`` — the cases marked NAME (e.g. ``slow``);
* ``case:GLOB=SECONDS`` — the cases whose id matches GLOB (``*`` any text, ``?`` one character, brackets
  literal, as in a known-failures file), e.g. one case a backend is known to be slow in;
* on one test: ``@pytest.mark.case_timeout(SECONDS)``.

A case's limit is its own marker's, else the first ``case:`` rule that matches it, else the largest of the
marker rules that match it, else its chapter's, else the default (``DEFAULT_S`` when none is set). ``0``
means no limit. The limit covers the whole case: setup (module fixtures that compile a program included),
call and teardown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Without any rule: ten minutes, about 4x the slowest case of a cold H100 run (158 s, a case waiting on
#: the compiles of the zoo).
DEFAULT_S = 600.0
INI = "case_timeouts"
OPTION = "--case-timeout"
MARKER = "case_timeout"
_KINDS = ("chapter", "marker", "case")


class CaseLimitError(ValueError):
    """A rule that cannot be read; the message names the rule and the expected form."""


@dataclass(frozen=True)
class CaseLimits:
    default_s: float = DEFAULT_S
    chapters: Mapping[str, float] = field(default_factory=dict)
    markers: Mapping[str, float] = field(default_factory=dict)
    cases: Mapping[str, float] = field(default_factory=dict)  # glob over the case id -> seconds

    def limit(
        self, chapter: str, markers: Iterable[str], own: float | None = None, case: str = ""
    ) -> tuple[float | None, str]:
        """Seconds for a case (None: no limit) from its chapter, its marker names, its own marker and its
        id, and which rule set them (for the message of a timeout)."""
        by_id = next(((g, s) for g, s in self.cases.items() if case and _glob(g).fullmatch(case)), None)
        if own is not None:
            seconds, source = own, f"its own @pytest.mark.{MARKER}"
        elif by_id is not None:
            seconds, source = by_id[1], f"rule case:{by_id[0]}"
        else:
            matching = sorted((self.markers[name], name) for name in set(markers) if name in self.markers)
            if matching:
                seconds, source = matching[-1][0], f"rule marker:{matching[-1][1]}"
            elif chapter in self.chapters:
                seconds, source = self.chapters[chapter], f"rule chapter:{chapter}"
            else:
                seconds, source = self.default_s, "the default"
        return (seconds if seconds > 0 else None), source

    def describe(self) -> str:
        parts = [f"default {self.default_s:g} s"]
        parts += [f"chapter {name} {s:g} s" for name, s in sorted(self.chapters.items())]
        parts += [f"marker {name} {s:g} s" for name, s in sorted(self.markers.items())]
        parts += [f"case {glob} {s:g} s" for glob, s in self.cases.items()]
        return ", ".join(parts)


def _glob(pattern: str) -> re.Pattern[str]:
    """``*`` any text, ``?`` one character, everything else literal (brackets too: they are in case ids)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))


def parse_rules(
    ini_lines: Iterable[str], cli_rules: Iterable[str], suite_lines: Iterable[str] = ()
) -> CaseLimits:
    """The limits from the suite's rules, the ini's lines over them, then the command line's."""
    rules: dict[tuple[str, str], float] = {}
    sources = (("the suite's case time limits", suite_lines), ("ini option case_timeouts", ini_lines))
    for where, lines in (*sources, (OPTION, cli_rules)):
        for line in lines:
            text = line.strip()
            if text and not text.startswith("#"):
                rules[_parse_rule(text, where)] = _seconds_of(text, where)
    default = rules.pop(("default", ""), DEFAULT_S)
    chapters = {name: s for (kind, name), s in rules.items() if kind == "chapter"}
    markers = {name: s for (kind, name), s in rules.items() if kind == "marker"}
    cases = {name: s for (kind, name), s in rules.items() if kind == "case"}
    return CaseLimits(default, chapters, markers, cases)


def _parse_rule(text: str, where: str) -> tuple[str, str]:
    key, sep, _ = text.rpartition("=")
    if not sep or key == "default":
        return ("default", "")
    kind, colon, name = key.partition(":")
    if not colon or kind not in _KINDS or not name:
        raise CaseLimitError(
            f"{where}: {text!r} is not a case time limit; want SECONDS, default=SECONDS, "
            "chapter:NAME=SECONDS, marker:NAME=SECONDS or case:GLOB=SECONDS"
        )
    return (kind, name)


def _seconds_of(text: str, where: str) -> float:
    value = text.rpartition("=")[2].strip()
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise CaseLimitError(f"{where}: {text!r}: {value!r} must be a number of seconds ≥ 0 (0: no limit)")
    return seconds


def marker_seconds(args: tuple[object, ...], kwargs: Mapping[str, object], where: str) -> float:
    """The seconds of a ``@pytest.mark.case_timeout(SECONDS)`` marker, or a CaseLimitError naming it."""
    value = args[0] if args else kwargs.get("seconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise CaseLimitError(f"{where}: @pytest.mark.{MARKER}(SECONDS) wants seconds ≥ 0, got {value!r}")
    return float(value)
