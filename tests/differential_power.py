"""How many broken backends the differential chapter catches on its own (issue: the bugs nobody named).

    python -m tests.differential_power [--jobs N] [--out FILE] [-k SUBSTRING ...] [--seed N]

Runs ``conformance/differential/test_differential.py`` — and no other chapter — against every broken backend
in ``tests/broken/*.py`` that breaks a *must* rule and needs no GPU (``breaks``), and every planted slip of
``tests/broken/generated.py`` (``finds``), one pytest process each, and prints which the chapter
fails (with the first rule it names) and which it misses. The reference must pass the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conformance.common.rules import Level, level_of
from harness.results import FAILING_OUTCOMES
from tests.rule_coverage import broken_backends

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = "conformance/differential/test_differential.py"


def run_one(spec: str, selection: list[str]) -> dict[str, object]:
    """The chapter against ``spec`` in a child of the self-tests' warm fork server (as the self-tests run
    it: unshrunk, no preflight); the first failed case's rule."""
    from tests.conformance.test_suite_catches_broken_backends import run_chapter

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        code, run, _ = run_chapter(Path(tmp), spec, *selection, chapter=CHAPTER)
        wall = time.perf_counter() - start
    failed = [c for c in run.cases if c.outcome in FAILING_OUTCOMES]
    return {
        "backend": spec,
        "caught": bool(failed),
        "rule": failed[0].rule if failed else None,
        "message": (failed[0].message[:2000] if failed else ""),
        "exit": code,
        "wall_s": round(wall, 1),
    }


def planted_specs() -> list[str]:
    """``--backend`` specs of the slips declared with ``finds`` (measured, not self-tested)."""
    from tests.broken import generated as module

    return [
        f"{module.__name__}:{name}"
        for name, value in vars(module).items()
        if getattr(getattr(value, "finds", None), "chapter", None) == CHAPTER
    ]


def _chosen(spec: str, only: list[str]) -> bool:
    return not only or any(part in spec for part in only)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "-k", dest="only", action="append", default=[], help="only backends whose spec has this (repeatable)"
    )
    parser.add_argument(
        "--select", default="not cuda", help="pytest -k for the chapter (default: every case a CPU runs)"
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="--hypothesis-seed for the chapter: other examples than CI's"
    )
    args = parser.parse_args(argv)
    targets = [
        b.spec for b in broken_backends(ROOT)
        if not b.breaks.cuda and not b.breaks.strict_should and _chosen(b.spec, args.only)
        and all(level_of(r) is Level.MUST for r in b.breaks.rules)
    ]  # fmt: skip
    targets += [spec for spec in planted_specs() if _chosen(spec, args.only)]
    selection = ["-k", args.select, *([f"--hypothesis-seed={args.seed}"] if args.seed is not None else [])]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda spec: run_one(spec, selection), targets))
        reference = run_one("reference_impl:BACKEND", selection)
    caught = sum(1 for r in rows if r["caught"])
    for r in rows:
        mark = "CAUGHT" if r["caught"] else "missed"
        print(f"{mark:7} {r['backend']:70} {r['rule'] or ''}  ({r['wall_s']} s)")
    print(f"reference: {'FAILED ' + str(reference['rule']) if reference['caught'] else 'passed'}")
    print(f"caught {caught} of {len(rows)} ({caught / max(1, len(rows)):.0%}) CPU must-rule broken backends")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "reference": reference, "caught": caught,
                                        "total": len(rows)}, indent=1))  # fmt: skip
    return 0 if not reference["caught"] else 1


if __name__ == "__main__":
    sys.exit(main())
