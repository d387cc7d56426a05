"""The catalogue held to the text: which sentence each entry quotes, which normative sentence no entry quotes,
and the table ``python -m conformance.catalogue`` prints.

Findings, each naming the sentence or quote, so a change in the SPEC or the protocol reads as a to-do:

* ``unquoted`` — a normative sentence no entry quotes (new in the text, or reworded);
* ``unquoted-clause`` — a sentence whose entries quote only part of it, and a normative word (must, never,
  before, ...) lies outside every quote: that clause has no owner (a row was dropped, or the text grew);
* ``quote-not-found`` — an entry's quote is no longer in its source (the sentence was reworded or moved);
* ``quote-ambiguous`` — an entry's quote is in several sentences of its source (quote more of it);
* ``quoted-twice`` — two entries quote overlapping text of one sentence (one owner per clause);
* ``unknown-source`` — an entry names a source the text does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conformance.catalogue.entry import Entry, Status
from conformance.catalogue.text import NORMATIVE, Sentence, normalise

FINDING_KINDS = (
    "unquoted", "unquoted-clause", "quote-not-found", "quote-ambiguous", "quoted-twice", "unknown-source",
)  # fmt: skip


@dataclass(frozen=True)
class Finding:
    kind: str
    source: str
    text: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.source}: {self.text!r}"


@dataclass(frozen=True)
class Quoted:
    """A sentence of the text and the entries that quote it (with where each quote starts and ends)."""

    sentence: Sentence
    entries: tuple[tuple[Entry, int, int], ...]

    def words_outside(self) -> list[str]:
        """The normative words of a quoted sentence that no quote covers (empty when none is quoted)."""
        if not self.entries:
            return []
        return [
            m.group(0)
            for m in NORMATIVE.finditer(self.sentence.text)
            if not any(start <= m.start() and m.end() <= end for _, start, end in self.entries)
        ]

    @property
    def status(self) -> Status | None:
        """``uncovered`` when any clause is a gap, else ``enforced`` when any clause is; None: unquoted."""
        statuses = {entry.status for entry, _, _ in self.entries}
        for status in ("uncovered", "enforced", "informative"):
            if status in statuses:
                return status  # type: ignore[return-value]
        return None


def quoted(catalogue: Sequence[Entry], sentences: Sequence[Sentence]) -> list[Quoted]:
    """Every sentence of the text, in order, with the entries whose quote lies in it."""
    spans: dict[int, list[tuple[Entry, int, int]]] = {}
    for entry in catalogue:
        quote = normalise(entry.quote)
        for index, sentence in enumerate(sentences):
            at = sentence.text.find(quote) if sentence.source == entry.source else -1
            if at >= 0:
                spans.setdefault(index, []).append((entry, at, at + len(quote)))
    return [Quoted(s, tuple(sorted(spans.get(i, []), key=lambda e: e[1]))) for i, s in enumerate(sentences)]


def audit(catalogue: Sequence[Entry], sentences: Sequence[Sentence]) -> list[Finding]:
    """Everything that keeps the catalogue from quoting the text exactly once, clause by clause."""
    findings: list[Finding] = []
    sources = {s.source for s in sentences}
    for entry in catalogue:
        quote = normalise(entry.quote)
        hits = [s for s in sentences if s.source == entry.source and quote in s.text]
        if entry.source not in sources:
            findings.append(Finding("unknown-source", entry.source, entry.quote))
        elif not hits:
            findings.append(Finding("quote-not-found", entry.source, entry.quote))
        elif len(hits) > 1 or hits[0].text.count(quote) > 1:
            findings.append(Finding("quote-ambiguous", entry.source, entry.quote))
    for item in quoted(catalogue, sentences):
        if item.sentence.normative and not item.entries:
            findings.append(Finding("unquoted", item.sentence.source, item.sentence.text))
        outside = item.words_outside()
        if outside:
            text = f"{item.sentence.text} [outside every quote: {', '.join(outside)}]"
            findings.append(Finding("unquoted-clause", item.sentence.source, text))
        ends = [end for _, _, end in item.entries]
        starts = [start for _, start, _ in item.entries]
        if any(start < end for start, end in zip(starts[1:], ends, strict=False)):
            findings.append(Finding("quoted-twice", item.sentence.source, item.sentence.text))
    return findings


def summary(items: Sequence[Quoted], catalogue: Sequence[Entry]) -> dict[str, int]:
    """The counts a report gives: normative sentences found, and how they stand."""
    normative = [item for item in items if item.sentence.normative]
    counts = {"normative sentences": len(normative)}
    for status in ("enforced", "informative", "uncovered"):
        counts[f"normative, {status}"] = sum(item.status == status for item in normative)
    counts["normative, unquoted"] = sum(item.status is None for item in normative)
    counts["quoted without a normative keyword"] = sum(
        bool(item.entries) for item in items if not item.sentence.normative
    )
    counts["catalogue entries"] = len(catalogue)
    counts["uncovered entries (the allowance)"] = sum(e.status == "uncovered" for e in catalogue)
    return counts


def render(items: Sequence[Quoted], *, status: str | None = None) -> str:
    """The catalogue in the text's order: each quoted sentence, its source, and per clause the status and
    the rule ids (or the reason); unquoted normative sentences are listed as such."""
    lines: list[str] = []
    for item in items:
        if not item.entries and not item.sentence.normative:
            continue
        chosen = [e for e, _, _ in item.entries if status in (None, e.status)]
        if status is not None and not chosen and not (status == "unquoted" and not item.entries):
            continue
        lines.append(f"{item.sentence.source}  —  {item.sentence.text}")
        if not item.entries:
            lines.append("    UNQUOTED: a normative sentence no catalogue entry quotes")
        for entry in chosen:
            what = ", ".join(entry.rules) if entry.status == "enforced" else entry.reason
            clause = "" if normalise(entry.quote) == item.sentence.text else f" «{normalise(entry.quote)}»"
            lines.append(f"    {entry.status:<11}{clause} -> {what}")
        lines.append("")
    return "\n".join(lines)
