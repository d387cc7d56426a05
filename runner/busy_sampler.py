"""How many processes and threads were ready to run while a run went on: the evidence that no phase had
more busy processes than cores (issue 31), from the run's own timeline rather than from its sizing's intent.

Once a second a thread counts the tasks (threads of every process this machine shows) whose state in
``/proc/<pid>/task/<tid>/stat`` is ``R`` (running or waiting for a core), less itself, and the busy
processes: those with a task in ``R``, its own process only where another of its threads is (the sampler
is running only because it samples). The busy processes are what issue 31 counts against the cores; the
tasks are stricter (a process with two runnable threads wants two cores): more runnable tasks than cores
means work waited for a core. In a container ``/proc`` shows the container's processes
only, on a VM the whole machine's: either way what competes with the run for its cores. A phase's row then
says the median, the 95th percentile and the maximum of its samples (``BusySampler.summary``), and, where
samples had more runnable tasks than cores, who they were: each task by its process's part in the run
(``Roles``: ``conformance worker``, ``cc1plus of g++ of conformance worker``, ``-m nox``), or by the name
given its process group (``BusySampler.groups``: the pre-lowering's compile processes and their
compilers). Its trace (``trace_path``) has every sample, and where over the cores who it was.

Standard library only: the front door runs it in nox's interpreter. Where ``/proc`` is missing (not
Linux) it samples nothing, and the table says nothing of it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from harness.formatting import significant
from harness.machine_limits import usable_cores
from harness.ticker import Ticker

#: Seconds between samples: a phase of the suite lasts tens of seconds, and one sample reads every
#: task's stat file (a few thousand small reads on a busy 32-core runner, milliseconds).
INTERVAL_S = 1.0
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessState:
    """One process as ``/proc`` shows it now."""

    pid: int
    #: Its process group (a job started in a group of its own: every descendant shares it).
    group: int
    #: Its threads in state ``R``.
    runnable: int
    #: Its command name (``comm``: ``python3``, ``cc1plus``).
    comm: str = ""
    #: Its parent's pid (0: unknown).
    parent: int = 0
    #: Where more than one of its threads is runnable, their names (``comm`` of each task: ``python3``
    #: for a Python thread, ``cuda-EvtHandlr`` for one of CUDA's): whose threads put it over one core.
    threads: tuple[str, ...] = ()


def _state_parent_group(stat: bytes) -> tuple[bytes, int, int]:
    # "pid (comm) S ppid pgrp ...": comm may hold spaces and parentheses, the fields follow the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _comm(stat: bytes) -> str:
    return stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")


def processes(proc: Path = PROC) -> list[ProcessState] | None:
    """Every process ``proc`` shows, with its group and runnable threads; None where it cannot be read."""
    try:
        pids = [entry.name for entry in os.scandir(proc) if entry.name.isdigit()]
    except OSError:
        return None
    found = []
    for pid in pids:
        try:
            stat = Path(proc, pid, "stat").read_bytes()
            _, parent, group = _state_parent_group(stat)
            tasks = [entry.path for entry in os.scandir(proc / pid / "task")]
        except (OSError, IndexError, ValueError):  # the process ended between the reads
            continue
        names = []
        for task in tasks:
            try:
                task_stat = Path(task, "stat").read_bytes()
                if _state_parent_group(task_stat)[0] == b"R":
                    names.append(_comm(task_stat))
            except (OSError, IndexError, ValueError):
                continue
        threads = tuple(sorted(names)) if len(names) > 1 else ()
        found.append(ProcessState(int(pid), group, len(names), _comm(stat), parent, threads))
    return found


#: A pytest phase's controller names its result file on its command line: ``--results-json=…/<shard>.json``.
_RESULTS_FLAG = "--results-json="
#: Ancestors looked through for one with a role of its own (a compiler < a case worker < its controller).
_ANCESTORS = 4
_CONTROLLER = " controller"
#: ``harness/forkserver.py``'s server, and every worker it forks: they keep its command line.
FORK_SERVER = "fork server"
#: The thread names a trace shows per name where processes had several runnable threads.
THREADS_SHOWN = 4


def command_line(pid: int, proc: Path = PROC) -> list[str]:
    """``pid``'s arguments (empty where it ended or shows none: a kernel thread)."""
    try:
        raw = Path(proc, str(pid), "cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").removesuffix("\0").split("\0") if raw else []


def own_role(args: list[str]) -> str | None:
    """What a command line says its process is: a pytest phase's controller (``conformance-exclusive
    controller``) or a module Python runs with ``-m`` (``-m conformance.suite.prelower``; a linker's ``-m
    elf_x86_64`` is no module); None: nothing of its own."""
    for arg in args:
        if arg.startswith(_RESULTS_FLAG):
            return f"{Path(arg[len(_RESULTS_FLAG) :]).stem}{_CONTROLLER}"
    if "harness.forkserver" in args and "--serve" in args:
        return FORK_SERVER
    if args and Path(args[0]).name.startswith("python") and "-m" in args[:-1]:
        return f"-m {args[args.index('-m') + 1]}"
    return None


class Roles:
    """Each process's part in the run: its own (``own_role``); a Python process under a phase's controller
    is that phase's worker (``conformance worker``); any other, its command name of its parent's role
    (``cc1plus of g++ of conformance worker``: a compiler a case worker started), or its command name
    alone where no ancestor has a role (a kernel thread). Command lines are read once per pid."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self._own: dict[int, str | None] = {}

    def _own_role(self, pid: int) -> str | None:
        if pid not in self._own:
            self._own[pid] = own_role(command_line(pid, self.proc))
        return self._own[pid]

    def of(self, process: ProcessState, table: dict[int, ProcessState], depth: int = 0) -> str:
        own = self._own_role(process.pid)
        if own == FORK_SERVER:
            return self._forked(process, table, depth)
        if own is not None:
            return own
        comm, parent = process.comm or "?", table.get(process.parent)
        if parent is None or depth >= _ANCESTORS:
            return comm
        above = self.of(parent, table, depth + 1)
        if above == (parent.comm or "?"):  # no role above: the command name alone
            return comm
        if above.endswith(_CONTROLLER) and comm.startswith("python"):
            return above.removesuffix(_CONTROLLER) + " worker"
        return f"{comm} of {above}"

    def _forked(self, process: ProcessState, table: dict[int, ProcessState], depth: int) -> str:
        """A fork server, by its controller (``conformance fork server``); a worker it forked (the same
        command line, the server its parent) as that controller's worker (``conformance worker``)."""
        parent = table.get(process.parent)
        if parent is not None and depth < _ANCESTORS and self._own_role(parent.pid) == FORK_SERVER:
            return self._forked(parent, table, depth + 1).removesuffix(FORK_SERVER) + "worker"
        above = self.of(parent, table, depth + 1) if parent is not None and depth < _ANCESTORS else ""
        return (
            f"{above.removesuffix(_CONTROLLER)} {FORK_SERVER}" if above.endswith(_CONTROLLER) else FORK_SERVER
        )

    def name(self, process: ProcessState, table: dict[int, ProcessState], groups: dict[int, str]) -> str:
        """``process``'s name in a busy count: its group's in ``groups`` (``pre-lowering``), else its role."""
        return groups.get(process.group) or self.of(process, table)


@dataclass
class BusyPart:
    """One name's share of a moment's runnable tasks (``busy_parts``)."""

    tasks: int = 0
    #: The runnable tasks of each of its processes that had any.
    processes: list[int] = field(default_factory=list)
    #: The names of the runnable threads of those of its processes that had several.
    threads: Counter[str] = field(default_factory=Counter)


def busy_parts(table: list[ProcessState], roles: Roles, groups: dict[int, str]) -> dict[str, BusyPart]:
    """A moment's runnable tasks by name (``Roles.name``): what the phase table's over-the-cores mix and the
    traces' words (``describe``) are made of."""
    by_pid = {p.pid: p for p in table}
    parts: dict[str, BusyPart] = {}
    for p in table:
        if p.runnable:
            part = parts.setdefault(roles.name(p, by_pid, groups), BusyPart())
            part.tasks += p.runnable
            part.processes.append(p.runnable)
            part.threads.update(p.threads)
    return parts


def describe(parts: dict[str, BusyPart]) -> str:
    """A trace's words for a moment over the cores: each name's runnable tasks, most first, with how many
    processes had them and the most one had: ``12 conformance worker (11 processes, up to 2 each); 3
    pre-lowering (3 processes)``."""
    words = []
    for name, part in sorted(parts.items(), key=lambda kv: (-kv[1].tasks, kv[0])):
        counts = part.processes
        most = f", up to {max(counts)} each" if max(counts) > 1 and len(counts) > 1 else ""
        named = ", ".join(f"{k} {thread}" for thread, k in part.threads.most_common(THREADS_SHOWN))
        several = f"; threads of those with several: {named}" if named else ""
        words.append(
            f"{part.tasks} {name} ({len(counts)} process{'es' if len(counts) > 1 else ''}{most}{several})"
        )
    return "; ".join(words)


def busiest(table: list[ProcessState], roles: Roles, groups: dict[int, str]) -> str:
    """``describe`` of ``table``'s runnable tasks (``busy_parts``)."""
    return describe(busy_parts(table, roles, groups))


def runnable_in(table: list[ProcessState]) -> int:
    """Tasks in state ``R`` in ``table``, less the calling thread (it was running while it looked)."""
    return max(0, sum(p.runnable for p in table) - 1)


def busy_processes_in(table: list[ProcessState], own: int | None = None) -> int:
    """Processes in ``table`` with a task in state ``R``; process ``own`` (default: this one, whose calling
    thread was running while it looked) only where it had two."""
    me = os.getpid() if own is None else own
    return sum(1 for p in table if p.runnable > (1 if p.pid == me else 0))


def runnable_tasks(proc: Path = PROC) -> int | None:
    """Tasks in state ``R`` now, less the calling thread; None where ``proc`` cannot be read."""
    table = processes(proc)
    return None if table is None else runnable_in(table)


@dataclass(frozen=True)
class Spread:
    """One count's median, 95th percentile and most over a window's samples."""

    median: int
    p95: int
    maximum: int

    @classmethod
    def of(cls, values: list[int]) -> Spread:
        ordered = sorted(values)

        def rank(q: float) -> int:
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

        return cls(rank(0.5), rank(0.95), ordered[-1])

    def __str__(self) -> str:
        return f"p50 {self.median}, p95 {self.p95}, max {self.maximum}"


@dataclass(frozen=True)
class BusySummary:
    """Runnable tasks and busy processes over one window of the run."""

    samples: int
    #: Runnable tasks per sample.
    tasks: Spread
    #: Busy processes per sample (``busy_processes_in``).
    processes: Spread
    cores: int
    #: Samples with more runnable tasks than ``cores``.
    over: int = 0
    #: Samples with more busy processes than ``cores``.
    processes_over: int = 0
    #: Over the samples with more tasks than cores, the runnable tasks per sample of each process name or
    #: group, most first.
    over_mix: tuple[tuple[str, float], ...] = ()
    #: Busy processes integrated over the window (each sample's count until the next): the CPU work
    #: done, in process-seconds. With ``span_s`` it parts a run's time into work and how many cores did
    #: it at once: two runs on machines of 16 and 32 cores can then say which of the two changed.
    process_seconds: float = 0.0
    #: Seconds from the window's first sample to its last.
    span_s: float = 0.0

    @property
    def mean_processes(self) -> float | None:
        """Busy processes on average over the window; None with a single sample."""
        return self.process_seconds / self.span_s if self.span_s > 0 else None

    @property
    def detail(self) -> str:
        """The phase table's words for it: busy processes (issue 31's count) first, then runnable tasks."""
        mean, work = self.mean_processes, ""
        if mean is not None:  # a mean of 0 is a figure too; a single sample has none
            work = f", mean {mean:.1f} ({significant(self.process_seconds, 3)} process-s)"
        words = (
            f"busy processes {self.processes}{work} of {self.cores} cores, over them in "
            f"{self.processes_over} of {self.samples} samples; runnable tasks {self.tasks}"
        )
        if not self.over:
            return words
        mix = ", ".join(f"{per:.1f} {who}" for who, per in self.over_mix[:MIX_SHOWN])
        return f"{words}, over the cores in {self.over}, there on average {mix}"


#: The phase table names this many of an over-the-cores mix's largest parts.
MIX_SHOWN = 4
#: The columns of the busy trace (``BusySampler.trace_path``): seconds from the run's start; runnable
#: tasks; busy processes (``busy_processes_in``); where the tasks were over the cores, who they were
#: (``busiest``).
TRACE_HEADER = "t_s\trunnable\tbusy_processes\tbusiest_over_the_cores\n"


class BusySampler:
    """Samples the runnable tasks and busy processes (``processes``, ``runnable_in``, ``busy_processes_in``)
    every ``interval_s`` in a daemon thread, from ``start`` to ``stop``; where a sample has more tasks than
    ``cores``, also who they were. ``own``: the sampling process's pid (default: this one)."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        scan: Callable[[], list[ProcessState] | None] = processes,
        clock: Callable[[], float] = time.perf_counter,
        cores: int | None = None,
        trace_path: Path | None = None,
        origin: float | None = None,
        roles: Roles | None = None,
        own: int | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.own = os.getpid() if own is None else own
        self.scan = scan
        self.clock = clock
        self.cores = cores or usable_cores().count
        #: Where each sample is written (``TRACE_HEADER``), seconds from ``origin`` (default: the start):
        #: the run's own timeline of busy cores, and who was runnable where it had more than cores.
        self.trace_path = trace_path
        self.origin = origin
        self.roles = roles or Roles()
        self._trace: TextIO | None = None
        #: Process group → the name its runnable tasks are counted under (``pre-lowering``).
        self.groups: dict[int, str] = {}
        #: (clock time, runnable tasks, busy processes), in order.
        self.samples: list[tuple[float, int, int]] = []
        #: For the samples over ``cores``: (clock time, runnable tasks per process name or group).
        self.over: list[tuple[float, Counter[str]]] = []
        self._ticker = Ticker("busy-sampler", interval_s, self._sample)

    def start(self) -> BusySampler:
        if self.origin is None:
            self.origin = self.clock()
        if self.trace_path is not None:
            self._trace = open(self.trace_path, "w", buffering=1)  # noqa: SIM115 - closed by stop()
            self._trace.write(TRACE_HEADER)
        self._ticker.start()
        return self

    def stop(self) -> None:
        self._ticker.stop()
        if self._trace is not None:
            self._trace.close()
            self._trace = None

    def _sample(self) -> bool:
        table = self.scan()
        if table is None:
            return False  # no /proc: nothing to sample
        now, value, busy = self.clock(), runnable_in(table), busy_processes_in(table, self.own)
        self.samples.append((now, value, busy))
        who = ""
        if value > self.cores:
            parts = busy_parts(table, self.roles, self.groups)
            self.over.append((now, Counter({name: part.tasks for name, part in parts.items()})))
            who = describe(parts) if self._trace is not None else ""
        if self._trace is not None:
            self._trace.write(f"{now - (self.origin or 0.0):.2f}\t{value}\t{busy}\t{who}\n")
        return True

    def summary(self, start: float, end: float) -> BusySummary | None:
        """Over the samples taken from ``start`` to ``end`` (clock times); None with none."""
        timed = [(t, v, n) for t, v, n in list(self.samples) if start <= t <= end]
        if not timed:
            return None
        window = [(v, n) for _, v, n in timed]
        tasks, busy = Spread.of([v for v, _ in window]), Spread.of([n for _, n in window])
        processes_over = sum(1 for _, n in window if n > self.cores)
        process_seconds = sum((later[0] - t) * n for (t, _, n), later in itertools.pairwise(timed))
        picked = [mix for t, mix in list(self.over) if start <= t <= end]
        return BusySummary(
            len(window), tasks, busy, self.cores, len(picked), processes_over, _average(picked),
            process_seconds, timed[-1][0] - timed[0][0],
        )  # fmt: skip


def _average(counts: list[Counter[str]]) -> tuple[tuple[str, float], ...]:
    """Each key's mean over ``counts`` (a key missing from one counts 0 there), the largest first."""
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return tuple((who, n / len(counts)) for who, n in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))
