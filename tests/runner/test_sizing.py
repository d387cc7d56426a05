"""How a GPU run is sized (runner/sizing.py): case workers as a share of the cores, compile
processes beside them at a lower priority, the memory cap, the override, and the README's example. The
run-level effect of the sizing is in test_run_phases.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.machine_limits import Cgroups, Cores
from runner import sizing
from settings import SettingError

ROOT = Path(__file__).resolve().parents[2]
#: sizing's own reader of /proc/meminfo (read before any test replaces it).
READ_MEMORY = sizing.available_memory_gib


@pytest.fixture(autouse=True)
def _machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16-core machine with 125 GiB available, without the override."""
    monkeypatch.delenv("CONFORMANCE_WORKERS_PER_GPU", raising=False)
    monkeypatch.setattr(sizing, "usable_cores", lambda: Cores(16))
    monkeypatch.setattr(sizing, "available_memory_gib", lambda: 125.0)


def _sizing(
    cores: int, gpus: int, memory: float | None = 1000.0, prelower: bool = True, **env: str
) -> sizing.GpuSizing:
    """A run's sizing on that machine; ``env``: the front door's variables."""
    return sizing.size_gpu_run(gpus, cpus=cores, memory_gib=memory, env=env, prelower=prelower)


@pytest.mark.parametrize(
    ("cores", "gpus", "memory", "prelower", "per_gpu", "jobs"),
    [
        (16, 1, 125.0, True, 12, 15),  # one H100: 12 workers, 15 compiles at a lower priority
        (16, 1, 125.0, False, 12, 0),
        (32, 2, 250.0, True, 12, 31),  # two H100s: 24 workers (was 48), 31 compiles
        (32, 2, 250.0, False, 12, 0),
        (128, 8, 1000.0, True, 12, 127),
        (128, 8, 1000.0, False, 12, 0),
        (4, 1, 30.0, True, 3, 3),
        (4, 1, 30.0, False, 3, 0),
        (3, 1, 30.0, True, 2, 2),
        (16, 1, 12.0, True, 4, 0),  # 12 GiB: 4 processes of 3 GiB, all of them case workers
        (16, 1, 12.0, False, 4, 0),
        (16, 1, 16.0, True, 5, 0),  # 5 processes: one compile process is not worth it
        (16, 1, 24.0, True, 8, 0),  # 8: the workers take the budget of 8, nothing left for the compiles
        (16, 1, 60.0, True, 12, 8),  # 20: 12 workers, 8 compiles
        (16, 1, None, True, 12, 15),  # memory unknown: no cap
    ],
)  # fmt: skip
def test_sizing_from_cores_gpus_and_memory(
    cores: int,
    gpus: int,
    memory: float | None,
    prelower: bool,
    per_gpu: int,
    jobs: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sizing, "available_memory_gib", lambda: None)  # None: unknown, no cap
    size = _sizing(cores, gpus, memory, prelower)
    assert (size.workers_per_gpu, size.prelower_jobs) == (per_gpu, jobs)
    assert size.reasons[0].startswith(f"{cores} cores: a budget of {cores - 1} ")
    capped = [r for r in size.reasons if r.startswith("memory ") and "the budget is" in r]
    if memory is not None and memory // sizing.PROCESS_GIB < cores - 1:  # the cap binds: said so
        cap = int(memory // sizing.PROCESS_GIB)
        assert capped == [f"memory {memory:.0f} GiB allows {cap} processes (3 GiB each): the budget is {cap}"]
    else:
        assert not capped
    assert ("host memory unknown: no memory cap" in size.reasons) is (memory is None)
    assert size.sentence.startswith(f"{cores} cores, {gpus} CUDA device(s), ")
    assert f"{size.workers} case worker(s)" in size.sentence


def test_the_override_sets_the_workers_and_the_compiles_keep_the_budget() -> None:
    size = _sizing(16, 1, CONFORMANCE_WORKERS_PER_GPU="5")
    assert (size.workers_per_gpu, size.prelower_jobs) == (5, 15)
    assert size.reasons[-2:] == (
        "$CONFORMANCE_WORKERS_PER_GPU=5: 5 case workers",
        "pre-lowering beside them at a lower priority: 15 compile processes",
    )
    more = _sizing(16, 2, CONFORMANCE_WORKERS_PER_GPU="12")  # more than the budget: said so
    assert (more.workers_per_gpu, more.prelower_jobs) == (12, 15)
    assert more.reasons[-2].endswith("24 case workers, over the budget of 15")
    assert _sizing(16, 1, 12.0, CONFORMANCE_WORKERS_PER_GPU="3").prelower_jobs == 0  # 1 left: not worth it
    assert _sizing(16, 1, prelower=False, CONFORMANCE_WORKERS_PER_GPU="5").threads_per_worker == 3
    assert _sizing(16, 1, CONFORMANCE_WORKERS_PER_GPU="").workers_per_gpu == 12  # empty: unset
    for wrong in ("0", "-3", "two"):  # not a count: named, not silently sized over (settings/)
        with pytest.raises(SettingError, match="CONFORMANCE_WORKERS_PER_GPU must be a whole number"):
            _sizing(16, 1, CONFORMANCE_WORKERS_PER_GPU=wrong)


def test_the_counts_hold_on_every_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over many machines: the case workers fit the budget unless the GPUs alone need more (one each), and
    the compile processes fit what the memory leaves them; compiles are none or enough, and only when the
    run asks for them."""
    monkeypatch.setattr(sizing, "available_memory_gib", lambda: None)  # None: unknown, no cap
    for cores in (*range(1, 20), 24, 32, 48, 64, 96, 128, 192, 256):
        for gpus in (1, 2, 3, 4, 8, 16):
            for memory in (None, 0.5, 4.0, 12.0, 31.9, 64.0, 125.0, 2000.0):
                for prelower in (True, False):
                    size = _sizing(cores, gpus, memory, prelower)
                    cap = None if memory is None else max(1, int(memory // sizing.PROCESS_GIB))
                    budget = max(1, cores - 1 if cap is None else min(cores - 1, cap))
                    assert size.workers_per_gpu >= 1
                    assert size.prelower_jobs == 0 or size.prelower_jobs >= sizing.MIN_PRELOWER_JOBS
                    assert size.prelower_jobs == 0 or prelower
                    assert size.prelower_jobs <= budget
                    if gpus <= budget:
                        assert size.workers <= budget, size
                    else:
                        assert size.workers_per_gpu == 1, size
                        assert any("over the budget" in r for r in size.reasons)
                    if cap is not None and size.prelower_jobs:
                        assert size.workers + size.prelower_jobs <= cap, size
                    assert size.threads_per_worker >= 1
                    assert size.workers * size.threads_per_worker <= max(cores, size.workers)


def test_the_readmes_example_header_is_what_the_sizing_says() -> None:
    size = _sizing(16, 1, 125.0)
    readme = (ROOT / "README.md").read_text()
    assert f"{size.sentence}; then 'traffic or timing' alone, one worker\n" in readme
    assert f"sized so: {'; '.join(size.reasons)}\n" in readme
    assert "Two GPUs and 32 cores get 24 case workers (12 per GPU) and 31 compile processes" in readme
    assert (_sizing(32, 2).workers, _sizing(32, 2).prelower_jobs) == (24, 31)
    assert _sizing(32, 2, prelower=False).workers == 24


def test_an_earlier_run_that_lowered_everything_starts_no_compile_process() -> None:
    warm = sizing.size_gpu_run(1, cpus=16, memory_gib=125.0, env={}, prelowered="/s.done")
    cold = sizing.size_gpu_run(1, cpus=16, memory_gib=125.0, env={}, prelower=False)
    assert (warm.workers, warm.prelower_jobs, warm.threads_per_worker) == (15, 0, 1)
    assert (cold.workers, cold.prelower_jobs) == (12, 0)  # a cold cache: the cases compile what they need
    assert warm.reasons[-2:] == (
        "pre-lowering: done by an earlier run (stamp /s.done)",
        "case workers: the whole budget, 15 (15 per GPU)",
    )
    two = sizing.size_gpu_run(2, cpus=32, memory_gib=250.0, env={}, prelowered="/s.done")
    assert (two.workers_per_gpu, two.workers) == (15, 30)  # the budget of 31, evenly over the GPUs
    small = sizing.size_gpu_run(1, cpus=16, memory_gib=24.0, env={}, prelowered="/s.done")
    assert small.workers == 8  # the memory cap still binds
    env = {"CONFORMANCE_WORKERS_PER_GPU": "5"}
    pinned = sizing.size_gpu_run(1, cpus=16, memory_gib=125.0, env=env, prelowered="/s.done")
    assert (pinned.workers, pinned.prelower_jobs) == (5, 0)
    assert pinned.reasons[-2:] == (
        "pre-lowering: done by an earlier run (stamp /s.done)",
        "$CONFORMANCE_WORKERS_PER_GPU=5: 5 case workers",
    )


def test_the_other_counts_and_the_memory_read(tmp_path: Path) -> None:
    assert sizing.cpu_workers() == 2
    assert sizing.cpu_workers(cpus=1) == 1
    assert sizing.self_test_workers(cpus=2) == 3
    assert sizing.self_test_workers() == 4
    meminfo = tmp_path / "meminfo"
    no_cgroup = Cgroups(tmp_path / "no-cgroup", tmp_path / "no-cgroup")  # no limit: the host's figure alone
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:   12582912 kB\n")
    assert READ_MEMORY(meminfo, no_cgroup) == 12.0
    meminfo.write_text("MemTotal:       131072000 kB\n")
    assert READ_MEMORY(meminfo, no_cgroup) is None
    assert READ_MEMORY(tmp_path / "absent", no_cgroup) is None
