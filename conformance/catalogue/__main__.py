"""``python -m conformance.catalogue``: every normative sentence of the protocol and the SPEC, its source, the
rule ids that enforce it or why none does (informative, uncovered), and the counts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from conformance.catalogue import CATALOGUE
from conformance.catalogue.audit import audit, quoted, render, summary
from conformance.catalogue.text import sentences


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.catalogue",
        description="The contract as rules: each normative sentence of conformance/protocol.py and "
        "docs/SPEC.md with the rule ids that enforce it (enforced), why it binds no backend (informative), "
        "or what no rule checks yet (uncovered).",
    )
    parser.add_argument(
        "--status",
        choices=("enforced", "informative", "uncovered", "unquoted"),
        help="list only the clauses with this status",
    )
    parser.add_argument("--json", action="store_true", help="print the entries and counts as JSON")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the catalogue and the text disagree (lists why)"
    )
    args = parser.parse_args(argv)
    text = sentences()
    items = quoted(CATALOGUE, text)
    findings = audit(CATALOGUE, text)
    counts = summary(items, CATALOGUE)
    if args.json:
        entries = [asdict(e) for e in CATALOGUE if args.status in (None, e.status)]
        print(
            json.dumps(
                {"entries": entries, "counts": counts, "findings": [str(f) for f in findings]}, indent=2
            )
        )
    else:
        print(render(items, status=args.status))
        print("; ".join(f"{n} {what}" for what, n in counts.items()))
        for finding in findings:
            print(finding)
    return 1 if args.check and findings else 0


if __name__ == "__main__":
    sys.exit(main())
