"""Runs are kept, not overwritten: ``results/`` holds the latest run of each session,
``results/runs/<run id>/`` the earlier ones, the newest :data:`DEFAULT_KEEP` of them
(``$CONFORMANCE_KEEP_RUNS``).

A session (``nox -s conformance``, ``nox -s bench``, a matrix cell) calls :func:`archive` once its arguments
are known to be good and before it writes anything: the previous run's files of that session move, as they
are, into a directory named by that run's id; the oldest directories beyond the bound are removed. Nothing
is deleted before the new run can start, so a typo'd backend or option costs nothing.

``python -m harness.run_history archive --results results --name conformance [--name ...]`` does that from
the front door; ``python -m harness.run_history list`` shows what is kept (``python -m reports.compare``
compares any two).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import settings
from harness.results import JOURNAL_SUFFIX, ResultFileError, load_results

RUNS_DIR = "runs"
#: A run's busy trace (``runner/busy_sampler.py`` writes it): ``results/<run>.busy.tsv``.
BUSY_TRACE_SUFFIX = ".busy.tsv"
KEEP_ENV = settings.KEEP_RUNS.name
DEFAULT_KEEP = settings.KEEP_RUNS.default()
#: The files one session's run leaves in ``results/`` per shard name.
SUFFIXES = (".json", ".json" + JOURNAL_SUFFIX, ".junit.xml", ".html", ".prelower.log", BUSY_TRACE_SUFFIX)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class StoredRun:
    """A kept run: its id, when it started, its directory and its result files."""

    run_id: str
    started_at: str
    directory: Path
    files: tuple[Path, ...]


def keep_count() -> int:
    """How many earlier runs to keep: ``$CONFORMANCE_KEEP_RUNS`` (0 keeps none), default 10."""
    return settings.KEEP_RUNS.get()


def session_files(results: Path, names: Sequence[str]) -> list[Path]:
    """The files the runs named ``names`` (a session's shards) left in ``results``."""
    return [
        results / f"{name}{suffix}"
        for name in names
        for suffix in SUFFIXES
        if (results / f"{name}{suffix}").is_file()
    ]


def _run_identity(files: Sequence[Path]) -> tuple[str, str]:
    """(run id, start time) of the first readable result file or journal among ``files``."""
    for path in files:
        if path.name.endswith(".json") or path.name.endswith(JOURNAL_SUFFIX):
            target = path.with_name(path.name.removesuffix(JOURNAL_SUFFIX))
            try:
                run = load_results(target)
            except (ResultFileError, OSError):
                continue
            return run.run_id, run.started_at
    # Unreadable files are kept too (they may be what someone needs to look at): named by their time.
    stamp = max(p.stat().st_mtime for p in files)
    return f"unreadable-{int(stamp)}", ""


def archive(results: Path, names: Sequence[str], keep: int | None = None) -> Path | None:
    """Move the previous run's files of the session ``names`` into ``results/runs/<its run id>/``, then
    drop the oldest kept runs beyond ``keep``; the directory it went to (None: there was nothing)."""
    files = session_files(results, names)
    if not files:
        return None
    run_id, _ = _run_identity(files)
    base = _UNSAFE.sub("_", run_id)
    target, n = results / RUNS_DIR / base, 1
    while any((target / path.name).exists() for path in files):  # never overwrite a kept file
        n += 1
        target = results / RUNS_DIR / f"{base}-{n}"
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        os.replace(path, target / path.name)
    prune(results, keep_count() if keep is None else keep)
    return target if target.exists() else None


def stored_runs(results: Path) -> list[StoredRun]:
    """Every kept run under ``results/runs/``, newest first (by start time, then id)."""
    runs = []
    for directory in sorted((results / RUNS_DIR).glob("*")) if (results / RUNS_DIR).is_dir() else []:
        files = tuple(sorted(p for p in directory.iterdir() if p.is_file()))
        if not files:
            continue
        run_id, started = _run_identity(files)
        runs.append(StoredRun(run_id, started, directory, files))
    return sorted(runs, key=lambda r: (r.started_at, r.run_id), reverse=True)


def prune(results: Path, keep: int) -> list[Path]:
    """Remove the oldest kept runs beyond ``keep``; the directories removed."""
    removed = []
    for run in stored_runs(results)[keep:]:
        shutil.rmtree(run.directory, ignore_errors=True)
        removed.append(run.directory)
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.run_history", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    keep = sub.add_parser("archive", help="move the previous run of a session into results/runs/<run id>/")
    keep.add_argument("--results", default="results")
    keep.add_argument("--name", action="append", required=True, help="a shard name of the session")
    listing = sub.add_parser("list", help="the kept runs, newest first")
    listing.add_argument("--results", default="results")
    listing.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = Path(args.results)
    try:
        bound = keep_count()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "archive":
        moved = archive(results, args.name, bound)
        if moved is not None:
            kept = len(stored_runs(results))
            print(f"previous run kept in {moved}/ ({kept} kept, at most {bound}: ${KEEP_ENV})")
        return 0
    runs = stored_runs(results)
    if args.json:
        rows = [{"run_id": r.run_id, "started_at": r.started_at, "directory": str(r.directory)} for r in runs]
        print(json.dumps(rows, indent=1))
    else:
        for r in runs:
            print(f"{r.started_at or '?':<26} {r.run_id:<48} {r.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
