"""How many processes a run starts, from the machine's shape: the one place to change these counts.

Every count is a named function of the core count (and, where a user may override it, the environment),
so that a later change (another ratio, a limit from the GPU's memory) replaces one function here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Overrides ``workers_per_gpu`` (a positive integer).
WORKERS_PER_GPU_ENV = "CONFORMANCE_WORKERS_PER_GPU"
#: Inductor starts a pool of compile subprocesses per compiling process (one per core); with a process per
#: core compiling, one each is enough and spares hundreds of torch imports.
COMPILE_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


def cores() -> int:
    """This machine's cores (1 where Python cannot tell)."""
    return os.cpu_count() or 1


def workers_per_gpu(env: Mapping[str, str] = os.environ, cpus: int | None = None) -> int:
    """Parallel-phase workers per GPU: the cases are mostly host work (exporting models, float64 eager
    references, small kernels), so the cores decide: three in four of them, leaving room for the background
    pre-lowering and the xdist controller; ``$CONFORMANCE_WORKERS_PER_GPU`` overrides."""
    configured = env.get(WORKERS_PER_GPU_ENV, "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, (cpus or cores()) * 3 // 4)


def cpu_workers(cpus: int | None = None) -> int:
    """Workers of a run without a CUDA device: at most two (what runs there is the CPU target's cases and
    the view pass's, few and short; each worker imports torch again)."""
    return min(2, cpus or cores())


def prelower_jobs(cpus: int | None = None) -> int:
    """Background pre-lowering processes on a GPU runner: all cores but one (for the xdist controller)."""
    return max(1, (cpus or cores()) - 1)


#: Fewer pre-lowering jobs than this: not worth a background pre-lowering (a core or two compile as fast
#: one program at a time, as the cases ask for them).
MIN_PRELOWER_JOBS = 2


def threads_per_worker(per_gpu: int, gpus: int, cpus: int | None = None) -> int:
    """``OMP_NUM_THREADS`` of a parallel-phase worker: its share of the cores, for CPU-target programs and
    eager checks."""
    return max(1, (cpus or cores()) // per_gpu // gpus)


def self_test_workers(cpus: int | None = None) -> int:
    """Workers of ``nox -s tests``: several self-tests compile real artifacts or run the suite in a
    subprocess; others wait on purpose (hangs, deadlines, signals): one worker more than cores keeps the CPU
    busy while they wait, up to four."""
    return min(4, (cpus or cores()) + 1)
