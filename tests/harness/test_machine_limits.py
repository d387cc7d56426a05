"""harness/machine_limits.py: the cores and memory a run may use within its CPU affinity and cgroup limits,
read from cgroup trees laid out as cgroup v2 (a Kubernetes pod) and v1 (a Docker container) lay them out;
then this machine's own, which must at least be sane."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.machine_limits import Cgroups, Cores, cpu_quota, memory_headroom_gib, usable_cores
from runner import sizing

GIB = 2**30


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


@pytest.fixture
def pod(tmp_path: Path) -> Cgroups:
    """cgroup v2: a container in a pod limited to 8 CPUs and 8 GiB, 4 GiB in use, 1 GiB of it reclaimable
    page cache; the container's own cgroup sets no limit, the node's root none either."""
    root = tmp_path / "sys"
    _write(
        root,
        {
            "cpu.max": "max 100000",
            "kubepods/pod1/cpu.max": "800000 100000",
            "kubepods/pod1/memory.max": str(8 * GIB),
            "kubepods/pod1/memory.current": str(4 * GIB),
            "kubepods/pod1/memory.stat": f"anon {3 * GIB}\ninactive_file {GIB}\nactive_file 0",
            "kubepods/pod1/ctr/cpu.max": "max 100000",
            "kubepods/pod1/ctr/memory.max": "max",
            "kubepods/pod1/ctr/memory.current": str(4 * GIB),
        },
    )
    own = tmp_path / "self-cgroup"
    own.write_text("0::/kubepods/pod1/ctr\n")
    return Cgroups(root, own)


def test_a_pods_cpu_quota_and_memory_limit_are_read_from_any_cgroup_above_the_process(pod: Cgroups) -> None:
    assert cpu_quota(pod) == 8.0
    assert memory_headroom_gib(pod) == 5.0  # 8 GiB less 4 in use, 1 of them reclaimable
    cores = usable_cores(pod, affinity=128, machine=128)
    assert cores == Cores(8, "the cgroup's CPU quota of 8 CPUs; the machine has 128")
    assert cores.words == "8 cores (the cgroup's CPU quota of 8 CPUs; the machine has 128)"


def test_a_fractional_quota_keeps_as_many_processes_busy_as_it_has_whole_cpus(pod: Cgroups) -> None:
    (pod.root / "kubepods/pod1/cpu.max").write_text("250000 100000\n")
    assert usable_cores(pod, affinity=128).count == 2
    (pod.root / "kubepods/pod1/cpu.max").write_text("50000 100000\n")
    assert usable_cores(pod, affinity=128).count == 1  # never none


def test_the_affinity_binds_where_it_is_below_the_quota(pod: Cgroups) -> None:
    assert usable_cores(pod, affinity=4, machine=128) == Cores(4, "the CPU affinity: 4 of the machine's 128")


def test_a_docker_containers_v1_quota_counts_and_no_limit_is_none(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    _write(
        root,
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "400000",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
            "cpuset/docker/abc/cpu.cfs_quota_us": "100000",  # another controller's mount: not read
            "memory/docker/abc/memory.limit_in_bytes": "9223372036854771712",  # v1's "no limit"
            "memory/docker/abc/memory.usage_in_bytes": str(GIB),
        },
    )
    own = tmp_path / "self-cgroup"
    own.write_text("4:memory:/docker/abc\n3:cpuset:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    cgroups = Cgroups(root, own)
    assert cpu_quota(cgroups) == 4.0
    assert memory_headroom_gib(cgroups) is None
    (root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")  # v1's "no quota"
    assert cpu_quota(cgroups) is None
    (root / "memory/docker/abc/memory.limit_in_bytes").write_text(f"{3 * GIB}\n")
    assert memory_headroom_gib(cgroups) == 2.0


def test_nothing_readable_is_no_limit(tmp_path: Path) -> None:
    nowhere = Cgroups(tmp_path / "absent", tmp_path / "absent-too")
    assert cpu_quota(nowhere) is None
    assert memory_headroom_gib(nowhere) is None
    assert usable_cores(nowhere, affinity=16, machine=16) == Cores(16)


def test_the_host_memory_is_capped_by_the_cgroups_headroom(tmp_path: Path, pod: Cgroups) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1073741824 kB\nMemAvailable:   1006632960 kB\n")  # 960 GiB free
    assert sizing.available_memory_gib(meminfo, pod) == 5.0
    assert sizing.available_memory_gib(tmp_path / "absent", pod) == 5.0


def test_the_run_header_says_which_limit_bound_the_cores(
    monkeypatch: pytest.MonkeyPatch, pod: Cgroups
) -> None:
    """A pod of 8 CPUs and 64 GiB on a 128-core node: sized as 8 cores, not 128, and the header says why."""
    found = usable_cores(pod, affinity=128, machine=128)
    monkeypatch.setattr(sizing, "usable_cores", lambda: found)
    size = sizing.size_gpu_run(1, memory_gib=64.0, env={})
    assert size.reasons[0] == (
        "8 cores (the cgroup's CPU quota of 8 CPUs; the machine has 128): a budget of 7 busy processes "
        "(one core for the controller)"
    )
    assert (size.cores, size.workers, size.prelower_jobs) == (8, 6, 7)


def test_this_machines_own_limits_are_sane() -> None:
    cores = usable_cores()
    assert 1 <= cores.count <= (os.cpu_count() or 1)
    assert sizing.cores() == cores.count
    headroom = memory_headroom_gib()
    assert headroom is None or headroom >= 0
