"""What a session asks of a run (``SuiteRun``) and the pytest phases it becomes (``PytestPhase``).

Pure: these functions read the environment and the chapters' source, and start nothing, so every choice
the front door makes (which phases, how many workers, which GPUs, which run id) is testable without a run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import settings
from harness import cuda_sync
from harness.results import RUN_ID_ENV
from runner import sizing

#: Cases that need their GPU to themselves (device-wide NVML counters, recorded timings): they run after
#: the parallel phase, in one worker (pyproject's markers ``traffic`` and ``timing``).
EXCLUSIVE_MARKS = ("traffic", "timing")
EXCLUSIVE = " or ".join(EXCLUSIVE_MARKS)
#: conformance/conftest.py's ``WORKER_GPUS_ENV`` (harness does not import the suite): each xdist worker
#: pins itself to one of these GPUs before CUDA starts.
WORKER_GPUS_ENV = settings.WORKER_GPUS.name
#: ``0`` turns the background pre-lowering off (a backend without an artifact cache only loses the time).
PRELOWER_ENV = settings.PRELOWER.name
#: The measured seconds of the suite's long cases, which the plugin starts first (harness/case_order.py).
CASE_SECONDS = Path("conformance", "suite", "case_seconds.json")
#: The shards of a run: ``results/<name><suffix>.json``, one per pytest phase.
EXCLUSIVE_SUFFIX, MULTI_GPU_SUFFIX = "-exclusive", "-multi-gpu"


@dataclass(frozen=True)
class SuiteRun:
    """One run of the suite as a session asks for it."""

    #: The checkout: the front door writes ``results/`` beside its noxfile.
    root: Path
    #: The run's name, the prefix of its shards' files (``conformance``, ``cell-mm_out-float32``).
    name: str
    #: Chapter paths and options the session chose; the user's options come after them.
    selection: tuple[str, ...]
    #: The interpreter that runs the cases (a full path: the repro lines show it).
    python: str
    #: The user's arguments (``nox -s conformance -- ARGS``), ``--run-deadline`` included.
    posargs: tuple[str, ...] = ()
    #: Pre-lower the zoo in the background (off for a backend whose zoo cases cannot run, and for cells).
    prelower: bool = True
    #: The command that writes the rule coverage table (``--output=FILE`` is added), run beside the run;
    #: empty: none.
    coverage: tuple[str, ...] = ()

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def shards(self) -> list[str]:
        """Every shard this run may write, in phase order."""
        return [self.name, self.name + EXCLUSIVE_SUFFIX, self.name + MULTI_GPU_SUFFIX]

    @property
    def prelower_log(self) -> Path:
        return self.results / f"{self.name}.prelower.log"

    @property
    def narrowed(self) -> bool:
        """A selection narrowed by the user (``-k``, ``-m``, a file, a case id): no pre-lowering for it."""
        return any(a.startswith(("-k", "-m")) or "::" in a or a.endswith(".py") for a in self.posargs)

    @property
    def backend_args(self) -> list[str]:
        """The user's ``--backend X`` and ``--backend-path DIR`` (or ``--opt=X``), for the steps beside
        pytest that need the same backend."""
        return backend_args(self.posargs)

    @property
    def shown_python(self) -> str:
        """``python`` as a repro line shows it: relative to the checkout when inside it (``.nox/…``)."""
        path = Path(self.python)
        return str(path.relative_to(self.root)) if path.is_relative_to(self.root) else self.python


@dataclass(frozen=True)
class PytestPhase:
    """One pytest run of a run: its row in the phase table, the shard it writes, and how it runs."""

    #: Its row in the phase table (``cases (shared GPU)``).
    title: str
    #: Its files: ``results/<shard>.json`` and ``.junit.xml``.
    shard: str
    #: pytest-xdist workers.
    workers: int
    #: The ``-m`` expression that picks its cases.
    marks: str
    #: The table's detail column (``8 workers, 4 per GPU; 7 compiling beside``).
    detail: str
    #: Environment beside the run id (GPU pinning, thread counts).
    env: Mapping[str, str] = field(default_factory=dict)
    #: What it collects instead of the run's selection (options included); None: the selection.
    paths: tuple[str, ...] | None = None
    #: How xdist shares the cases out (``--dist``).
    dist: str = "worksteal"
    #: The shard suffixes of the phases that run after it (``-exclusive``): its progress line's ETA counts
    #: their recorded seconds too (``--then-phases``).
    then: tuple[str, ...] = ()
    #: Its workers forked from one interpreter that imported torch ahead (``harness/forkserver.py``;
    #: ``$CONFORMANCE_FORK_WORKERS=0`` turns that off): a phase of many workers, each of which paid that
    #: import at once on the same cores.
    forked: bool = False

    def args(self, selection: Sequence[str], skip_preflight: bool) -> list[str]:
        """pytest's arguments before the plugin's and the user's: what to collect, workers, marks."""
        args = [*(self.paths or selection), "-n", str(self.workers), "--dist", self.dist, "-m", self.marks]
        if self.then:
            args.append(f"--then-phases={','.join(self.then)}")
        if self.forked:
            args += ["-p", "harness.forkserver"]
        return [*args, "--no-preflight"] if skip_preflight else args


def run_id(name: str, env: Mapping[str, str] = os.environ, now: float | None = None) -> str:
    """The id every shard of this run records: ``$CONFORMANCE_RUN_ID`` when CI set one, so cells run on
    several runners (README "Sharding the matrix over several CI runners") merge into one run on the
    dashboard; else a new one, sortable by time and unique per session."""
    shared = env.get(RUN_ID_ENV, "").strip()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return shared or f"{stamp}-{os.getpid():x}-{name}"


def visible_gpu_ids(count: int, env: Mapping[str, str] = os.environ) -> list[str]:
    """The first ``count`` GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(count)]
    return ids[:count]


def pinning(gpus: int, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment that pins each xdist worker to one GPU, round robin; none on one GPU (nothing to
    choose) or none."""
    return {WORKER_GPUS_ENV: ",".join(visible_gpu_ids(gpus, env))} if gpus >= 2 else {}


def backend_args(args: Sequence[str]) -> list[str]:
    """``--backend X`` and ``--backend-path DIR`` in ``args``, spelt ``--opt X`` or ``--opt=X``."""
    found: list[str] = []
    for i, arg in enumerate(args):
        for option in ("--backend", "--backend-path"):
            if arg.startswith(f"{option}="):
                found += [option, arg.partition("=")[2]]
            elif arg == option and i + 1 < len(args):
                found += [option, args[i + 1]]
    return found


def modules_marking(root: Path, selection: Sequence[str], marks: Sequence[str]) -> tuple[str, ...] | None:
    """The chapter modules under ``selection``'s directories whose source applies one of ``marks``
    (``pytest.mark.<mark>``), with ``selection``'s options; None (use ``selection`` as it is) when it names
    anything but directories, e.g. one chapter file."""
    dirs = [a for a in selection if not a.startswith("-")]
    if not dirs or not all((root / d).is_dir() for d in dirs):
        return None
    pattern = re.compile(r"pytest\.mark\.(" + "|".join(map(re.escape, marks)) + r")\b")
    found = [
        str(path.relative_to(root))
        for d in dirs
        for path in sorted((root / d).rglob("test_*.py"))
        if pattern.search(path.read_text())
    ]
    return (*found, *(a for a in selection if a.startswith("-"))) if found else None


def cpu_phase(name: str, workers: int) -> PytestPhase:
    """Without a CUDA device: every case but the multi-GPU ones, in one phase."""
    return PytestPhase("cases", name, workers, "not multi_gpu", f"{workers} workers, CPU", forked=True)


def prelowers(run: SuiteRun, env: Mapping[str, str] = os.environ) -> bool:
    """Whether the run asks for the background pre-lowering: not for a cell or a backend that turned it off
    (``SuiteRun.prelower``), a narrowed selection, or ``$CONFORMANCE_PRELOWER=0``. The front door then asks
    whether an earlier run already lowered everything (``prelowering.earlier_prelowering``), and the sizing
    says whether the cores leave room for it (``sizing.size_gpu_run``)."""
    return run.prelower and not run.narrowed and settings.PRELOWER.get(env)


def shared_env(
    pinned: Mapping[str, str], size: sizing.GpuSizing, env: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The shared phase's environment: GPU pinning, one inductor compile thread, each worker's share of
    the cores (unless ``$OMP_NUM_THREADS`` says otherwise), and GPU waits that sleep instead of spinning on
    a core (``harness/cuda_sync.py``; unless ``$CONFORMANCE_CUDA_SYNC`` says otherwise): nothing is timed
    there, and twelve workers sharing a GPU spun on twelve cores while they waited for each other."""
    sync = env.get(cuda_sync.SYNC_ENV, cuda_sync.BLOCKING)
    return {**pinned, **worker_threads(size, env), cuda_sync.SYNC_ENV: sync}


def worker_threads(size: sizing.GpuSizing, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The threads of a case worker that shares the cores with the shared phase's: one inductor compile
    thread, and its share of the cores for torch's ops (unless ``$OMP_NUM_THREADS`` says otherwise)."""
    threads = env.get("OMP_NUM_THREADS", str(size.threads_per_worker))
    return {**sizing.COMPILE_ENV, "OMP_NUM_THREADS": threads}


def shared_phase(name: str, size: sizing.GpuSizing, env: Mapping[str, str]) -> PytestPhase:
    """Every case that may share its GPU, ``size.workers_per_gpu`` workers per GPU."""
    marks = f"not multi_gpu and not ({EXCLUSIVE})"
    detail = f"{size.detail}; GPU waits asleep" if cuda_sync.asks_blocking(env) else size.detail
    return PytestPhase("cases (shared GPU)", name, size.workers, marks, detail, env, forked=True)


def exclusive_phase(name: str, pinned: Mapping[str, str], paths: tuple[str, ...] | None) -> PytestPhase:
    """The cases that need their GPU alone (``EXCLUSIVE``), in one worker on the first GPU whatever the
    GPUs; ``paths``: only the modules that mark such cases (``modules_marking``: collecting the whole suite
    again costs more than they run). Not one worker per GPU: the GPUs share the host's PCIe, and a
    measurement on one GPU beside the NVML meter's own gigabyte transfers on the other was not alone. On two
    H200s, placement savings measured beside them came out 3 KB noisy (not judged, skipped) or, once, 68 %
    of the bytes with a noise of 1 B: a should-level failure of a correct backend."""
    marks = f"not multi_gpu and ({EXCLUSIVE})"
    detail = "1 worker, the host's PCIe and cores to itself"
    # what is measured here, with CUDA's own waits, and the cores for torch's ops
    threads = os.environ.get("OMP_NUM_THREADS") or str(sizing.cores())
    env = {**pinned, cuda_sync.SYNC_ENV: "default", "OMP_NUM_THREADS": threads}
    shard = name + EXCLUSIVE_SUFFIX
    return PytestPhase("cases (GPU alone)", shard, 1, marks, detail, env, paths, dist="loadfile")


def multi_gpu_phase(name: str) -> PytestPhase:
    """The cases that need several GPUs at once, in one unpinned worker (beside the shared phase, with a case
    worker's threads, ``worker_threads``: torch's default, a thread per core, made a burst of 32 runnable
    tasks beside 24 workers on two H200s)."""
    return PytestPhase("cases (multi-GPU)", name + MULTI_GPU_SUFFIX, 1, "multi_gpu", "1 worker, all GPUs")


def pytest_command(run: SuiteRun, shard: str, args: Sequence[str], after: Sequence[str]) -> list[str]:
    """One pytest phase's command line: ``args`` (``PytestPhase.args``), the recording plugin writing
    ``results/<shard>.json`` and ``.junit.xml``, the long cases first where the checkout has their
    seconds, then ``after`` (the user's arguments, the time left)."""
    seconds = run.root / CASE_SECONDS
    return [
        run.python, "-m", "pytest", *args,
        "-p", "harness.pytest_plugin",
        # pytest-benchmark, where installed (the GPU image has it), turns itself off under xdist with a
        # warning from every worker; the suite's timings are harness.bench's.
        "-p", "no:benchmark",
        f"--results-json={run.results / f'{shard}.json'}",
        f"--repro-prefix={run.shown_python} -m pytest",
        f"--junitxml={run.results / f'{shard}.junit.xml'}",
        *([f"--case-seconds={seconds}"] if seconds.is_file() else []),
        *after,
    ]  # fmt: skip
