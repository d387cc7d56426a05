"""Tables from a py-spy profile of a run (``profile_warm.sh``: raw collapsed stacks of every process, idle
frames included): where the case workers' main threads spent their time.

    python3 .ci/gpu/pyspy_table.py pyspy.txt.gz [--rate 50] [--top 40]

Seconds are samples / rate, summed over processes: case-seconds, as the run's chapter table counts them.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from collections.abc import Iterator
from pathlib import Path

_PROCESS = re.compile(r'process (\d+):"(.*?)";')
#: An xdist worker's command line (execnet's bootstrap).
WORKER = "-c import sys;exec(eval(sys.stdin.readline()))"
#: Frames that say nothing about where a case's time goes.
#: (A forked worker runs execnet from a string: its frames read ``(<string>:N)``.)
PLUMBING = (
    "pluggy/", "_pytest/", "contextlib.py", "threading.py", "execnet/", "xdist/", "<module> (", "(<string>:",
)  # fmt: skip


def stacks(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """(the innermost process's command line, its frames root first, samples) per line."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as lines:
        for line in lines:
            body, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            command, at = "", 0
            while match := _PROCESS.match(body, at):
                command, at = match.group(2), match.end()
            yield command, body[at:].split(";") if at < len(body) else [], int(count)


def worker_frames(command: str, frames: list[str]) -> list[str] | None:
    """A case worker's frames from execnet's bootstrap on, or None for another process: a worker started
    by xdist, or one forked by the fork server (``harness/forkserver.py``: the server's command line, its
    frames below ``become``, where the child runs the bootstrap)."""
    if command.endswith(WORKER):
        return frames
    if "harness.forkserver" in command:
        for at, frame in enumerate(frames):
            if frame.startswith("become (harness/forkserver.py"):
                return frames[at + 1 :]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--rate", type=float, default=50.0, help="py-spy's samples per second")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    by_test: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    outside: collections.Counter[str] = collections.Counter()
    for command, frames, count in stacks(args.profile):
        frames = worker_frames(command, frames)
        # A worker's main thread: its stacks start at the module execnet runs (threads start at _bootstrap).
        if frames is None or not frames or not frames[0].startswith("<module>"):
            continue
        if not any("runtestprotocol" in f for f in frames):
            names = [f.split(" (")[0] for f in frames]
            outside[
                next(
                    (n for n in names if n.startswith(("Event.wait", "wait_for_gate", "gc_collect"))),
                    "other (start-up, collection, session end)",
                )
            ] += count
            continue
        test = next(
            (f.split(" (")[0] for f in frames if re.match(r"test_\w+ \(conformance/", f)), "(fixtures)"
        )
        by_test[test] += count
        for frame in dict.fromkeys(frames):  # each frame once per stack: inclusive time
            if not any(p in frame for p in PLUMBING):
                within[frame] += count
        leaves[frames[-1]] += count

    def table(title: str, counter: collections.Counter[str]) -> None:
        print(f"\n{title}")
        for name, count in counter.most_common(args.top):
            print(f"{count / args.rate:8.1f} s  {name[:150]}")

    total = sum(by_test.values()) / args.rate
    print(f"case workers' main threads: {total:.1f} case-seconds in cases")
    table("outside cases (worker main threads)", outside)
    table("by test function", by_test)
    table("inclusive, frames within cases", within)
    table("innermost frames within cases", leaves)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
