"""The contract's text, sentence by sentence: the plug-in protocol (``conformance/protocol.py``'s module
docstring) and the SPEC (``docs/SPEC.md``, a vendored copy of ``../shared/SPEC.md``), split into sentences,
and which of them are *normative* (say what must, never, or only happen, what raises, what comes before
or after what, ...).

The catalogue (``conformance/catalogue/entries.py``) quotes every normative sentence and names the rule
ids that enforce it; ``conformance/catalogue/audit.py`` uses this module to find a sentence no entry
quotes. Pure text: no torch, nothing imported, so ``python -m conformance.catalogue`` is instant.

A *source* is ``protocol.py: <section>`` (``intro``, ``Errors``, ``Part mm_out``, ...) or ``SPEC §<n>``
(``§0``, ``§1a``, ..., ``preamble`` before §0). Sentences are whitespace-normalised: a wrapped line of the
docstring and a Markdown bullet's continuation lines read as one line; a bullet is a unit of its own.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "conformance" / "protocol.py"
#: The SPEC the tests read: a copy kept in the repository (CI has only the clone, no ``../shared``).
SPEC = ROOT / "docs" / "SPEC.md"
#: Where a developer session finds the current SPEC; the vendored copy must equal it when it exists.
SHARED_SPEC = ROOT.parent / "shared" / "SPEC.md"

#: Words that make a sentence normative: obligations, permissions and bans; what raises, fails or is an
#: error; order in time; exactness and sameness; "whatever happens" (any, every, all) and "nothing else"
#: (only, untouched, without); where data stays or goes (keeps, stays, through).
NORMATIVE = re.compile(
    r"\b(?:must|never|always|only|shall|should|may|cannot|exactly|before|after|once|until|unless|without|"
    r"instead|raise[sd]?|reject(?:s|ed)?|fail(?:s|ed)?|errors?|invalid|untouched|unaffected|unchanged|safe|"
    r"every|all|any|whatever|none|nothing|no|not|same|stays?|keeps?|through)\b",
    re.IGNORECASE,
)
#: A sentence ends at ``.``, ``!`` or ``?`` (closing ``**``, ``)``, quotes kept) before whitespace, unless
#: the word before is an abbreviation (``e.g.``). The next sentence may start in lower case (``float32 is``).
_END = re.compile(r"""[.!?][*)"']*\s+(?=\S)""")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")
_SPEC_SECTION = re.compile(r"^#{2,3}\s+(\d+[a-z]?)\.")
_BULLET = re.compile(r"^(\s*)[-*]\s+")


@dataclass(frozen=True)
class Sentence:
    source: str
    text: str

    @property
    def normative(self) -> bool:
        return is_normative(self.text)


def normalise(text: str) -> str:
    """Whitespace collapsed to single spaces: how sentences and quotes are compared."""
    return " ".join(text.split())


def is_normative(text: str) -> bool:
    return NORMATIVE.search(text) is not None


def split_sentences(unit: str) -> list[str]:
    """The sentences of one paragraph or bullet (already on one line)."""
    text, out, start = normalise(unit), [], 0
    for match in _END.finditer(text):
        head = text[start : match.start() + 1]
        if head.endswith(_ABBREVIATIONS) or not head.strip():
            continue
        out.append(text[start : match.end()].strip())
        start = match.end()
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def _units(lines: list[str]) -> Iterator[str]:
    """Paragraphs and bullets of ``lines`` (one unit per paragraph or bullet, continuation lines joined)."""
    unit: list[str] = []
    indent = 0
    for line in lines:
        bullet = _BULLET.match(line)
        stripped = len(line) - len(line.lstrip())
        if not line.strip() or bullet or (unit and stripped < indent):
            if unit:
                yield " ".join(unit)
            unit = []
        if not line.strip():
            continue
        if bullet:
            indent = len(bullet.group(0))
            unit = [line[bullet.end() :]]
        else:
            if not unit:
                indent = stripped
            if unit and re.search(r"[a-z]-$", unit[-1]):  # a word hyphenated at the wrap: "export-\ntime"
                unit[-1] += line.strip()
            else:
                unit.append(line.strip())
    if unit:
        yield " ".join(unit)


# ========================================================================================== the sources


def spec_sections(text: str) -> Iterator[tuple[str, list[str]]]:
    """(``SPEC §<n>``, its lines) for each section of the SPEC's Markdown; headings are not sentences."""
    name, lines = "SPEC preamble", []
    for line in text.splitlines():
        if line.startswith("#"):
            match = _SPEC_SECTION.match(line)
            if lines:
                yield name, lines
            name, lines = (f"SPEC §{match.group(1)}" if match else name), []
            continue
        lines.append(line)
    if lines:
        yield name, lines


def protocol_sections(docstring: str) -> Iterator[tuple[str, list[str]]]:
    """(``protocol.py: <section>``, its lines) for the docstring's intro and each heading (a paragraph at
    column 0 followed by indented lines: ``Errors (every part)``, ``Part ``mm_out`` (chapter ...)``)."""
    name, body = "protocol.py: intro", []
    paragraphs = re.split(r"\n\s*\n", docstring)
    for paragraph in paragraphs:
        lines = paragraph.splitlines()
        head = [line for line in lines if line and not line[0].isspace()]
        if head and len(head) < len(lines) and lines[: len(head)] == head:
            if body:
                yield name, body
            title = " ".join(head).split(" (")[0].replace("``", "")
            name, body = f"protocol.py: {title}", lines[len(head) :]
        else:
            body += ["", *lines]
    if body:
        yield name, body


def protocol_docstring(path: Path = PROTOCOL) -> str:
    """The protocol module's docstring, read from the file (nothing imported)."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True)
    if not docstring:
        raise ValueError(f"{path}: no module docstring (the documented plug-in protocol)")
    return docstring


def sentences(protocol: Path = PROTOCOL, spec: Path = SPEC) -> list[Sentence]:
    """Every sentence of the protocol's docstring and the SPEC, in order."""
    sections = [
        *protocol_sections(protocol_docstring(protocol)),
        *spec_sections(spec.read_text(encoding="utf-8")),
    ]
    return [
        Sentence(source, sentence)
        for source, lines in sections
        for unit in _units(lines)
        for sentence in split_sentences(unit)
    ]


def normative_sentences(protocol: Path = PROTOCOL, spec: Path = SPEC) -> list[Sentence]:
    return [s for s in sentences(protocol, spec) if s.normative]
