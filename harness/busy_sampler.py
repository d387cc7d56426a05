"""How many threads were ready to run while a run went on: the evidence that no phase had more busy
processes than cores (issue 31), from the run's own timeline rather than from its sizing's intent.

Once a second a thread counts the tasks (threads of every process this machine shows) whose state in
``/proc/<pid>/task/<tid>/stat`` is ``R`` (running or waiting for a core), less itself. More runnable
tasks than cores means work waited for a core. In a container ``/proc`` shows the container's processes
only, on a VM the whole machine's: either way what competes with the run for its cores. A phase's row then
says the median, the 95th percentile and the maximum of its samples (``BusySampler.summary``).

Standard library only: the front door runs it in nox's interpreter. Where ``/proc`` is missing (not
Linux) it samples nothing, and the table says nothing of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.ticker import Ticker

#: Seconds between samples: a phase of the suite lasts tens of seconds, and one sample reads every
#: task's stat file (a few thousand small reads on a busy 32-core runner, milliseconds).
INTERVAL_S = 1.0
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessState:
    """One process as ``/proc`` shows it now."""

    pid: int
    #: Its process group (a job started with ``start_new_session``: every descendant shares it).
    group: int
    #: Its threads in state ``R``.
    runnable: int


def _state_and_group(stat: bytes) -> tuple[bytes, int]:
    # "pid (comm) S ppid pgrp ...": comm may hold spaces and parentheses, the fields follow the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0], int(fields[2])


def processes(proc: Path = PROC) -> list[ProcessState] | None:
    """Every process ``proc`` shows, with its group and runnable threads; None where it cannot be read."""
    try:
        pids = [entry.name for entry in os.scandir(proc) if entry.name.isdigit()]
    except OSError:
        return None
    found = []
    for pid in pids:
        try:
            group = _state_and_group(Path(proc, pid, "stat").read_bytes())[1]
            tasks = [entry.path for entry in os.scandir(proc / pid / "task")]
        except (OSError, IndexError, ValueError):  # the process ended between the reads
            continue
        running = 0
        for task in tasks:
            try:
                running += _state_and_group(Path(task, "stat").read_bytes())[0] == b"R"
            except (OSError, IndexError, ValueError):
                continue
        found.append(ProcessState(int(pid), group, running))
    return found


def runnable_in(table: list[ProcessState]) -> int:
    """Tasks in state ``R`` in ``table``, less the calling thread (it was running while it looked)."""
    return max(0, sum(p.runnable for p in table) - 1)


def runnable_tasks(proc: Path = PROC) -> int | None:
    """Tasks in state ``R`` now, less the calling thread; None where ``proc`` cannot be read."""
    table = processes(proc)
    return None if table is None else runnable_in(table)


@dataclass(frozen=True)
class BusySummary:
    """Runnable tasks over one window of the run."""

    samples: int
    median: int
    p95: int
    maximum: int
    cores: int

    @property
    def detail(self) -> str:
        """The phase table's words for it."""
        return (
            f"runnable p50 {self.median}, p95 {self.p95}, max {self.maximum} of {self.cores} cores "
            f"({self.samples} samples)"
        )


class BusySampler:
    """Samples ``runnable_tasks`` every ``interval_s`` in a daemon thread, from ``start`` to ``stop``."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        count: Callable[[], int | None] = runnable_tasks,
        clock: Callable[[], float] = time.perf_counter,
        cores: int | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.count = count
        self.clock = clock
        self.cores = cores or os.cpu_count() or 1
        #: (clock time, runnable tasks), in order.
        self.samples: list[tuple[float, int]] = []
        self._ticker = Ticker("busy-sampler", interval_s, self._sample)

    def start(self) -> BusySampler:
        self._ticker.start()
        return self

    def stop(self) -> None:
        self._ticker.stop()

    def _sample(self) -> bool:
        value = self.count()
        if value is None:
            return False  # no /proc: nothing to sample
        self.samples.append((self.clock(), value))
        return True

    def summary(self, start: float, end: float) -> BusySummary | None:
        """Over the samples taken from ``start`` to ``end`` (clock times); None with none."""
        values = sorted(v for t, v in list(self.samples) if start <= t <= end)
        if not values:
            return None

        def rank(q: float) -> int:
            return values[min(len(values) - 1, round(q * (len(values) - 1)))]

        return BusySummary(len(values), rank(0.5), rank(0.95), values[-1], self.cores)
