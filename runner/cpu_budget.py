"""One CPU budget for a run's case workers and its compile processes, kept from moment to moment.

The pre-lowering's compile processes take the cores the case workers leave: a cold run is bound by
compiling, and a worker waiting for a program sleeps. Started as many as the budget (at a lower priority)
they fill every core the workers leave, but beside the workers they made more tasks runnable than there
are cores (one H100, 16 cores: p95 29). ``CpuBudget`` keeps the run within its cores: several times a
second it counts the machine's runnable tasks (``busy_sampler.processes``), and fifty times a second it
reads the kernel's count alone (``runnable_now``; less the tasks it counts that a look cannot see, a
container's neighbours, ``unseen``): over the budget, it pauses compile processes at once
(``quick_pause``, only those the last look saw runnable) and takes its next look. Over the budget on
``OVER_LOOKS`` looks in a row, it pauses (SIGSTOP) runnable processes of the pre-lowering's process
group; it resumes (SIGCONT) paused ones, the longest paused first, a few a look (``RESUMES_PER_LOOK``), as
many as the tasks they had runnable when paused fit beside the most the other processes had runnable over
the last ``PEAK_S`` (the case workers' load flickers faster than a look) and a margin below the budget
(``resume_margin``); and every ``ROTATE_S`` it swaps the longest paused for the longest running, so no
program waits behind the others (a case may be waiting for it). A compile process that ran lately and now
sleeps with no child to wait for (a file, a lock, its GPU) may wake at any moment: it counts as busy
(``WAKE_S``), and is paused first. Only the pre-lowering's processes are ever paused (the compiles, and
the front door's toolchain preflight, started in their group), never a case worker. ``stop`` resumes every
process it paused; a guard process resumes the group should the front door be killed outright first.

Standard library only (the front door runs it in nox's interpreter); where ``/proc`` cannot be read it
does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from harness.machine_limits import runnable_now
from harness.ticker import Ticker
from runner.busy_sampler import PROC, ProcessState, Roles, busiest, processes, runnable_in

#: Seconds between two looks at the machine (one look reads every task's state: milliseconds): a compile
#: lasts seconds to minutes, a case a fraction of a second to seconds.
TICK_S = 0.2
#: Seconds between two quick reads of the machine's runnable count (``runnable_now``: one small file);
#: one over the budget pauses compile processes at once (``quick_pause``) and brings the next look
#: forward. One H100's cold run was over its cores in 7 % of the looks, mostly for one look: case workers
#: waking together (a program they all waited for landed) until the next look paused compiles. A quick
#: read shortened that to tens of milliseconds: one H100's cold run was then over its cores in 4.5 % of
#: the sampler's seconds (was 9.4 %), p95 16 of 16. Two H200s' cold run still had two of its 135 seconds
#: sampled inside such a burst (37 and 38 runnable tasks on 32 cores, while the look that paused compiles
#: took its 40 ms): the quick read now pauses by itself, without waiting for a look, every 20 ms.
QUICK_S = 0.02
#: The least seconds between two looks, however often a quick read finds the machine over (a look costs
#: about 30 ms of a core on 16 cores).
MIN_LOOK_S = 0.1
#: Looks in a row over the budget before a compile process is paused. Two let the machine run over its
#: budget for 0.4 s at each burst while a pause resumed at once what the burst had paused: over the cores
#: in 60 of 181 samples of one H100's cold run (issue 31). A compile paused for a worker's moment of
#: work loses only that moment: it resumes at the next look under the budget.
OVER_LOOKS = 1
#: Seconds of the other processes' runnable tasks whose most a resumed compile process must fit beside.
#: Resuming into the room of one look's lull put one H100's cold run over its cores in 39 of 157 samples
#: (a quarter), before the quick read paused bursts within ``QUICK_S``. With the quick read, a 2 s window
#: held compiles paused for room the workers no longer used: one H200's cold run (issue 47) averaged 7.5
#: runnable tasks outside the group against a 2 s most of 10.5, 11.7 compile processes paused, and 10.2
#: of 16 cores busy in a compile-bound phase. Two and a half looks keep a burst's peak, not a whole minute's.
PEAK_S = 0.5
#: Seconds since a compile process was last seen runnable within which, asleep with no child of its own
#: to wait for, it counts as busy: it may wake at any moment. Counted only while runnable, sleeping
#: compile processes woke together between looks: one H100's cold run had 22 busy processes on 16 cores
#: at one sample (16 of them compile processes, with 5 case workers). A process waiting for its child (a
#: compiler) is not counted: the child's core is what it takes back. Longer asleep (the pool's helpers,
#: a process waiting for its next program), it counts as idle.
WAKE_S = 5.0
#: Paused processes a look resumes at most. A look finds room from one moment's count: just after quick
#: reads paused a burst's worth, 14 and 16 resumed at once put two H200s' run over its cores; two a look
#: (ten a second) refill the room within a second or two, and a look that finds the machine over again
#: pauses only those.
RESUMES_PER_LOOK = 2
#: Cores per core of margin left free when resuming (``resume_margin``).
MARGIN_PER_CORES = 16
#: The columns of the trace (``CpuBudget.trace_path``): clock seconds; runnable tasks; those outside the
#: group; their most over the last ``PEAK_S``; the group's running tasks; its processes asleep that count
#: as busy (``WAKE_S``); its processes paused after the look; processes paused and resumed at the look;
#: where over the budget, the busiest processes outside the group (``busy_sampler.busiest``).
TRACE_HEADER = (
    "t_s\trunnable\tothers\tothers_peak\tcompiles_running\tcompiles_may_wake\tpaused\tpaused_now"
    "\tresumed_now\tbusiest_others\n"
)
#: Seconds after which the longest paused compile process takes the place of the longest running one.
ROTATE_S = 2.0
#: A shell loop that resumes the group once the process that may have paused it is gone: killed outright,
#: it ran no ``stop``, and a compile process left stopped would hold a cache lock that a later run waits on.
_GUARD = "while kill -0 {owner} 2>/dev/null; do sleep 1; done; kill -CONT -{group} 2>/dev/null"


def resume_margin(budget: int) -> int:
    """Cores a resume leaves free below the budget: one per ``MARGIN_PER_CORES``. Resumed to the brim, the
    machine went over its cores at the next look where any task woke: one H100's cold run sat at exactly
    its 16 runnable tasks in 20 % of the looks and over it in 15 %, most of those by one task."""
    return max(1, budget // MARGIN_PER_CORES)


def start_guard(group: int, owner: int | None = None) -> subprocess.Popen[bytes] | None:
    """A process of its own (``_GUARD``) that resumes process group ``group`` once ``owner`` (default:
    this process) has ended; None where no shell could be started."""
    command = _GUARD.format(owner=os.getpid() if owner is None else owner, group=group)
    try:
        return subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the group a signal to this run's processes reaches
        )
    except OSError:
        return None


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@dataclass
class CpuBudget:
    """Keeps the machine's runnable tasks within ``budget`` by pausing processes of process group
    ``group`` (the pre-lowering's; its leader, the pool's parent, is left alone)."""

    group: int
    budget: int
    tick_s: float = TICK_S
    rotate_s: float = ROTATE_S
    peak_s: float = PEAK_S
    #: Cores a resume leaves free below the budget (``resume_margin``; 0: resume to the brim).
    margin: int = 0
    scan: Callable[[], list[ProcessState] | None] = field(default=lambda: processes(PROC))
    #: The quick read between looks (``runnable_now``); None from it: no quick reads, looks every tick.
    quick: Callable[[], int | None] = field(default=lambda: runnable_now())
    quick_s: float = QUICK_S
    send: Callable[[int, int], bool] = _signal
    clock: Callable[[], float] = time.monotonic
    #: pid → its runnable tasks when it was paused (what resuming it adds), in pausing order.
    paused: dict[int, int] = field(default_factory=dict)
    #: pid → since when it has run (first seen running, or resumed).
    running_since: dict[int, float] = field(default_factory=dict)
    #: pid → when it was last seen runnable (``WAKE_S``).
    last_runnable: dict[int, float] = field(default_factory=dict)
    wake_s: float = WAKE_S
    #: Processes paused (SIGSTOP) and resumed (SIGCONT) so far.
    pauses: int = 0
    resumes: int = 0
    #: Looks taken, and the seconds they took (reading /proc is most of it): how closely it kept up.
    looks: int = 0
    look_s: float = 0.0
    #: Looks brought forward by a quick read over the budget, and the pauses such reads made at once.
    quick_looks: int = 0
    quick_pauses: int = 0
    _last_look: float | None = None
    _last_rotation: float = 0.0
    _over: int = 0
    #: The group's processes the last look saw runnable, most recently resumed first: what a quick read
    #: may pause (``quick_pause``).
    _seen_running: list[int] = field(default_factory=list)
    #: (clock, runnable tasks outside the group) of the looks of the last ``PEAK_S``.
    _others: list[tuple[float, int]] = field(default_factory=list)
    #: (clock, the quick read's count less the look's) of the looks of the last ``PEAK_S`` (``unseen``).
    _unseen: list[tuple[float, int]] = field(default_factory=list)
    #: Where each look is written, a tab-separated line (``TRACE_HEADER``): the budget's own timeline.
    trace_path: Path | None = None
    #: What names the busiest processes in the trace's looks over the budget.
    roles: Roles = field(default_factory=Roles)
    _trace: TextIO | None = None
    _ticker: Ticker | None = None
    _guard: subprocess.Popen[bytes] | None = None

    def start(self) -> CpuBudget:
        """Keep the budget from now on, with a guard that resumes the group should this process be killed
        before ``stop`` (``start_guard``)."""
        self._last_rotation = self.clock()
        if self.trace_path is not None:
            self._trace = open(self.trace_path, "w", buffering=1)  # noqa: SIM115 - closed by stop()
            self._trace.write(TRACE_HEADER)
        self._guard = start_guard(self.group)
        # False from a look: no /proc, nothing to keep
        self._ticker = Ticker("cpu-budget", min(self.quick_s, self.tick_s), self.tick)
        self._ticker.start()
        return self

    def stop(self) -> None:
        """Stop keeping the budget and resume every process it paused."""
        if self._ticker is not None:
            self._ticker.stop()
        for pid in list(self.paused):
            self._resume(pid)
        if self._trace is not None:
            self._trace.close()
        if self._guard is not None:
            self._guard.kill()
            self._guard.wait()

    @property
    def detail(self) -> str:
        """The phase table's words for what it did."""
        kept = f"{self.pauses} pauses of compile processes to keep within {self.budget} busy"
        if self.quick_pauses:
            kept += f", {self.quick_pauses} of them at once by a quick read"
        if not self.looks:
            return kept
        quick = f", {self.quick_looks} brought forward by a quick read" if self.quick_looks else ""
        return f"{kept} ({self.looks} looks{quick}, {1000 * self.look_s / self.looks:.0f} ms each)"

    def tick(self) -> bool:
        """The ticker's call: a look every ``tick_s``; between looks a quick read, which over the budget
        pauses at once (``quick_pause``) and brings the next look forward (``MIN_LOOK_S`` after the last)."""
        since = None if self._last_look is None else self.clock() - self._last_look
        if since is None or since >= self.tick_s - 1e-9:
            return self.step()
        count = self.quick()
        if count is None or count - self.unseen <= self.budget:
            return True
        # the reader is not one of the tasks a look counts, nor are those the look cannot see
        self.quick_pause(count - 1 - self.unseen - self.budget)
        if since >= MIN_LOOK_S:
            self.quick_looks += 1
            return self.step()
        return True

    @property
    def unseen(self) -> int:
        """Runnable tasks the quick read counts and a look does not see, the least over the last ``PEAK_S``:
        ``/proc/loadavg`` counts the whole host's, and in a container with a process namespace of its own
        (a Kubernetes pod) ``/proc`` lists only the container's. Uncorrected, the other tenants' tasks
        would pause the compiles at every quick read. 0 where the two agree (a machine of its own)."""
        return max(0, min((n for _, n in self._unseen), default=0))

    def quick_pause(self, over: int) -> None:
        """Pause compile processes for ``over`` runnable tasks at once, from those the last look saw runnable
        (the most recently resumed first, as a look pauses): a look reads every task (tens of ms), and a
        burst of case workers is over the cores for as long as the pausing takes. Only those: one asleep
        frees nothing, and the next quick reads of one burst, still over, paused every sleeping compile
        process too (two H200s: a look then found 26 paused, resumed 14 of them at once, and the sampler
        saw 30 compile processes runnable beside 4 workers on 32 cores). Until the next look, no more."""
        now = self.clock()
        while over > 0 and self._seen_running:
            pid = self._seen_running.pop(0)
            if pid in self.paused:
                continue
            self._pause(pid, now)
            self.quick_pauses += 1
            over -= 1

    def step(self) -> bool:
        """One look and what follows from it; False where the machine cannot be read."""
        began = time.perf_counter()
        self._last_look = self.clock()
        try:
            return self._step()
        finally:
            self.looks += 1
            self.look_s += time.perf_counter() - began

    def _step(self) -> bool:
        table = self.scan()
        if table is None:
            return False
        now = self.clock()
        runnable = runnable_in(table)
        kernel = self.quick()
        if kernel is not None:  # what the quick read counts beside what a look sees (``unseen``)
            self._unseen = [(t, n) for t, n in self._unseen if now - t < self.peak_s] + [
                (now, kernel - 1 - runnable)
            ]
        ours = {p.pid: p for p in table if p.group == self.group and p.pid != self.group}
        for pid in [pid for pid in self.paused if pid not in ours]:
            del self.paused[pid]  # it ended (a stopped process can still be killed)
        running = [p for p in ours.values() if p.pid not in self.paused and p.runnable]
        for p in running:
            self.running_since.setdefault(p.pid, now)
            self.last_runnable[p.pid] = now
        for known in (self.running_since, self.last_runnable):
            for pid in [pid for pid in known if pid not in ours]:
                del known[pid]
        may_wake = self._may_wake(ours, table, now)
        recent_first = sorted(running, key=lambda p: (-self.running_since[p.pid], -p.pid))
        self._seen_running = [p.pid for p in recent_first]
        others = runnable - sum(p.runnable for p in ours.values())
        self._others = [(t, n) for t, n in self._others if now - t < self.peak_s] + [(now, others)]
        peak, ours_running = max(n for _, n in self._others), sum(p.runnable for p in running)
        # the budget less its margin, the most the others ran lately and the compiles that may wake
        room = self.budget - self.margin - peak - ours_running - len(may_wake)
        busy = runnable + len(may_wake)
        self._over = self._over + 1 if busy > self.budget else 0
        pauses, resumes = self.pauses, self.resumes
        if self._over >= OVER_LOOKS:
            # those asleep first (they lose nothing now), then the most recently resumed (then the
            # newest): the longest running keep their turn
            over = busy - self.budget
            latest = sorted(running, key=lambda p: (-self.running_since[p.pid], -p.pid))
            for p in [*may_wake, *latest]:
                if over <= 0:
                    break
                self._pause(p.pid, now, max(1, p.runnable))
                over -= max(1, p.runnable)
        elif room > 0 and self.paused:  # a core is free now and lately: no wait, a few at a time
            for pid, weight in list(self.paused.items())[:RESUMES_PER_LOOK]:
                if weight > room:
                    break
                room -= weight
                self._resume(pid, now)
        elif self.paused and running and now - self._last_rotation >= self.rotate_s:
            longest = min(running, key=lambda p: (self.running_since[p.pid], p.pid))
            self._resume(next(iter(self.paused)), now)
            self._pause(longest.pid, now, longest.runnable)
        if now - self._last_rotation >= self.rotate_s:
            self._last_rotation = now
        if self._trace is not None:
            row = (now, runnable, others, peak, ours_running, len(may_wake), len(self.paused))
            done = (self.pauses - pauses, self.resumes - resumes)
            who = ""
            if busy > self.budget:  # who, outside the group: only where over (a look is milliseconds)
                who = busiest([p for p in table if p.group != self.group], self.roles, {})
            self._trace.write("\t".join([f"{row[0]:.3f}", *map(str, row[1:]), *map(str, done), who]) + "\n")
        return True

    def _may_wake(
        self, ours: dict[int, ProcessState], table: list[ProcessState], now: float
    ) -> list[ProcessState]:
        """The group's processes not paused, asleep, with no child to wait for, seen runnable within
        ``wake_s``: each may wake at any moment, so each counts as busy. Longest asleep first."""
        parents = {p.parent for p in table}
        asleep = [
            p
            for p in ours.values()
            if p.pid not in self.paused
            and not p.runnable
            and not p.stopped
            and p.pid not in parents
            and now - self.last_runnable.get(p.pid, -float("inf")) < self.wake_s
        ]
        return sorted(asleep, key=lambda p: (self.last_runnable[p.pid], p.pid))

    def _pause(self, pid: int, now: float, runnable: int = 1) -> None:
        if self.send(pid, signal.SIGSTOP):
            self.paused[pid] = max(1, runnable)
            self.running_since.pop(pid, None)
            self.pauses += 1

    def _resume(self, pid: int, now: float | None = None) -> None:
        self.paused.pop(pid, None)
        if self.send(pid, signal.SIGCONT):
            self.resumes += 1
            self.running_since[pid] = self.clock() if now is None else now


def resume_group(group: int) -> None:
    """SIGCONT to a whole process group (a paused process acts on SIGTERM only once resumed)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGCONT)
