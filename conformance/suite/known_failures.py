"""Declared known failures: cases a backend is known to fail, with the reason and a link to the bug.

Entries come from the backend's optional ``known_failures`` attribute and from ``--known-failures FILE``
(TOML, or JSON when the name ends in ``.json``). Each entry is a mapping:

* ``case`` (required) — a glob over the case id (the pytest node id, as in the result file):
  ``*`` matches any run of characters (``/`` and ``::`` included), ``?`` one character; everything else
  is literal, brackets too, so ``conformance/mm_out/test_mm_out.py::test_x[float16-*]`` means what it says.
* ``rule`` (optional) — a glob over the rule id the failure must name (``mm_out/values``,
  ``lowering/*``). Without it, any failure of the case (setup or call) is the known one. An id or glob in a
  family older releases used (``placement/pcie``, ``bad-inputs/wrong-dtype-*``) matches what it matched
  then, under today's ids (``conformance/catalogue/legacy.py``).
* ``reason`` (required) — why it fails, in a sentence.
* ``link`` (optional) — the issue or pull request that tracks it.
* ``crash`` (optional, ``false`` by default) — ``true``: the case kills its process (a segmentation fault,
  an abort). Such an entry declares that and nothing else: a failure that does not kill the process stays
  an ordinary failure (unless another entry declares it). With a ``rule``, it declares only a crash found
  under that rule: a generated case whose crash was found again and shrunk
  (``conformance/suite/crash_replay.py``) is recorded under the rule of the call that crashed
  (``differential/missing-error``: a call that had to be an error), and only such an entry, or one without a
  rule, declares it. Only a run under pytest-xdist (``-n``; the front door always uses it) survives a crash
  and records it ``xfailed``: the controller sees the worker die (``CaseOutcomes.pytest_handlecrashitem``). In
  one process the crash ends the run, and the case is ``crashed`` in the result file that ``harness.finalize``
  rebuilds.
* ``device_fault`` (optional, ``false`` by default) — ``true``: the case leaves the CUDA context broken (an
  illegal address, a sticky CUDA error), which the watchdog (``harness/watchdog.py``) records as
  ``device-fault`` and ends the process so that a fresh one runs the next case. Like ``crash``, it takes
  no ``rule`` and declares nothing else; under pytest-xdist the case is then recorded ``xfailed``, the
  watchdog's CUDA error kept as its message and evidence. In one process a device fault stops the run.

A matching case that fails as declared is ``xfailed`` (with the reason and link) and does not fail the
run. A matching case that passes fails with rule ``known-failures/stale``: the list cannot rot. A case
that fails with another rule than declared is an ordinary failure. An entry that matches no case of the
run is reported as a warning. TOML::

    [[known_failures]]
    case = "conformance/mm_out/test_mm_out.py::test_values_match_float64_reference[bfloat16-*]"
    rule = "mm_out/values"
    reason = "bf16 split-K accumulates in bf16"
    link = "https://github.com/pytorch/executorch/issues/12345"

    [[known_failures]]
    case =
    "conformance/bad_inputs/test_bad_inputs.py::test_bad_inputs_are_rejected_and_change_nothing[*-empty-*]"
    crash = true reason = "a segmentation fault: the kernel reads through an empty tensor"

JSON: ``{"known_failures": [{"case": ..., "rule": ..., "reason": ..., "link": ..., "crash": true}]}`` (or
the bare list).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.catalogue import pattern_names_rule
from conformance.common.rules import rule_id
from harness.case_ids import current_case_id

STALE_RULE = rule_id("known-failures/stale")
FILE_KEY = "known_failures"
#: The string fields, each with whether it is required.
_FIELDS = {"case": True, "rule": False, "reason": True, "link": False}
#: The flags (optional booleans, false when absent).
_FLAGS = ("crash", "device_fault")


class KnownFailuresError(ValueError):
    """A known-failures file or attribute that cannot be used; the message names the entry and field."""


@dataclass(frozen=True)
class KnownFailure:
    case: str
    rule: str | None
    reason: str
    link: str
    source: str  # "backend" or the file it came from, with the entry's position
    crash: bool = False  # the case kills its process: declares that, and no other failure
    device_fault: bool = False  # the case breaks the CUDA context (a watchdog device-fault verdict)

    @property
    def ends_as(self) -> str | None:
        """The flag by which the entry declares the case's process ending (``crash``, ``device_fault``);
        None for an entry that declares a failure."""
        return "crash" if self.crash else "device_fault" if self.device_fault else None

    @property
    def ends_process(self) -> bool:
        return self.ends_as is not None

    def matches_case(self, nodeid: str) -> bool:
        """Whether the entry's ``case`` glob matches ``nodeid``, as written or, written before the chapters
        were folders (``conformance/test_<chapter>.py::...``), as today's id (``harness.case_ids``)."""
        return glob_match(self.case, nodeid) or glob_match(current_case_id(self.case), nodeid)

    def matches_rule(self, rule: str | None) -> bool:
        """A failure naming ``rule`` (``None``: the failure named no rule) is the declared one."""
        if self.rule is None:
            return True
        return rule is not None and pattern_names_rule(self.rule, rule, glob_match)

    def describe(self) -> str:
        rule = f", rule {self.rule!r}" if self.rule else ""
        ends = f", {self.ends_as} = true" if self.ends_as else ""
        return f"case {self.case!r}{rule}{ends} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "rule": self.rule,
            "reason": self.reason,
            "link": self.link,
            "source": self.source,
            "crash": self.crash,
            "device_fault": self.device_fault,
        }


def glob_match(pattern: str, text: str) -> bool:
    return _compile(pattern).fullmatch(text) is not None


_CACHE: dict[str, re.Pattern[str]] = {}


def _compile(pattern: str) -> re.Pattern[str]:
    compiled = _CACHE.get(pattern)
    if compiled is None:
        parts = (".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
        compiled = _CACHE[pattern] = re.compile("".join(parts), re.DOTALL)
    return compiled


def parse_entries(raw: object, source: str) -> list[KnownFailure]:
    """Validate a sequence of mappings; every problem is a KnownFailuresError naming the entry."""
    if isinstance(raw, Mapping):
        extra = sorted(str(key) for key in raw if key != FILE_KEY)
        if extra:
            raise KnownFailuresError(
                f"{source}: unknown top-level key(s) {extra}; entries go in a list named {FILE_KEY!r}"
            )
        raw = raw.get(FILE_KEY)
    if raw is None:
        return []
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise KnownFailuresError(
            f"{source}: known failures must be a list of entries, found {type(raw).__name__}"
        )
    entries = []
    for index, item in enumerate(raw, start=1):
        where = f"{source}: entry {index}"
        if not isinstance(item, Mapping):
            raise KnownFailuresError(f"{where}: must be a table/object, found {type(item).__name__}")
        unknown = sorted(set(item) - {*_FIELDS, *_FLAGS})
        if unknown:
            fields = sorted({*_FIELDS, *_FLAGS})
            raise KnownFailuresError(f"{where}: unknown field(s) {unknown}; fields are {fields}")
        for name, required in _FIELDS.items():
            value = item.get(name)
            if value is None and not required:
                continue
            if not isinstance(value, str) or (required and not value.strip()):
                found = "missing" if value is None else repr(value)
                raise KnownFailuresError(f"{where}: field {name!r} must be a non-empty string, found {found}")
        for name in _FLAGS:
            value = item.get(name, False)
            if not isinstance(value, bool):
                raise KnownFailuresError(f"{where}: field {name!r} must be true or false, found {value!r}")
        crash = bool(item.get("crash", False))
        device_fault = bool(item.get("device_fault", False))
        if crash and device_fault:
            raise KnownFailuresError(
                f"{where}: crash = true and device_fault = true: a case ends one way; declare two entries"
            )
        if device_fault and item.get("rule"):
            raise KnownFailuresError(
                f"{where}: field 'rule' does not go with device_fault = true: a broken context names no rule"
            )
        entries.append(
            KnownFailure(
                case=item["case"],
                rule=item.get("rule") or None,
                reason=item["reason"],
                link=item.get("link") or "",
                source=f"{source} #{index}",
                crash=crash,
                device_fault=device_fault,
            )
        )
    return entries


def load_file(path: str | Path) -> list[KnownFailure]:
    """Read a TOML (or ``.json``) known-failures file."""
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KnownFailuresError(f"{target}: cannot read: {exc}") from exc
    if target.suffix.lower() == ".json":
        try:
            data: object = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KnownFailuresError(f"{target}: not valid JSON: {exc}") from exc
    else:
        data = _parse_toml(text, target)
    return parse_entries(data, str(target))


def _parse_toml(text: str, target: Path) -> object:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError as exc:
            raise KnownFailuresError(
                f"{target}: reading TOML needs Python 3.11 or the 'tomli' package; "
                "install tomli, or write the file as JSON (a name ending in .json)"
            ) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KnownFailuresError(f"{target}: not valid TOML: {exc}") from exc


def from_backend(backend: object) -> list[KnownFailure]:
    """The backend's own ``known_failures`` attribute (optional)."""
    raw = getattr(backend, "known_failures", None)
    if callable(raw):
        raw = raw()
    name = getattr(backend, "name", "backend")
    return parse_entries(raw, f"backend {name!r} known_failures")


def load_all(backend: object, files: Iterable[str | Path]) -> list[KnownFailure]:
    entries = from_backend(backend)
    for path in files:
        entries.extend(load_file(path))
    return entries


def first_match(
    entries: Iterable[KnownFailure],
    nodeid: str,
    rule: str | None,
    *,
    crash: bool = False,
    device_fault: bool = False,
) -> KnownFailure | None:
    """The entry that declares this failure of ``nodeid``: one naming ``rule`` (``None``: the failure named
    none); with ``crash``, the case's process dying instead; with ``device_fault``, the watchdog's
    device-fault verdict. Crash and device-fault entries declare only that."""
    return next(
        (
            e
            for e in entries
            if (e.crash, e.device_fault) == (crash, device_fault)
            and e.matches_case(nodeid)
            and e.matches_rule(rule)
        ),
        None,
    )


def case_matches(entries: Iterable[KnownFailure], nodeid: str) -> list[KnownFailure]:
    """Every entry for ``nodeid``, crash and device-fault entries included (any makes a pass stale)."""
    return [e for e in entries if e.matches_case(nodeid)]
