"""How a host's throughput grows with busy processes: the same CPU-bound work (a pure-Python loop, and
g++ compiling a small C++ file: the cold run's two kinds of work) in P processes at once, for P from one
to all the cores. Prints each P's mean seconds per job and the throughput against one process alone
(P x t1 / tP): a host of N independent cores gives about P up to N; SMT siblings or a shared power budget
give less. Standard library only; run with any python3: ``python3 .ci/gpu/host_scaling.py [OUT.json]`` (or
``MEASURE_HOST=1 .ci/gpu/suite.sh``, before the runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

LOOP = 6_000_000
CPP = "#include <map>\n#include <string>\n#include <vector>\n#include <algorithm>\n" + "".join(
    f"int f{i}(std::vector<int> v) {{ std::map<std::string,int> m; std::sort(v.begin(), v.end());"
    f" for (int x : v) m[std::to_string(x)] += x; return (int)m.size() + {i}; }}\n"
    for i in range(40)
)


def python_job(_: int) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(LOOP):
        total += i * i % 7
    return time.perf_counter() - start


def gxx_job(index: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / f"j{index}.cpp"
        source.write_text(CPP)
        start = time.perf_counter()
        subprocess.run(
            ["/usr/bin/g++", "-O2", "-c", str(source), "-o", str(source.with_suffix(".o"))], check=True
        )
        return time.perf_counter() - start


def measure(job, processes: int) -> float:
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(job, range(processes)))  # warm the pool's processes
        times = list(pool.map(job, range(processes)))
    return sum(times) / len(times)


def topology() -> dict[str, str]:
    keep = ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "CPU(s)", "Hypervisor")
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return {}
    fields = (line.partition(":") for line in out.splitlines())
    return {k.strip(): v.strip() for k, _, v in fields if k.strip() in keep}


def main() -> int:
    cores = len(os.sched_getaffinity(0))
    counts = sorted({1, max(1, cores // 4), cores // 2, 3 * cores // 4, cores})
    result: dict[str, object] = {"cores": cores, "topology": topology(), "rows": []}
    print(json.dumps(result["topology"]))
    print(f"{'job':7} {'P':>3} {'s/job':>7} {'throughput':>10}")
    for name, job in (("python", python_job), ("g++", gxx_job)):
        alone = None
        for p in counts:
            seconds = measure(job, p)
            alone = alone or seconds
            row = {
                "job": name,
                "processes": p,
                "seconds_per_job": round(seconds, 3),
                "throughput": round(p * alone / seconds, 2),
            }
            result["rows"].append(row)  # type: ignore[union-attr]
            print(f"{name:7} {p:>3} {seconds:>7.2f} {row['throughput']:>10.2f}", flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
