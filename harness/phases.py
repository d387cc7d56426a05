"""Where a conformance run's time went: the per-phase table that ``nox -s conformance`` prints and stores.

    python -m harness.phases RESULT.json [RESULT.json ...] --phase NAME[@START]=SECONDS[=DETAIL] ...

A run is several pytest invocations (shards: the parallel phase, the cases that need their GPU alone, the
two-GPU cases) plus steps around them (pre-lowering, which overlaps the parallel phase, and the report).
The front door times each step (START: seconds after the run began; SECONDS: its wall time); this
stores the phases in the ``metadata["phases"]`` of every shard file, so a dashboard that merges the shards
keeps them (``merge_runs`` keeps the metadata the shards agree on), and prints the table: each phase's wall
time, and per chapter the case-seconds its cases took. Case-seconds, not wall time, because in a parallel
phase chapters overlap: the sum over workers is what a chapter costs.

Only the standard library and ``harness.results``: nox runs this with whatever interpreter the run used.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.results import ResultFileError, load_results, write_results

__all__ = [
    "Phase",
    "Timeline",
    "case_window_words",
    "chapter_seconds",
    "format_table",
    "parse_phase",
    "phases_from_metadata",
    "run_wall",
    "store_phases",
]

METADATA_KEY = "phases"
#: A shard's ``metadata[TIMELINE_KEY]``: epoch seconds of its pytest session's start, first case's start,
#: first and last xdist worker's collection, last case's end, last xdist worker's end and final write
#: (``harness/pytest_plugin.py``).
TIMELINE_KEY = "timeline"


@dataclass(frozen=True)
class Phase:
    """One step of a run: its name, wall-clock seconds, what it did (``8 workers on 1 GPU``) and when it
    started (seconds after the run began; steps may overlap)."""

    name: str
    wall_s: float
    detail: str = ""
    start_s: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "start_s": round(self.start_s, 2),
            "wall_s": round(self.wall_s, 2),
            "detail": self.detail,
        }

    def to_flag(self) -> str:
        """The command-line form ``parse_phase`` reads (seconds to two decimals)."""
        return f"{self.name}@{self.start_s:.2f}={self.wall_s:.2f}={self.detail}"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return -1.0
    return value if value >= 0 else -1.0


def parse_phase(text: str) -> Phase:
    """``NAME[@START]=SECONDS[=DETAIL]`` (the command-line form)."""
    head, sep, rest = text.partition("=")
    name, at, start_text = head.partition("@")
    seconds, _, detail = rest.partition("=")
    wall, start = _seconds(seconds), _seconds(start_text) if at else 0.0
    if not sep or not name or wall < 0 or start < 0:
        raise argparse.ArgumentTypeError(
            f"--phase {text!r}: want NAME[@START]=SECONDS[=DETAIL] with START and SECONDS ≥ 0"
        )
    return Phase(name, wall, detail, start)


def _is_number(value: object) -> bool:
    """A JSON number (``bool`` is an ``int`` to Python, not to a result file)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def phases_from_metadata(metadata: dict[str, object]) -> list[Phase]:
    """The phases a result file stores (none for a file from a plain pytest run)."""
    raw = metadata.get(METADATA_KEY)
    if not isinstance(raw, list):
        return []
    phases = []
    for entry in raw:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            wall, start = entry.get("wall_s"), entry.get("start_s", 0.0)
            if all(_is_number(v) for v in (wall, start)):
                phases.append(Phase(entry["name"], float(wall), str(entry.get("detail", "")), float(start)))
    return phases


@dataclass
class Timeline:
    """When a pytest session's cases ran (epoch seconds), noted by its recorder as reports come: stored in
    its result file (``TIMELINE_KEY``) as the session ends, with the time of that final write."""

    session_start: float
    #: When the first and the last xdist worker's collection reached the controller (None: no xdist).
    first_collected: float | None = None
    last_collected: float | None = None
    first_case: float | None = None
    last_case_end: float | None = None
    #: When the last xdist worker said it was done (None: no xdist, or none yet).
    workers_done: float | None = None

    def case_ran(self, start: object, stop: object) -> None:
        """A report's ``start`` and ``stop`` (floats; anything else is ignored)."""
        if isinstance(start, float) and (self.first_case is None or start < self.first_case):
            self.first_case = start
        if isinstance(stop, float) and (self.last_case_end is None or stop > self.last_case_end):
            self.last_case_end = stop

    def collected(self, at: float) -> None:
        """An xdist worker's collection reached the controller at ``at``."""
        self.first_collected = at if self.first_collected is None else min(self.first_collected, at)
        self.last_collected = at if self.last_collected is None else max(self.last_collected, at)

    def to_json(self, final_write: float) -> dict[str, float | None]:
        stamps = {**dataclasses.asdict(self), "final_write": final_write}
        return {name: None if value is None else round(value, 3) for name, value in stamps.items()}


def case_window_words(path: Path, start: float, end: float) -> str | None:
    """Where a pytest phase's wall went, from its shard's timeline: its cases ran from ``A`` s after the
    phase began (``start``, epoch seconds: the process's start-up, or its gate's latency) to ``B`` s before
    it ended (``end``: the workers' exit, the final files); None where the shard has no case times."""
    try:
        run = load_results(path)
    except (OSError, ResultFileError):
        return None
    line = run.metadata.get(TIMELINE_KEY)
    if not isinstance(line, dict):
        return None
    first, last = line.get("first_case"), line.get("last_case_end")
    if not all(_is_number(v) for v in (first, last)):
        return None
    words = f"cases from +{max(0.0, first - start):.1f} s to -{max(0.0, end - last):.1f} s"
    done = line.get("workers_done")
    if _is_number(done) and done >= last:
        words += f" (workers done -{max(0.0, end - done):.1f} s)"
    return words


def chapter_seconds(paths: Sequence[Path]) -> dict[str, float]:
    """Case-seconds per chapter over every shard that can be read."""
    totals: dict[str, float] = {}
    for path in paths:
        try:
            run = load_results(path)
        except (OSError, ResultFileError):
            continue
        for case in run.cases:
            totals[case.chapter] = totals.get(case.chapter, 0.0) + case.duration_s
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def store_phases(paths: Sequence[Path], phases: Sequence[Phase]) -> list[Path]:
    """Write the phases into every finished shard file; returns the files written (a crashed shard has only
    its journal: it is left as it is and still renders)."""
    written = []
    for path in paths:
        if not path.exists():
            continue
        run = load_results(path)
        run.metadata[METADATA_KEY] = [p.to_json() for p in phases]
        write_results(path, run)
        written.append(path)
    return written


def run_wall(phases: Sequence[Phase]) -> float:
    """The run's end-to-end time: the last phase's end (phases may overlap, so not their sum)."""
    return max((p.start_s + p.wall_s for p in phases), default=0.0)


def format_table(phases: Sequence[Phase], chapters: dict[str, float]) -> str:
    """The terminal table: each phase's start, wall time and share of the run, then chapters' case-seconds."""
    total = run_wall(phases)
    width = max([len(p.name) for p in phases] + [len(c) + 2 for c in chapters] + [len("total")])
    lines = [f"{'phase':<{width}}  {'start':>7}  {'wall':>8}  {'share':>5}  detail"]
    for p in phases:
        share = f"{p.wall_s / total:.0%}" if total > 0 else "-"
        lines.append(f"{p.name:<{width}}  {p.start_s:>6.1f}s  {p.wall_s:>7.1f}s  {share:>5}  {p.detail}")
    lines.append(f"{'total (end to end)':<{width}}  {'':>7}  {total:>7.1f}s")
    if chapters:
        lines.append(f"{'chapter':<{width}}  {'case-s':>8}  (summed over workers)")
        lines.extend(f"  {name:<{width - 2}}  {seconds:>7.1f}s" for name, seconds in chapters.items())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="+", type=Path, help="the run's shard result files")
    parser.add_argument(
        "--phase", action="append", type=parse_phase, default=[], help="NAME=SECONDS[=DETAIL]"
    )
    parser.add_argument("--no-store", action="store_true", help="print the table only")
    parser.add_argument("--no-print", action="store_true", help="store the phases only")
    args = parser.parse_args(argv)
    if not args.no_store:
        store_phases(args.results, args.phase)
    if not args.no_print:
        print(format_table(args.phase, chapter_seconds(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
