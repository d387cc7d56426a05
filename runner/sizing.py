"""How many processes a run starts, from the machine's shape: the one place to change these counts.

A GPU run is sized once, by ``size_gpu_run``, from the cores, the GPUs and the host memory together: the
case workers, and the background pre-lowering's compile processes beside them at a lower priority; the
run's header says how it sized itself and why (``GpuSizing.sentence`` and ``GpuSizing.reasons``), and the
phase table how many tasks were runnable in each phase (``runner/busy_sampler.py``). Standard library
only: nox imports this module with whatever interpreter runs nox.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import settings
from harness.machine_limits import Cgroups, Cores, memory_headroom_gib, usable_cores

#: Overrides the case workers per GPU (a positive integer; anything else is ignored).
WORKERS_PER_GPU_ENV = settings.WORKERS_PER_GPU.name
#: Inductor starts a pool of compile subprocesses per compiling process (one per core); with a process per
#: core compiling, one each is enough and spares hundreds of torch imports.
COMPILE_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
#: A compile process's torch ops (building a model, folding constants) on one thread: its process is its
#: share of the budget, not a pool of threads per core.
COMPILE_PROCESS_ENV = {"OMP_NUM_THREADS": "1"}
#: Cores kept out of the budget: the xdist controller and the front door (mostly waiting, but not idle
#: while workers report).
RESERVED_CORES = 1
#: Host memory one busy process may need, in GiB: a case worker that imported CUDA torch and holds zoo
#: models with their float64 references, or a compile process at its peak (an exported program, inductor's
#: generated code and the C++ compiler building it). An estimate with headroom, not a measurement: it only
#: binds on small hosts, where swapping would cost more than the processes it forbids would gain.
PROCESS_GIB = 3.0
#: The case workers' share of the cores (a worker waiting for a compile sleeps; many more processes on
#: one GPU also contend for its time slices): 12 on a 16-core, one-GPU runner.
WORKER_SHARE = 0.75
#: Fewer compile processes than this: not worth a background pre-lowering (a core or two compile as fast
#: one program at a time, as the cases ask for them).
MIN_PRELOWER_JOBS = 2
#: Where the host says how much memory is available (Linux).
MEMINFO = Path("/proc/meminfo")


def cores() -> int:
    """The cores this run may keep busy: the CPU affinity within the cgroup's CPU quota
    (``machine_limits.usable_cores``), not the host's count (a Kubernetes pod's 8 CPUs of a 128-core node)."""
    return usable_cores().count


def available_memory_gib(meminfo: Path = MEMINFO, cgroups: Cgroups | None = None) -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB, within what this process's cgroups still allow
    (``machine_limits.memory_headroom_gib``: a pod's memory limit); None where neither can be read."""
    host = None
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        name, _, value = line.partition(":")
        fields = value.split()
        if name == "MemAvailable" and fields and fields[0].isdigit():
            host = int(fields[0]) / 2**20  # kB
    known = [gib for gib in (host, memory_headroom_gib(cgroups)) if gib is not None]
    return min(known) if known else None


def workers_override(env: Mapping[str, str] = os.environ) -> int | None:
    """``$CONFORMANCE_WORKERS_PER_GPU``, None where unset; anything but a whole number ≥ 1 is a
    ``settings.SettingError`` naming it (a typo no longer sizes the run silently)."""
    return settings.WORKERS_PER_GPU.get(env)


@dataclass(frozen=True)
class GpuSizing:
    """How a GPU run is sized: the case workers of its shared phase, the background compile processes beside
    them, and why."""

    cores: int
    gpus: int
    #: Host memory available when the run started (GiB); None: unknown, no cap.
    memory_gib: float | None
    #: Case workers per GPU in the shared phase (each pinned to its GPU).
    workers_per_gpu: int
    #: Background pre-lowering processes (``--jobs``); 0: no pre-lowering.
    prelower_jobs: int
    #: ``OMP_NUM_THREADS`` of a case worker: its share of the cores the compile processes leave.
    threads_per_worker: int
    #: Short sentences, in order: how the counts followed from the machine and the environment.
    reasons: tuple[str, ...]

    @property
    def workers(self) -> int:
        """Case workers of the shared phase, all GPUs together."""
        return self.workers_per_gpu * self.gpus

    @property
    def busy(self) -> int:
        """Processes of the shared phase: case workers and compile processes (the compiles at a lower
        priority: they take the cycles the workers leave)."""
        return self.workers + self.prelower_jobs

    @property
    def sentence(self) -> str:
        """The run header's line: what was sized, and for what machine."""
        memory = "memory unknown" if self.memory_gib is None else f"{self.memory_gib:.0f} GiB available"
        compiles = f"{self.prelower_jobs} compile processes" if self.prelower_jobs else "no compile process"
        return (
            f"{self.cores} cores, {self.gpus} CUDA device(s), {memory}: {self.workers} case worker(s) "
            f"({self.workers_per_gpu} per GPU, {self.threads_per_worker} thread(s) each) and {compiles}"
        )

    @property
    def detail(self) -> str:
        """The shared phase's detail in the phase table."""
        beside = f"; {self.prelower_jobs} compiling beside" if self.prelower_jobs else ""
        return f"{self.workers} workers, {self.workers_per_gpu} per GPU{beside}"


def size_gpu_run(
    gpus: int,
    *,
    cpus: int | None = None,
    memory_gib: float | None = None,
    env: Mapping[str, str] = os.environ,
    prelower: bool = True,
    prelowered: str | None = None,
) -> GpuSizing:
    """Size a run on ``gpus`` (≥ 1) CUDA devices; ``cpus`` and ``memory_gib`` default to this machine's
    (``memory_gib``: ``MemAvailable``, no cap where unreadable). ``prelower``: whether the run asks for the
    background pre-lowering (``plan.prelowers``). ``prelowered``: the stamp an earlier run left when it
    already lowered everything (``prelowering.earlier_prelowering``): nothing to compile, so no pre-lowering
    whatever ``prelower`` says, and the reasons say why.

    The case workers: ``WORKER_SHARE`` of the cores, spread evenly over the GPUs (at least one each), within
    the budget (the cores but ``RESERVED_CORES``, at most one process per ``PROCESS_GIB`` of memory); the
    whole budget where an earlier run lowered everything (nothing compiles beside them);
    ``$CONFORMANCE_WORKERS_PER_GPU`` sets them instead. The compile processes beside them: the whole budget
    (less what the memory cap leaves), at a lower CPU priority (``prelowering.NICENESS``). A case worker is
    busy only part of a cold run (it sleeps while the program it needs compiles), and the compiles are the
    cold run's critical path, so they take every cycle the workers leave, nothing paused (a fixed split left
    cores idle, ``examples/runs/2026-11-26-sizing-H100/``; a CPU budget was slower,
    ``examples/runs/2026-11-29-scheduler-ab-H200/``). The run's table shows the runnable tasks of each phase
    (``runner/busy_sampler.py``).
    """
    gpus = max(1, gpus)
    found = Cores(cpus) if cpus else usable_cores()  # one read: the count and what bound it
    cpus = found.count
    prelower = prelower and prelowered is None
    if memory_gib is None:
        memory_gib = available_memory_gib()
    budget = max(1, cpus - RESERVED_CORES)
    reasons = [f"{found.words}: a budget of {budget} busy processes (one core for the controller)"]
    cap = None
    if memory_gib is None:
        reasons.append("host memory unknown: no memory cap")
    else:
        cap = max(1, int(memory_gib // PROCESS_GIB))
        allows = f"memory {memory_gib:.0f} GiB allows {cap} processes ({PROCESS_GIB:g} GiB each)"
        reasons.append(f"{allows}: the budget is {cap}" if cap < budget else allows)
        budget = min(budget, cap)
    if prelowered is not None:
        reasons.append(f"pre-lowering: done by an earlier run (stamp {prelowered})")
    override = workers_override(env)
    if override is not None:
        per_gpu = override
        said = f"${WORKERS_PER_GPU_ENV}={override}: {per_gpu * gpus} case workers"
    elif prelowered is not None:
        # Nothing compiles beside them: the workers are the budget (a warm shared phase is bound by its
        # cases' CPU work; examples/runs/2026-11-29-warm-profile-H200/).
        per_gpu = max(1, budget // gpus)
        said = f"case workers: the whole budget, {per_gpu * gpus} ({per_gpu} per GPU)"
    else:
        per_gpu = max(1, min(budget, int(cpus * WORKER_SHARE)) // gpus)
        said = f"case workers: {WORKER_SHARE:.0%} of the cores, {per_gpu * gpus} ({per_gpu} per GPU)"
    if per_gpu * gpus > budget:
        said += f", over the budget of {budget}"
    reasons.append(said)
    jobs = 0
    if prelower:
        room = budget if cap is None else min(budget, cap - per_gpu * gpus)
        jobs = room if room >= MIN_PRELOWER_JOBS else 0
        if jobs:
            reasons.append(f"pre-lowering beside them at a lower priority: {jobs} compile processes")
        else:
            reasons.append("no memory left to compile beside the cases: the cases compile what they need")
    threads = max(1, cpus // (per_gpu * gpus))
    return GpuSizing(cpus, gpus, memory_gib, per_gpu, jobs, threads, tuple(reasons))


def cpu_workers(cpus: int | None = None) -> int:
    """Workers of a run without a CUDA device: at most two (what runs there is the CPU target's cases and
    the view pass's, few and short; each worker imports torch again)."""
    return min(2, cpus or cores())


def self_test_workers(cpus: int | None = None) -> int:
    """Workers of ``nox -s tests``: several self-tests compile real artifacts or run the suite in a
    subprocess; others wait on purpose (hangs, deadlines, signals): one worker more than cores keeps the CPU
    busy while they wait, up to four."""
    return min(4, (cpus or cores()) + 1)
