"""The order a run hands its cases to pytest-xdist's work-stealing scheduler: the long ones first.

``--dist worksteal`` first cuts the collection into one contiguous slice per worker; a worker that runs
dry steals the second half of the longest queue left. A case of 10-15 s that collection order puts near
the end of a slice starts late, and the phase ends on it while the other workers idle: one H100's warm
shared phase ran its cases in 39.4 s where the same case-seconds spread evenly take 28.5 s (issue 31).

``long_first`` reorders the collection so that each slice starts with its share of the long cases, dealt
longest first to the slice with the least expected work (the LPT rule), and fills the rest of each slice
in collection order: neighbouring cases keep sharing a worker, and what a steal takes from a slice's end
is short. The expected seconds come from a file of measured durations (``case_seconds.json``; refresh
it from a run's result files with ``python -m harness.case_order``); a case it does not name counts as
short. The order changes when a case runs, never what it checks: a stale or missing file costs time only.

Every xdist worker collects and reorders alike (the scheduler insists on one collection), so the order
depends only on the collection, the file and the worker count. A run without xdist keeps pytest's order.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.case_ids import current_case_id
from harness.outcomes import Outcome

#: Cases expected to take at least this long (seconds) are dealt to the slices' starts; the rest keep
#: collection order. Below it, a case ending late costs less than what reordering it would scatter.
LONG_S = 0.5
#: The format ``write_seconds`` writes (only cases of at least ``LONG_S``: the others would not move).
SCHEMA = "aoti-conformance/case-seconds/v1"


def slice_sizes(count: int, workers: int) -> list[int]:
    """How many cases each worker's first slice holds: worksteal gives each idle worker, in turn,
    ``len(pending) // workers_left`` (``WorkStealingScheduling.check_schedule``)."""
    sizes, left = [], count
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def long_first(ids: Sequence[str], seconds: Mapping[str, float], workers: int) -> list[int]:
    """A permutation of ``range(len(ids))``: the order to hand ``ids`` to ``workers`` work-stealing
    workers so that each slice starts with its share of the cases ``seconds`` calls long."""
    if workers < 2 or not ids:
        return list(range(len(ids)))
    sizes = slice_sizes(len(ids), workers)
    long = sorted(
        (i for i, case in enumerate(ids) if seconds.get(case, 0.0) >= LONG_S),
        key=lambda i: (-seconds[ids[i]], i),
    )
    slices: list[list[int]] = [[] for _ in sizes]
    load = [0.0] * workers
    for i in long:
        room = [s for s in range(workers) if len(slices[s]) < sizes[s]]
        s = min(room, key=lambda s: (load[s], s))
        slices[s].append(i)
        load[s] += seconds[ids[i]]
    chosen = set(long)
    rest = iter(i for i in range(len(ids)) if i not in chosen)
    for s, size in enumerate(sizes):
        slices[s].extend(next(rest) for _ in range(size - len(slices[s])))
    return [i for part in slices for i in part]


def load_recorded(path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """What ``path`` records (``write_seconds``'s format): the expected seconds per case id, and per phase
    by shard suffix (``""``: the shared phase, ``-exclusive``: the GPU-alone one; none in a file written
    before it recorded phases)."""
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    seconds = {str(k): float(v) for k, v in data["seconds"].items()}
    # A file written before the chapters were folders names their cases by the old ids: read them as today's.
    seconds = {**{current_case_id(k): v for k, v in seconds.items()}, **seconds}
    return seconds, {str(k): float(v) for k, v in (data.get("phases") or {}).items()}


def load_seconds(path: Path) -> dict[str, float]:
    """The expected seconds per case id that ``path`` holds."""
    return load_recorded(path)[0]


def measured_seconds(result_files: Sequence[Path]) -> dict[str, float]:
    """Each case's duration in these result files (``harness.results``), the median where several
    name it: a case is long in one run only where it paid its worker's first setup there. Cases that
    did not run to an outcome of their own (not-run, crashed, timeout) are left out."""
    ran = {
        o.value
        for o in (Outcome.PASSED, Outcome.FAILED, Outcome.SKIPPED, Outcome.XFAILED, Outcome.SHOULD_FAILED)
    }
    seen: dict[str, list[float]] = {}
    for case in _cases(result_files):
        if case.get("outcome") in ran:
            seen.setdefault(case["id"], []).append(float(case["duration_s"]))
    return {case: statistics.median(durations) for case, durations in seen.items()}


def measured_phases(result_files: Sequence[Path]) -> dict[str, float]:
    """Each phase's seconds in these result files, by shard suffix (``conformance-exclusive.json``:
    ``-exclusive``): its busiest worker's summed case durations, the median where several files name it."""
    seen: dict[str, list[float]] = {}
    for path in result_files:
        per_worker: dict[str, float] = {}
        for case in json.loads(path.read_text())["cases"]:
            worker = str(case.get("worker") or "")
            per_worker[worker] = per_worker.get(worker, 0.0) + float(case.get("duration_s") or 0.0)
        suffix = path.name.removesuffix(".json").partition("-")[1:]
        seen.setdefault("".join(suffix), []).append(max(per_worker.values(), default=0.0))
    return {suffix: statistics.median(values) for suffix, values in seen.items()}


def named_cases(result_files: Sequence[Path]) -> set[str]:
    """Every case these result files name, whatever its outcome: the suite's cases as one run saw them."""
    return {case["id"] for case in _cases(result_files)}


def _cases(result_files: Sequence[Path]) -> Iterator[dict[str, Any]]:
    for path in result_files:
        yield from json.loads(path.read_text())["cases"]


def write_seconds(
    seconds: Mapping[str, float], path: Path, source: str, phases: Mapping[str, float] | None = None
) -> int:
    """Write the cases of ``seconds`` at least ``LONG_S`` long to ``path``, and ``phases``' seconds by
    shard suffix; returns how many cases."""
    kept = {k: round(v, 1) for k, v in sorted(seconds.items()) if v >= LONG_S}
    body: dict[str, Any] = {"schema": SCHEMA, "source": source, "seconds": kept}
    if phases:
        body["phases"] = {k: round(v, 1) for k, v in sorted(phases.items())}
    path.write_text(json.dumps(body, indent=1) + "\n")
    return len(kept)


# ---------------------------------------------------------------------------------------------- pytest


def add_options(parser: pytest.Parser) -> None:
    parser.getgroup("results").addoption(
        "--case-seconds",
        metavar="PATH",
        default=None,
        help="expected seconds per case (harness/case_order.py): under --dist worksteal the long cases "
        "start first, one share per worker",
    )


#: What the controller tells each worker (``workerinput``): the run is ``--dist worksteal``. A worker
#: cannot see it itself: pytest-xdist sets a worker's ``dist`` option to ``no``.
_WORKSTEAL = "case_order_worksteal"


def check_option(config: pytest.Config) -> None:
    """In the controller (or the single process), before any worker starts: ``--case-seconds`` names a
    readable file of case seconds, else a usage error that names the option (a worker's would be an
    internal error of xdist's)."""
    path = config.getoption("--case-seconds")
    if not path or hasattr(config, "workerinput"):
        return
    try:
        load_seconds(Path(path))
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise pytest.UsageError(f"--case-seconds {path}: not a file of case seconds ({exc})") from exc


def configure_node(node: Any) -> None:
    """In the controller, for each xdist worker it starts (``pytest_configure_node``)."""
    node.workerinput[_WORKSTEAL] = node.config.getoption("dist", None) == "worksteal"


def reorder(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place for this run's workers, where ``--case-seconds`` names a file and the
    run is an xdist worker of ``--dist worksteal``."""
    path = config.getoption("--case-seconds")
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if not path or workerinput is None or not workerinput.get(_WORKSTEAL):
        return
    order = long_first(
        [item.nodeid for item in items], load_seconds(Path(path)), int(workerinput["workercount"])
    )
    items[:] = [items[i] for i in order]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.case_order",
        description="Refresh the expected seconds per case from the result files of a warm run (one that "
        "compiled nothing: a cold run's durations are its waits for compiles).",
    )
    parser.add_argument("results", nargs="+", type=Path, help="result files (results/conformance*.json)")
    parser.add_argument("-o", "--output", type=Path, default=Path("conformance/suite/case_seconds.json"))
    parser.add_argument("--source", default="", help="where the durations were measured (device, commit)")
    parser.add_argument(
        "--current",
        nargs="+",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="keep only the cases these result files (a run of the current suite) name: a case renamed or "
        "split since the older runs is dropped (default: every case the results name)",
    )
    args = parser.parse_args(argv)
    seconds = measured_seconds(args.results)
    if args.current:
        current = named_cases(args.current)
        seconds = {case: s for case, s in seconds.items() if case in current}
    kept = write_seconds(seconds, args.output, args.source, measured_phases(args.results))
    print(f"wrote {args.output}: {kept} cases of at least {LONG_S:g} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
