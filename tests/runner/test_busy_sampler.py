"""runner/busy_sampler.py: counting runnable tasks from /proc (a fake tree, and this machine's own), and
a window's percentiles."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from runner.busy_sampler import (
    TRACE_HEADER,
    BusySampler,
    BusySummary,
    ProcessState,
    Roles,
    Spread,
    busiest,
    busy_processes_in,
    processes,
    runnable_tasks,
)


def _task(proc: Path, pid: int, tid: int, comm: str, state: str) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "stat").write_text(f"{tid} ({comm}) {state} 1 2 3 4\n")
    if tid == pid:  # the process's own stat: its main thread's (ppid 1, group 2)
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 2 3 4\n")


def test_runnable_tasks_counts_every_thread_in_state_r_less_the_caller(tmp_path: Path) -> None:
    _task(tmp_path, 10, 10, "python3", "R")
    _task(tmp_path, 10, 11, "pt_main) R (x", "S")  # a name with ") R (" in it: the state follows the last ")"
    _task(tmp_path, 10, 12, "worker", "R")
    _task(tmp_path, 20, 20, "cc1plus", "R")
    _task(tmp_path, 30, 30, "sleep", "D")
    (tmp_path / "self").mkdir()  # not a pid
    (tmp_path / "40").mkdir()  # a process that ended: no task folder
    assert runnable_tasks(tmp_path) == 2  # 3 in R, less the sampling thread itself


def test_processes_name_each_process_and_its_group(tmp_path: Path) -> None:
    _task(tmp_path, 10, 10, "python3", "R")
    _task(tmp_path, 10, 11, "pt_main) R (x", "R")
    _task(tmp_path, 20, 20, "cc1plus", "S")
    _task(tmp_path, 30, 30, "cc1plus", "T")
    found = sorted(processes(tmp_path) or [], key=lambda p: p.pid)
    assert found == [
        ProcessState(
            10, 2, 2, "python3", parent=1, threads=("pt_main) R (x", "python3")
        ),  # its threads' names
        ProcessState(20, 2, 0, "cc1plus", parent=1),
        ProcessState(30, 2, 0, "cc1plus", parent=1),  # stopped: not runnable
    ]


def test_busy_processes_count_a_process_once_and_the_samplers_own_only_with_another_thread() -> None:
    table = [
        ProcessState(1, 1, 1, "python3"),  # the sampler's process, its sampling thread alone runnable
        ProcessState(5, 5, 3, "python3"),  # three runnable threads: one busy process
        ProcessState(7, 5, 1, "cc1plus"),
        ProcessState(9, 9, 0, "python3"),  # asleep
    ]
    assert busy_processes_in(table, own=1) == 2
    assert busy_processes_in([*table[1:], ProcessState(1, 1, 2, "python3")], own=1) == 3  # it has work too
    assert busy_processes_in(table, own=99) == 3  # seen from another process, pid 1 is busy


def test_runnable_tasks_without_proc_is_none(tmp_path: Path) -> None:
    assert runnable_tasks(tmp_path / "missing") is None


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_busy_loops_show_up_on_this_machine() -> None:
    context = multiprocessing.get_context("spawn")
    spinners = [context.Process(target=_spin, args=(3.0,)) for _ in range(2)]
    for process in spinners:
        process.start()
    time.sleep(1.0)  # they are started and spinning
    seen = max(runnable_tasks() or 0 for _ in range(20))
    for process in spinners:
        process.join()
    assert seen >= 2 or (os.cpu_count() or 1) < 2


def running(n: int) -> list[ProcessState]:
    """A machine with ``n`` runnable tasks besides the sampler's own thread."""
    return [ProcessState(1, 1, n + 1, "python3")]


def test_a_window_gives_its_samples_percentiles() -> None:
    sampler = BusySampler(scan=lambda: None, cores=16)
    tasks = [3, 9, 14, 15, 15, 15, 15, 15, 15, 15, 20, 2]
    busy = [2, 8, 12, 13, 13, 13, 13, 13, 13, 13, 17, 1]
    sampler.samples = [(float(t), v, n) for t, (v, n) in enumerate(zip(tasks, busy, strict=True))]
    # t = 1..10: 9, 14, seven 15s, 20; the 95th percentile of ten samples is the highest
    # a sample's count holds until the next: 8 + 12 + 7 x 13 process-seconds over the 9 s from t = 1 to 10
    assert sampler.summary(1.0, 10.0) == BusySummary(
        samples=10, tasks=Spread(15, 20, 20), processes=Spread(13, 17, 17), cores=16, processes_over=1,
        process_seconds=111.0, span_s=9.0,
    )  # fmt: skip
    assert sampler.summary(1.0, 9.0) == BusySummary(
        samples=9, tasks=Spread(15, 15, 15), processes=Spread(13, 13, 13), cores=16,
        process_seconds=98.0, span_s=8.0,
    )  # fmt: skip
    assert sampler.summary(1.0, 10.0).detail == (  # type: ignore[union-attr]
        "busy processes p50 13, p95 17, max 17, mean 12.3 (111 process-s) of 16 cores, over them in 1 of "
        "10 samples; runnable tasks p50 15, p95 20, max 20"
    )
    idle = BusySummary(samples=3, tasks=Spread(1, 1, 1), processes=Spread(0, 0, 0), cores=16, span_s=2.0)
    assert "max 0, mean 0.0 (0 process-s) of 16 cores" in idle.detail  # no work is a figure too
    assert sampler.summary(100.0, 200.0) is None  # no sample in the window
    assert sampler.summary(0.0, 0.0).detail == (  # type: ignore[union-attr]
        "busy processes p50 2, p95 2, max 2 of 16 cores, over them in 0 of 1 samples; "
        "runnable tasks p50 3, p95 3, max 3"
    )


def test_the_sampler_samples_until_stopped_and_stops_without_proc() -> None:
    values = iter(range(1000))
    sampler = BusySampler(0.001, scan=lambda: running(next(values))).start()
    time.sleep(0.05)
    sampler.stop()
    taken = len(sampler.samples)
    assert taken >= 3
    time.sleep(0.02)
    assert len(sampler.samples) == taken
    idle = BusySampler(0.001, scan=lambda: None).start()
    idle.stop()
    assert idle.samples == []


def test_samples_over_the_cores_say_who_was_runnable(tmp_path: Path) -> None:
    """Over the cores, each runnable task counts under its process group's name where the front door
    named the group (the pre-lowering's compile processes and their compilers), else its role (here, without
    command lines, its command name)."""
    tables = iter(
        [
            [ProcessState(1, 1, 1, "python3"), ProcessState(5, 5, 3, "python3")],  # 3 of 4 cores: not over
            [
                ProcessState(1, 1, 1, "python3"),  # the sampler itself
                ProcessState(5, 5, 4, "python3"),
                ProcessState(7, 9, 1, "cc1plus"),
                ProcessState(9, 9, 0, "python3"),
            ],
            [
                ProcessState(1, 1, 1, "python3"),
                ProcessState(5, 5, 2, "python3"),
                ProcessState(8, 9, 4, "cc1plus"),
                ProcessState(9, 9, 0, "python3"),
            ],
        ]
    )
    clock = iter(range(3))
    roles = Roles(tmp_path)  # no command lines: each process by its command name
    sampler = BusySampler(
        scan=lambda: next(tables), clock=lambda: float(next(clock)), cores=4, roles=roles, own=1
    )
    sampler.groups[9] = "pre-lowering"
    for _ in range(3):
        assert sampler._sample()
    summary = sampler.summary(0.0, 2.0)
    assert summary is not None
    assert (summary.over, summary.tasks.maximum) == (2, 6)
    assert (summary.processes_over, summary.processes.maximum) == (0, 2)  # 6 tasks, but in 2 processes
    # the two samples over: 5 python3 + 1 pre-lowering, 3 python3 + 4 pre-lowering (the sampler included)
    assert summary.over_mix == (("python3", 4.0), ("pre-lowering", 2.5))
    assert summary.detail == (
        "busy processes p50 2, p95 2, max 2, mean 1.5 (3.00 process-s) of 4 cores, over them in 0 of 3 "
        "samples; runnable tasks p50 5, p95 6, max 6, over the cores in 2, there on average 4.0 python3, "
        "2.5 pre-lowering"
    )
    assert sampler.summary(0.0, 0.0).detail == (  # type: ignore[union-attr]
        "busy processes p50 1, p95 1, max 1 of 4 cores, over them in 0 of 1 samples; "
        "runnable tasks p50 3, p95 3, max 3"
    )


def _cmdline(proc: Path, pid: int, *args: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in args))


def test_roles_name_a_process_by_its_command_line_or_its_nearest_named_ancestor(tmp_path: Path) -> None:
    _cmdline(
        tmp_path, 2, "python3", "-m", "pytest", "-n", "12", "--results-json=/r/conformance-exclusive.json"
    )
    _cmdline(tmp_path, 3, "python3", "-c", "import sys;exec(eval(sys.stdin.readline()))")  # an xdist worker
    _cmdline(tmp_path, 4, "g++", "x.cpp")
    _cmdline(tmp_path, 5, "/usr/lib/gcc/cc1plus", "-quiet", "x.cpp")
    _cmdline(tmp_path, 6, "/venv/bin/python3", "-m", "conformance.suite.prelower", "--jobs=15")
    _cmdline(tmp_path, 11, "/usr/bin/ld", "-m", "elf_x86_64", "-o", "x.so")  # a linker's -m: no module
    for pid in (12, 13):  # a fork server and a worker it forked: one command line
        _cmdline(tmp_path, pid, "/venv/bin/python3", "-m", "harness.forkserver", "--serve", "/tmp/s")
    table = [
        ProcessState(2, 2, 1, "python3", parent=1),
        ProcessState(3, 2, 1, "python3", parent=2),
        ProcessState(4, 2, 1, "g++", parent=3),
        ProcessState(5, 2, 1, "cc1plus", parent=4),
        ProcessState(6, 6, 1, "python3", parent=1),
        ProcessState(7, 6, 1, "python3", parent=6),  # a pool process of a module's
        ProcessState(8, 8, 1, "kworker/0:1", parent=99),  # a kernel thread: no command line, no parent shown
        ProcessState(9, 8, 1, "sleep", parent=8),  # under a process of no role: its command name
        ProcessState(11, 2, 1, "ld", parent=4),
        ProcessState(12, 2, 1, "python3", parent=2),
        ProcessState(13, 2, 1, "python3", parent=12),
    ]
    by_pid = {p.pid: p for p in table}
    roles = Roles(tmp_path)
    assert [roles.of(p, by_pid) for p in table] == [
        "conformance-exclusive controller",
        "conformance-exclusive worker",
        "g++ of conformance-exclusive worker",
        "cc1plus of g++ of conformance-exclusive worker",
        "-m conformance.suite.prelower",
        "python3 of -m conformance.suite.prelower",
        "kworker/0:1",
        "sleep",
        "ld of g++ of conformance-exclusive worker",
        "conformance-exclusive fork server",
        "conformance-exclusive worker",
    ]
    # a trace's words: tasks per name, most first; a named group's processes under its name
    several = ProcessState(10, 2, 2, "python3", parent=2, threads=("cuda-EvtHandlr", "python3"))
    assert busiest([*table[:-3], several], roles, {6: "pre-lowering"}) == (
        "3 conformance-exclusive worker (2 processes, up to 2 each; threads of those with several: "
        "1 cuda-EvtHandlr, 1 python3); 2 pre-lowering (2 processes); "
        "1 cc1plus of g++ of conformance-exclusive worker (1 process); 1 conformance-exclusive controller "
        "(1 process); 1 g++ of conformance-exclusive worker (1 process); 1 kworker/0:1 (1 process); "
        "1 sleep (1 process)"
    )


def test_the_trace_has_every_sample_and_names_the_busiest_where_over_the_cores(tmp_path: Path) -> None:
    tables = iter(
        [
            [ProcessState(1, 1, 1, "python3"), ProcessState(5, 5, 2, "python3")],  # 2 of 2 cores: not over
            [
                ProcessState(1, 1, 1, "python3"),
                ProcessState(5, 5, 2, "python3"),
                ProcessState(8, 9, 3, "cc1plus"),
            ],
        ]
    )
    clock = iter([10.5, 11.5])
    trace = tmp_path / "run.busy.tsv"
    sampler = BusySampler(
        3600.0, lambda: next(tables), lambda: next(clock), 2, trace, 10.0, Roles(tmp_path), own=1
    )
    sampler.groups[9] = "pre-lowering"
    sampler.start()  # its first sample at once, the next an hour later
    deadline = time.monotonic() + 10
    while not sampler.samples and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler._sample()
    sampler.stop()
    assert trace.read_text().splitlines() == [
        TRACE_HEADER.rstrip("\n"),
        "0.50\t2\t1\t",  # within the cores: the counts alone
        "1.50\t5\t2\t3 pre-lowering (1 process); 3 python3 (2 processes, up to 2 each)",
    ]
