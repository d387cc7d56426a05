"""How reliably the thread cases catch a backend that races: run them again and again against each racing
broken backend and count the runs that fail (the suite must catch them in every run, not by luck).

    python -m tests.race_detection [--runs 20] [--out FILE]

The backends: ``tests/broken/generated.py``'s scratch buffer shared across threads and output
arena shared across handles (both in the streams & threads chapter), and the per-handle output arena and
shared scratch as the differential chapter sees them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from harness.results import FAILING_OUTCOMES
from tests.rule_coverage import broken_backends

ROOT = Path(__file__).resolve().parent.parent
RACERS = (
    "SHARES_SCRATCH_ACROSS_THREADS_STREAMS",
    "SHARES_OUTPUT_ARENA_ACROSS_HANDLES",
    "NOT_REENTRANT",
    "SHARES_SCRATCH_ACROSS_THREADS",
    "RETURNS_ITS_OUTPUT_ARENA",
)


def one_run(spec: str, chapter: str, select: tuple[str, ...]) -> bool:
    """Whether one run of the chapter's selection fails the backend (a child of the self-tests' warm fork
    server: a fresh process and pytest session each time)."""
    from tests.conformance.test_suite_catches_broken_backends import run_chapter

    with tempfile.TemporaryDirectory() as tmp:
        _, run, _ = run_chapter(Path(tmp), spec, *select, chapter=chapter)
    return any(c.outcome in FAILING_OUTCOMES for c in run.cases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for broken in broken_backends(ROOT):
        if broken.spec.split(":")[1] not in RACERS:
            continue
        caught = sum(
            one_run(broken.spec, broken.breaks.chapter, broken.breaks.select) for _ in range(args.runs)
        )
        rows.append(
            {"backend": broken.spec, "chapter": broken.breaks.chapter, "caught": caught, "runs": args.runs}
        )
        print(f"{broken.spec:70} caught in {caught} of {args.runs} runs", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["caught"] == r["runs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
