"""The contract as rules: every normative sentence of the protocol (``conformance/protocol.py``) and the SPEC
(``docs/SPEC.md``) is quoted by the catalogue (``conformance/catalogue``), every quote is still in its source,
the vendored SPEC is the current one, and the gaps (``UNCOVERED``) are listed, not hidden.

That each rule pattern names a rule id the chapters check is in ``tests/conformance/test_rule_coverage.py``,
which has the chapters' rule ids at hand."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conformance.catalogue import (
    CATALOGUE,
    ENTRIES,
    RULES_BY_ID,
    UNCOVERED,
    for_rule,
    is_rule_id,
    named_rule_ids,
    patterns,
)
from conformance.catalogue.__main__ import main
from conformance.catalogue.audit import audit, quoted, summary
from conformance.catalogue.entry import Entry, enforced, informative, uncovered
from conformance.catalogue.text import (
    ROOT,
    SHARED_SPEC,
    SPEC,
    Sentence,
    is_normative,
    sentences,
    split_sentences,
)

TEXT = sentences()
FINDINGS = audit(CATALOGUE, TEXT)
HOW = (
    "add or fix its row in conformance/catalogue/entries.py: enforced(source, quote, rule ids), "
    "informative(source, quote, reason) or, in UNCOVERED, uncovered(source, quote, what is missing)"
)


def _found(*kinds: str) -> list[str]:
    return [str(f) for f in FINDINGS if f.kind in kinds]


# ====================================================================================== catalogue vs text


def test_every_normative_sentence_is_quoted() -> None:
    unquoted = _found("unquoted")
    assert unquoted == [], f"normative sentences no catalogue entry quotes ({HOW}):\n" + "\n".join(unquoted)


def test_every_quote_is_still_in_its_source() -> None:
    """A sentence reworded in the SPEC or the protocol fails here, naming the old quote (its new wording
    fails the test above): check that its rules still enforce what it now says."""
    lost = _found("quote-not-found", "quote-ambiguous", "unknown-source")
    assert lost == [], f"catalogue quotes not found once in their source ({HOW}):\n" + "\n".join(lost)


def test_every_normative_clause_has_an_owner() -> None:
    """A sentence quoted clause by clause: each normative word (must, never, before, ...) lies in a quote, so
    a clause whose row was dropped, or that the text gained, is not hidden by its sentence's other rows."""
    clauses = _found("unquoted-clause")
    assert clauses == [], f"normative words outside every quote of their sentence ({HOW}):\n" + "\n".join(
        clauses
    )


def test_no_clause_is_quoted_twice() -> None:
    twice = _found("quoted-twice")
    assert twice == [], "sentences two catalogue entries quote overlapping parts of:\n" + "\n".join(twice)


def test_gaps_are_in_the_allowance_and_only_there() -> None:
    assert all(entry.status == "uncovered" for entry in UNCOVERED)
    assert [entry.quote for entry in ENTRIES if entry.status == "uncovered"] == []


@pytest.mark.xfail(
    bool(UNCOVERED),
    reason=f"{len(UNCOVERED)} normative clauses no rule enforces yet: the allowance UNCOVERED in "
    "conformance/catalogue/entries.py, to shrink to empty "
    "(python -m conformance.catalogue --status uncovered)",
    strict=True,
)
def test_every_normative_sentence_is_enforced_or_informative() -> None:
    gaps = [f"{entry.cite()}: {entry.reason}" for entry in CATALOGUE if entry.status == "uncovered"]
    if gaps:
        warnings.warn(
            f"{len(gaps)} normative clauses of the contract no rule enforces yet:\n  " + "\n  ".join(gaps),
            UserWarning,
            stacklevel=1,
        )
    assert gaps == []


def test_rule_patterns_are_rule_ids() -> None:
    """Well-formed, and each names a rule of the rule table (an id, or a glob over ids: ``mm_out/none-*``);
    matching a rule id a case checks: tests/conformance/test_rule_coverage.py."""
    bad = [p for p in patterns() if not is_rule_id(p.replace("*", "x").replace("?", "x"))]
    assert bad == []
    unknown = [p for p in patterns() if not any(fnmatch.fnmatchcase(rule, p) for rule in RULES_BY_ID)]
    assert unknown == [], (
        f"sentence rows naming rules the table lacks (conformance/catalogue/rule_table.py): {unknown}"
    )


def test_the_counts_add_up() -> None:
    counts = summary(quoted(CATALOGUE, TEXT), CATALOGUE)
    statuses = ("enforced", "informative", "uncovered", "unquoted")
    assert sum(counts[f"normative, {s}"] for s in statuses) == counts["normative sentences"] > 50
    assert counts["uncovered entries (the allowance)"] == len(UNCOVERED)


# ============================================================================================ the SPEC copy


def test_the_vendored_spec_is_the_current_one() -> None:
    """CI has only the clone (``docs/SPEC.md``); a developer session also has ``../shared/SPEC.md``, and a
    new SPEC there must reach the copy the tests read, and the catalogue."""
    if not SHARED_SPEC.is_file():
        pytest.skip(
            f"{SHARED_SPEC} is absent (a clone without ../shared): nothing to compare docs/SPEC.md with"
        )
    assert SPEC.read_bytes() == SHARED_SPEC.read_bytes(), (
        f"{SPEC.relative_to(ROOT)} differs from {SHARED_SPEC}: the SPEC changed. Copy it "
        "(cp ../shared/SPEC.md docs/SPEC.md) and bring the catalogue up to date "
        "(python -m conformance.catalogue --check)"
    )


# ============================================================================================ the extractor


def test_sentences_end_at_stops_but_not_at_abbreviations() -> None:
    text = "Skip it (e.g. `W.t()`) now. float32 is exact. **Bold.** Next one; i.e. still one. Last"
    assert split_sentences(text) == [
        "Skip it (e.g. `W.t()`) now.",
        "float32 is exact.",
        "**Bold.**",
        "Next one; i.e. still one.",
        "Last",
    ]


def test_normative_words_both_sides() -> None:
    assert is_normative("``out`` must be row-major")
    assert is_normative("A destroyed handle raises ``ValueError``.")
    assert is_normative("The option is read before init.")
    assert not is_normative("Entry point: `nox -s conformance`.")
    assert not is_normative("Language: Python.")


def _text(tmp_path: Path, docstring: str, spec: str) -> list[Sentence]:
    protocol, spec_file = tmp_path / "protocol.py", tmp_path / "SPEC.md"
    protocol.write_text(f'"""{docstring}"""\n', encoding="utf-8")
    spec_file.write_text(spec, encoding="utf-8")
    return sentences(protocol, spec_file)


DOCSTRING = """The protocol.

Errors (every part)
    A violation raises an error naming the
    argument. Outputs stay on the device (export-
    time placement) once execute returns.

Part ``runtime`` (chapters ``a``,
``b``; SPEC §1b)
    * ``"view_pass": bool`` — ``False`` lowers, skipping
      the pass.
    * second bullet must hold.
"""
SPEC_TEXT = """# Title

Intro must be read.
- Language: Python.
## 1. Backend
Three parts.
### 1b. Runtime
- **Options** (callable before *and after* init): a list
  (tokens trimmed). Unknown keys: decide.
- `destroy(handle)` never crashes.
"""


def test_wrapped_lines_bullets_and_sections(tmp_path: Path) -> None:
    got = [(s.source, s.text) for s in _text(tmp_path, DOCSTRING, SPEC_TEXT)]
    assert got == [
        ("protocol.py: intro", "The protocol."),
        ("protocol.py: Errors", "A violation raises an error naming the argument."),
        ("protocol.py: Errors", "Outputs stay on the device (export-time placement) once execute returns."),
        ("protocol.py: Part runtime", '``"view_pass": bool`` — ``False`` lowers, skipping the pass.'),
        ("protocol.py: Part runtime", "second bullet must hold."),
        ("SPEC preamble", "Intro must be read."),
        ("SPEC preamble", "Language: Python."),
        ("SPEC §1", "Three parts."),
        ("SPEC §1b", "**Options** (callable before *and after* init): a list (tokens trimmed)."),
        ("SPEC §1b", "Unknown keys: decide."),
        ("SPEC §1b", "`destroy(handle)` never crashes."),
    ]


def test_the_audit_names_what_is_wrong_both_sides(tmp_path: Path) -> None:
    text = _text(tmp_path, DOCSTRING, SPEC_TEXT)
    rows = (
        informative("protocol.py: intro", "The protocol.", "a title"),
        enforced("protocol.py: Errors", "A violation raises an error naming the argument.", "x/y"),
        enforced("protocol.py: Errors", "Outputs stay on the device", "x/z"),
        uncovered("protocol.py: Errors", "once execute returns.", "no case"),
        enforced("protocol.py: Part runtime", "second bullet must hold.", "x/w"),
        informative("SPEC preamble", "Intro must be read.", "ours"),
        enforced("SPEC §1b", "callable before *and after* init", "x/o"),
        enforced("SPEC §1b", "`destroy(handle)` never crashes.", "x/d"),
    )
    assert audit(rows, text) == []
    # A clause's row dropped: its sentence is still quoted, but "once" has no owner.
    dropped = [(f.kind, f.text) for f in audit(tuple(r for r in rows if r.status != "uncovered"), text)]
    assert dropped == [
        (
            "unquoted-clause",
            "Outputs stay on the device (export-time placement) once execute returns. "
            "[outside every quote: once]",
        )
    ]
    # The protocol now says something new, and rewords a quoted sentence.
    reworded = DOCSTRING.replace("second bullet must hold.", "second bullet must always hold.")
    text = _text(tmp_path, reworded + "\nIdentity\n    ``name`` must never be empty.\n", SPEC_TEXT)
    found = {(f.kind, f.text) for f in audit(rows, text)}
    assert found == {
        ("quote-not-found", "second bullet must hold."),
        ("unquoted", "second bullet must always hold."),
        ("unquoted", "``name`` must never be empty."),
    }
    clashes = (
        *rows,
        enforced("protocol.py: Errors", "device (export-time", "x/q"),
        enforced("SPEC §9", "a", "x/r"),
    )
    kinds = {(f.kind, f.source) for f in audit(clashes, _text(tmp_path, DOCSTRING, SPEC_TEXT))}
    assert kinds == {("quoted-twice", "protocol.py: Errors"), ("unknown-source", "SPEC §9")}
    ambiguous = (
        *rows,
        informative("SPEC preamble", "Language", "a word"),
        informative("SPEC §1b", "(", "twice"),
    )
    found = {(f.kind, f.text) for f in audit(ambiguous, _text(tmp_path, DOCSTRING, SPEC_TEXT))}
    assert ("quote-ambiguous", "(") in found
    assert ("quote-ambiguous", "Language") not in found


def test_an_entry_says_what_holds_it() -> None:
    with pytest.raises(ValueError, match=r"enforced entry has rules=\(\)"):
        enforced("SPEC §1b", "a sentence")
    with pytest.raises(ValueError, match="needs its reason"):
        informative("SPEC §1b", "a sentence", " ")
    with pytest.raises(ValueError, match="uncovered entry has rules"):
        Entry("SPEC §1b", "a sentence", ("x/y",), "uncovered", "no case")
    row = enforced("SPEC §1b", "Concurrent `execute`\n    is safe.", "streams_threads/*")
    assert row.enforced_by("streams_threads/threads")
    assert not row.enforced_by("runtime_options/default")
    assert row.cite() == 'SPEC §1b: "Concurrent `execute` is safe."'


def test_lookups() -> None:
    assert any("Concurrent `execute`" in e.quote for e in for_rule("streams_threads/threads"))
    assert "streams_threads/threads" in named_rule_ids()
    assert not any("*" in r for r in named_rule_ids())


# ================================================================================================ the command


def test_the_command_prints_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "On any error, outputs are left untouched." in out
    assert "normative sentences" in out
    assert main(["--status", "uncovered"]) == 0
    out = capsys.readouterr().out
    assert all(e.reason in out for e in UNCOVERED)
    assert "enforced " not in out
    assert main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["entries"]) == len(CATALOGUE)
    assert data["findings"] == []


def test_the_catalogue_needs_no_torch() -> None:
    code = "import sys, conformance.catalogue.__main__ as m; m.main([]); assert 'torch' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
