"""runner/cpu_budget.py: the compile processes paused beyond the run's CPU budget and resumed in
turn, on a scripted machine; then real busy processes paused and resumed through /proc and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.machine_limits import runnable_now
from runner.busy_sampler import ProcessState, Roles
from runner.cpu_budget import (
    MIN_LOOK_S,
    OVER_LOOKS,
    PEAK_S,
    RESUMES_PER_LOOK,
    TICK_S,
    TRACE_HEADER,
    WAKE_S,
    CpuBudget,
    resume_group,
    resume_margin,
    start_guard,
)

GROUP = 100  # the pre-lowering's process group (its leader, the pool's parent, has this pid)
WORKERS = [ProcessState(pid, 1, 1, "python3") for pid in (11, 12, 13)]  # case workers: another group


class Machine:
    """A scripted machine: the processes each look finds, the signals sent, a clock set by hand."""

    def __init__(self, compiles: list[int], threads: dict[int, int] | None = None) -> None:
        self.compiles = compiles
        #: Runnable threads of a compile process where not 1.
        self.threads = threads or {}
        self.stopped: set[int] = set()
        self.sent: list[tuple[int, str]] = []
        self.workers = list(WORKERS)
        self.now = 0.0

    def scan(self) -> list[ProcessState]:
        leader = ProcessState(GROUP, GROUP, 0)
        ours = [
            ProcessState(pid, GROUP, 0 if pid in self.stopped else self.threads.get(pid, 1))
            for pid in self.compiles
        ]
        return [*self.workers, leader, *ours, ProcessState(1, 1, 1)]  # +1: the keeper's own thread

    def send(self, pid: int, sig: int) -> bool:
        self.sent.append((pid, signal.Signals(sig).name))
        (self.stopped.add if sig == signal.SIGSTOP else self.stopped.discard)(pid)
        return True

    def keeper(self, budget: int) -> CpuBudget:
        return CpuBudget(GROUP, budget, scan=self.scan, send=self.send, clock=lambda: self.now)


def _over(keeper: CpuBudget) -> None:
    """Looks enough in a row over the budget to act on it."""
    for _ in range(OVER_LOOKS):
        assert keeper.step()


def test_over_the_budget_the_latest_compiles_are_paused_never_a_worker() -> None:
    machine = Machine(compiles=[21, 22, 23, 24, 25])
    keeper = machine.keeper(budget=6)  # 3 workers + 5 compiles = 8 runnable
    assert OVER_LOOKS == 1  # a burst over the budget lasts one look, not two (0.4 s: p95 over the cores)
    assert keeper.step()
    assert machine.stopped == {24, 25}
    assert all(pid not in (GROUP, *(w.pid for w in WORKERS)) for pid, _ in machine.sent)
    assert keeper.step()  # 6 runnable: within the budget
    assert machine.stopped == {24, 25}


def test_freed_cores_resume_the_longest_paused_first() -> None:
    machine = Machine(compiles=[21, 22, 23, 24, 25])
    keeper = machine.keeper(budget=6)
    _over(keeper)
    machine.now = PEAK_S / 2
    machine.workers = WORKERS[:1]  # two workers wait for a program: 2 cores free
    keeper.step()
    assert machine.stopped == {24, 25}  # not yet: the workers had them within PEAK_S
    machine.now = PEAK_S / 2 + PEAK_S
    keeper.step()
    assert machine.stopped == set()
    assert machine.sent[-2:] == [(25, "SIGCONT"), (24, "SIGCONT")]  # in the order they were paused
    assert keeper.pauses == keeper.resumes == 2


def test_a_lull_shorter_than_the_peak_window_resumes_nothing() -> None:
    """The case workers' runnable tasks flicker between looks (a worker waiting for its GPU spins): a
    compile resumed into one look's lull put the machine over its cores at the next burst."""
    machine = Machine(compiles=[21, 22, 23, 24, 25])
    keeper = machine.keeper(budget=6)
    _over(keeper)
    for step in range(1, 10):  # the workers' load flickers: 1, 3, 1, 3, ... every 0.2 s
        machine.now = 0.2 * step
        machine.workers = WORKERS[:1] if step % 2 else list(WORKERS)
        keeper.step()
        assert machine.stopped == {24, 25}, step


def test_a_resume_leaves_the_margin_free() -> None:
    """Resumed to the brim, any task that woke put the machine over its cores: a resume leaves a core per
    16 free (one H100's 16: 1; two H200s' 32: 2)."""
    assert [resume_margin(b) for b in (4, 16, 31, 32, 64)] == [1, 1, 1, 2, 4]
    for margin, stopped in ((0, set()), (1, {24})):
        machine = Machine(compiles=[21, 22, 23, 24, 25])
        keeper = CpuBudget(
            GROUP, 6, scan=machine.scan, send=machine.send, clock=lambda m=machine: m.now, margin=margin
        )
        _over(keeper)  # 24 and 25 paused
        machine.workers = WORKERS[:1]  # two cores free, for PEAK_S
        keeper.step()
        machine.now = 2 * PEAK_S
        keeper.step()
        assert machine.stopped == stopped, margin


def test_a_quick_read_over_the_budget_pauses_at_once_and_brings_the_next_look_forward() -> None:
    """Between looks (every ``tick_s``) the kernel's runnable count alone is read: over the budget, it pauses
    at once as many compile processes as it is over, from those the last look saw running, and the look
    comes as soon as allowed (``MIN_LOOK_S`` after the last), not at the next tick."""
    machine = Machine(compiles=[21, 22])
    # the kernel's count, the reader included, at each look and each quick read: at the first look, within
    # the budget, over it, at it, and at the second look
    quick = iter([6, 6, 9, 7, 7])
    keeper = CpuBudget(
        GROUP, 6, scan=machine.scan, send=machine.send, clock=lambda: machine.now, quick=lambda: next(quick)
    )
    assert keeper.tick()  # the first look: 3 workers + 2 compiles = 5 runnable, within the budget of 6
    assert keeper.looks == 1
    machine.now = MIN_LOOK_S / 4
    assert keeper.tick()  # read 6: within, nothing
    machine.compiles += [23, 24, 25]  # a burst: 3 workers + 5 compiles = 8, over the budget by 2
    machine.now = MIN_LOOK_S / 2
    assert keeper.tick()  # read 9: over by 2; too soon for a look, so it pauses what the last look saw
    assert machine.stopped == {21, 22}
    assert (keeper.looks, keeper.quick_pauses) == (1, 2)
    machine.now = MIN_LOOK_S
    assert keeper.tick()  # read 7: the budget and the reader; the look now (not at tick_s) finds 6
    assert (keeper.looks, keeper.quick_looks) == (2, 1)
    assert machine.stopped == {21, 22}  # within the budget: nothing more paused
    assert keeper.detail.startswith("2 pauses of compile processes to keep within 6 busy, 2 of them at once ")
    assert ", 1 brought forward by a quick read, " in keeper.detail


def test_the_quick_reads_of_one_burst_pause_only_what_the_last_look_saw_runnable() -> None:
    """A compile process asleep frees nothing when paused: the quick reads of a burst, each still over,
    paused those that had gone to sleep since they were seen running too, and the next look, finding the
    room they made, resumed them all at once (two H200s: 14, then 16). Now they pause those the last look
    saw runnable, and then wait for the next look."""
    machine = Machine(compiles=[21, 22, 23, 24, 25])
    quick = iter([9, 7, 20, 20, 20])  # at each look (the reader too), then a long burst
    keeper = CpuBudget(
        GROUP, 8, scan=machine.scan, send=machine.send, clock=lambda: machine.now, quick=lambda: next(quick)
    )
    assert keeper.tick()  # the first look: 3 workers + 5 compiles, at the budget
    machine.threads = {22: 0, 23: 0}  # two compiles wait for their next program
    machine.now = TICK_S
    assert keeper.tick()  # the second look sees them asleep
    for step in range(1, 4):  # three quick reads, each over by 11, too soon for a look
        machine.now = TICK_S + MIN_LOOK_S * step / 4
        assert keeper.tick()
    assert machine.stopped == {21, 24, 25}  # the newest first; never 22 or 23
    assert (keeper.looks, keeper.quick_pauses) == (2, 3)


def test_a_look_resumes_a_few_at_a_time() -> None:
    """A look finds room from one moment's count: resuming all it fits at once made the burst it would
    then pause again."""
    compiles = list(range(21, 31))
    machine = Machine(compiles=compiles)
    keeper = machine.keeper(budget=4)  # 3 workers + 10 compiles: 9 paused, 21 left running
    _over(keeper)
    assert len(machine.stopped) == 9
    machine.workers = []  # the workers wait, past the peak window: room for 3 more
    for look in range(1, 4):
        machine.now = look * PEAK_S
        keeper.step()  # (a turn swaps one paused for one running as well: the count stays)
        assert len(machine.stopped) == 9 - min(3, RESUMES_PER_LOOK * look), look


def test_tasks_the_kernel_counts_and_a_look_cannot_see_do_not_pause_the_compiles() -> None:
    """In a container with a process namespace of its own, ``/proc/loadavg`` counts the host's runnable
    tasks and ``/proc`` lists only the container's: the quick read's count is taken less what it counted
    beside the looks (``unseen``, the least over ``PEAK_S``), so other tenants' load pauses nothing, and a
    burst of the run's own still does."""
    machine = Machine(compiles=[21, 22])
    quick = iter([56, 56, 59])  # 50 tasks of other containers, at the look and after it; then a burst
    keeper = CpuBudget(
        GROUP, 6, scan=machine.scan, send=machine.send, clock=lambda: machine.now, quick=lambda: next(quick)
    )
    assert keeper.tick()  # the look sees 5 runnable; the kernel counts 56, the reader included
    assert keeper.unseen == 50
    machine.now = MIN_LOOK_S / 4
    assert keeper.tick()  # read 56: the look's 5, the reader and the 50 unseen; within the budget of 6
    assert machine.stopped == set()
    machine.compiles += [23, 24, 25]  # the run's own burst: 8 runnable, over by 2
    machine.now = MIN_LOOK_S / 2
    assert keeper.tick()
    assert machine.stopped == {21, 22}


def test_the_kernels_runnable_count_is_read_from_loadavg(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.20 0.18 0.12 7/80 11206\n")
    assert runnable_now(loadavg) == 7
    loadavg.write_text("garbage\n")
    assert runnable_now(loadavg) is None
    assert runnable_now(tmp_path / "missing") is None
    if Path("/proc/loadavg").exists():
        assert (runnable_now() or 0) >= 1  # this reader, at least


def test_a_paused_process_resumes_only_where_its_runnable_tasks_fit() -> None:
    """Resuming a compile process brings back the tasks it had runnable when paused: two free cores do
    not resume one that had three."""
    machine = Machine(compiles=[21, 22, 23], threads={23: 3})
    keeper = machine.keeper(budget=6)  # 3 workers + 1 + 1 + 3 = 8 runnable
    _over(keeper)
    assert machine.stopped == {23}  # the newest, 3 tasks: 5 runnable now
    machine.now = 2 * PEAK_S
    keeper.step()  # one core under the budget: it does not fit
    assert machine.stopped == {23}
    machine.workers = WORKERS[:1]  # 3 runnable: 3 cores free, and for PEAK_S
    keeper.step()
    machine.now = 3 * PEAK_S
    keeper.step()
    assert machine.stopped == set()


def test_at_the_budget_paused_and_running_compiles_take_turns() -> None:
    machine = Machine(compiles=[21, 22, 23, 24, 25])
    keeper = machine.keeper(budget=6)
    _over(keeper)  # 24 and 25 paused
    machine.now = 1.0
    keeper.step()
    assert machine.stopped == {24, 25}  # not yet: turns last ROTATE_S
    machine.now = 2.5
    keeper.step()
    assert machine.sent[-2:] == [(25, "SIGCONT"), (21, "SIGSTOP")]  # longest paused for longest running
    assert machine.stopped == {21, 24}


def test_stopping_resumes_every_paused_process_and_ended_ones_are_forgotten() -> None:
    machine = Machine(compiles=[21, 22, 23, 24, 25])
    keeper = machine.keeper(budget=4)
    _over(keeper)
    assert machine.stopped == {22, 23, 24, 25}
    machine.compiles.remove(23)  # it ended (killed while paused)
    keeper.step()
    assert 23 not in keeper.paused
    keeper.stop()
    assert machine.stopped == {23}  # only the one that is gone was not resumed
    assert keeper.detail.startswith("4 pauses of compile processes to keep within 4 busy (")
    assert keeper.detail.endswith(
        f"({keeper.looks} looks, {1000 * keeper.look_s / keeper.looks:.0f} ms each)"
    )
    assert keeper.looks == 2
    assert CpuBudget(GROUP, 4).detail == "0 pauses of compile processes to keep within 4 busy"


def test_a_compile_asleep_that_ran_lately_counts_as_busy_and_is_paused_first() -> None:
    """A compile process that was runnable a look ago and now sleeps with no child (a file, a lock) may
    wake at any moment: it counts against the budget, is paused before a running one, and keeps a
    paused compile from resuming. Asleep longer than ``WAKE_S``, it is idle."""
    machine = Machine(compiles=[21, 22, 23])
    keeper = machine.keeper(budget=6)  # 3 workers + 3 compiles: at the budget
    assert keeper.step()
    assert machine.stopped == set()
    machine.threads = {22: 0}  # 22 sleeps now: 5 runnable, but 22 may wake
    machine.workers = [*WORKERS, ProcessState(14, 1, 1, "python3")]  # a fourth worker: 6 runnable
    machine.now = 0.2
    assert keeper.step()
    assert machine.stopped == {22}  # the sleeper, not a running compile
    machine.threads = {}
    machine.workers = list(WORKERS)
    machine.now = 0.4 + PEAK_S  # room for one: 22 resumes
    assert keeper.step()
    assert machine.stopped == set()
    machine.threads = {21: 0}
    machine.now = 0.6 + PEAK_S  # 21 asleep, seen runnable 0.2 s ago: 3 + 2 runnable + 1 may wake
    assert keeper.step()
    assert machine.stopped == set()
    machine.workers = [*WORKERS, ProcessState(14, 1, 1, "python3")]
    assert keeper.step()
    assert machine.stopped == {21}
    keeper.stop()
    machine.threads = {21: 0}
    machine.now += WAKE_S  # asleep for longer: idle, not counted
    assert keeper.step()
    assert machine.stopped == set()


def test_a_compile_waiting_for_its_compiler_or_never_runnable_is_not_counted() -> None:
    """A compile process waiting for its child (the compiler, busy or not) gets its core back from the
    child; a process of the group never seen runnable (the pool's helpers) is idle: neither counts."""
    machine = Machine(compiles=[21, 22, 23])
    keeper = machine.keeper(budget=6)
    assert keeper.step()  # 21, 22 and 23 seen runnable
    machine.threads = {22: 0, 24: 0}
    machine.compiles = [21, 22, 23, 24]  # 24: a helper, never runnable
    compiler = ProcessState(31, GROUP, 1, "cc1plus", parent=22)
    scan = machine.scan
    machine.workers = list(WORKERS)
    keeper.scan = lambda: [*scan(), compiler]
    machine.now = 0.2
    assert keeper.step()  # 3 workers + 21, 23 and the compiler: at the budget
    assert machine.stopped == set()


def test_without_proc_it_does_nothing() -> None:
    keeper = CpuBudget(GROUP, 4, scan=lambda: None)
    assert not keeper.step()


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_real_busy_processes_are_paused_and_resumed() -> None:
    """Four busy loops in a process group of their own (as the pre-lowering's pool) and a budget of one:
    whatever else this machine runs, every loop but at most one gets paused; stopping resumes them all."""
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "loops = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(4)]\n"
         "print(' '.join(str(p.pid) for p in loops), flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert leader.stdout is not None
        loops = [int(pid) for pid in leader.stdout.readline().split()]
        keeper = CpuBudget(leader.pid, budget=1, tick_s=0.05).start()
        deadline = time.monotonic() + 10
        while sum(_state(pid) == "T" for pid in loops) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(_state(pid) == "T" for pid in loops) >= 3
        assert _state(leader.pid) != "T"  # the pool's parent is left alone
        keeper.stop()
        assert [_state(pid) for pid in loops].count("T") == 0
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        resume_group(leader.pid)
        leader.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_guard_resumes_the_group_once_its_owner_is_killed() -> None:
    """The front door killed outright (SIGKILL: no ``stop``) must not leave compile processes stopped:
    they may hold a cache lock a later run would wait an hour for."""
    owner = subprocess.Popen(["sleep", "60"])
    group = subprocess.Popen(["sleep", "60"], start_new_session=True)
    guard = start_guard(group.pid, owner=owner.pid)
    try:
        assert guard is not None
        os.killpg(group.pid, signal.SIGSTOP)
        time.sleep(1.5)
        assert _state(group.pid) == "T"  # the owner lives: the guard leaves the pause alone
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 5
        while _state(group.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _state(group.pid) != "T"
        assert guard.wait(timeout=5) == 0  # its work done, it ends
    finally:
        for process in (owner, group):
            process.kill()
            process.wait()
        if guard is not None and guard.poll() is None:
            guard.kill()


def test_each_look_is_a_line_of_its_trace(tmp_path: Path) -> None:
    """The budget's own timeline: what it saw and did at each look, beside the pre-lowering's table."""
    machine = Machine(compiles=[21, 22, 23, 24, 25])
    keeper = machine.keeper(budget=6)
    keeper.trace_path = tmp_path / "conformance.prelower.budget.tsv"
    keeper.roles = Roles(tmp_path)  # no command lines: each process by its command name
    keeper.tick_s = 3600.0  # one look from the ticker at start; the test takes the others
    keeper.start()
    deadline = time.monotonic() + 10
    while keeper.looks < 1 and time.monotonic() < deadline:  # the ticker's first look, in its thread
        time.sleep(0.01)
    machine.now = 0.5
    keeper.step()
    keeper.stop()
    header, *rows = keeper.trace_path.read_text().splitlines()
    assert header.split("\t") == TRACE_HEADER.strip().split("\t")
    assert [row.split("\t")[1:] for row in rows] == [
        # 3 workers + 5 compiles: 8 runnable, 3 of them others (who: the keeper's own thread too); 2
        # compiles paused at this look
        ["8", "3", "3", "5", "0", "2", "2", "0", "3 python3 (3 processes); 1 ? (1 process)"],
        # 3 + 3 runnable: within the budget, no room beside the others' peak: nothing done
        ["6", "3", "3", "3", "0", "2", "0", "0", ""],
    ]
