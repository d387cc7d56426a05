"""What this process may use of the machine: cores within its CPU affinity and its cgroup's CPU quota,
memory within its cgroup's memory limit.

``os.cpu_count()`` and ``/proc/meminfo`` describe the host. A GPU CI job on Kubernetes runs in a pod that
may use, say, 8 CPUs and 64 GiB of a 128-core, 1 TiB node: sized from the host, a run there would start
96 case workers and 127 compile processes on 8 CPUs of quota, and more processes than its memory holds.
The suite sizes itself from what this module reads instead; the run header names a CPU limit that bound.

Read: the CPU affinity (``os.sched_getaffinity``; a ``--cpuset-cpus`` container), cgroup v2's ``cpu.max``
and ``memory.max`` (less ``memory.current``, plus the reclaimable ``inactive_file`` of ``memory.stat``),
on the process's own cgroup and every cgroup above it, and cgroup v1's ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us`` and ``memory.limit_in_bytes`` in the same way. Standard library only (nox imports
it with whatever interpreter runs nox); anything unreadable is no limit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Where the cgroup hierarchies are mounted, and where this process says which cgroups it is in.
CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
#: cgroup v1 writes "no limit" as a huge number (page-rounded 2**63 - 1): anything above this is none.
_V1_NO_LIMIT = 2**60


@dataclass(frozen=True)
class Cgroups:
    """The cgroup files of one process: ``root`` (the mount point) and ``own`` (``/proc/self/cgroup``)."""

    root: Path = CGROUP_ROOT
    own: Path = SELF_CGROUP

    def _paths(self) -> dict[str, str]:
        """Controller (``""`` for cgroup v2) → this process's cgroup path in its hierarchy."""
        try:
            lines = self.own.read_text().splitlines()
        except OSError:
            return {}
        paths: dict[str, str] = {}
        for line in lines:
            _, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller.removeprefix("name=")] = path
        return paths

    def dirs(self, controller: str) -> Iterator[Path]:
        """The directories of this process's cgroup and each one above it, nearest first, that exist:
        cgroup v2's (``controller`` ``""``) under the root, v1's under the root's ``controller`` mount."""
        paths = self._paths()
        if controller not in paths:
            return
        base = self.root if not controller else self._v1_mount(controller)
        if base is None:
            return
        parts = [p for p in paths[controller].split("/") if p]
        for depth in range(len(parts), -1, -1):
            found = base.joinpath(*parts[:depth])
            if found.is_dir():
                yield found

    def _v1_mount(self, controller: str) -> Path | None:
        """Where cgroup v1 mounted ``controller``: its own directory or a joint one (``cpu,cpuacct``)."""
        for candidate in sorted(self.root.glob(f"*{controller}*")) if self.root.is_dir() else []:
            if controller in candidate.name.split(",") and candidate.is_dir():
                return candidate
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


def cpu_quota(cgroups: Cgroups | None = None) -> float | None:
    """The tightest CPU quota of this process's cgroups, in CPUs (``2.5``: two and a half cores' time per
    period); None where none is set."""
    cgroups = cgroups or Cgroups()
    quotas = []
    for found in cgroups.dirs(""):
        quota, _, period = (_read(found / "cpu.max") or "").partition(" ")
        if _number(quota) is not None and (_number(period) or 0) > 0:
            quotas.append(int(quota) / int(period))
    for found in cgroups.dirs("cpu"):
        quota, period = (
            _number(_read(found / "cpu.cfs_quota_us")),
            _number(_read(found / "cpu.cfs_period_us")),
        )
        if quota is not None and quota > 0 and period:
            quotas.append(quota / period)
    return min(quotas) if quotas else None


def memory_headroom_gib(cgroups: Cgroups | None = None) -> float | None:
    """The least memory any of this process's cgroups still allows, in GiB: its limit less what is in use,
    the reclaimable page cache (``inactive_file``) counted as free; None where no limit is set."""
    cgroups = cgroups or Cgroups()
    headrooms = []
    for found, limit_file, usage_file, cache_key in (
        *((d, "memory.max", "memory.current", "inactive_file") for d in cgroups.dirs("")),
        *(
            (d, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            for d in cgroups.dirs("memory")
        ),
    ):
        limit, used = _number(_read(found / limit_file)), _number(_read(found / usage_file))
        if limit is None or limit >= _V1_NO_LIMIT or used is None:
            continue
        cache = 0
        for line in (_read(found / "memory.stat") or "").splitlines():
            key, _, value = line.partition(" ")
            if key == cache_key:
                cache = _number(value) or 0
        headrooms.append(max(0, limit - used + cache) / 2**30)
    return min(headrooms) if headrooms else None


def affinity_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Cores:
    """The cores a run may keep busy, and why that many."""

    count: int
    #: Empty where the machine's cores are the count; else what bound it, for the run header.
    bound_by: str = ""

    @property
    def words(self) -> str:
        return f"{self.count} cores" + (f" ({self.bound_by})" if self.bound_by else "")


def usable_cores(
    cgroups: Cgroups | None = None, affinity: int | None = None, machine: int | None = None
) -> Cores:
    """The cores this process may keep busy: its CPU affinity (default: read), within its cgroups' CPU
    quota (rounded down: 2.5 CPUs of quota keep two processes busy, not three), at least one. ``machine``:
    the host's cores, for the words (default ``os.cpu_count()``)."""
    machine = machine or os.cpu_count() or 1
    count = affinity if affinity is not None else affinity_cores()
    bound_by = f"the CPU affinity: {count} of the machine's {machine}" if count < machine else ""
    quota = cpu_quota(cgroups)
    if quota is not None and math.floor(quota) < count:
        count = max(1, math.floor(quota))
        bound_by = f"the cgroup's CPU quota of {quota:g} CPUs; the machine has {machine}"
    return Cores(count, bound_by)
