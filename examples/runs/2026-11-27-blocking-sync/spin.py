"""Do processes sharing one GPU spin on a core while they wait for it? CUDA's default against blocking sync.

    CXX=/usr/bin/g++ python3 examples/runs/2026-11-27-blocking-sync/spin.py   # writes $OUT/spin.json

Twelve processes (a one-H100 run's case workers) each loop: four 2048² matmuls, then read a sum back (a
wait for the GPU), for 8 s. Per mode, twice, interleaved: the loops done, the CPU seconds the processes
used, and the machine's runnable tasks sampled meanwhile (``harness.busy_sampler``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from typing import Any

PROCESSES = 12
SECONDS = 8.0


def _work(mode: str, results: Any, barrier: Any) -> None:
    from harness import cuda_sync

    said = cuda_sync.block_while_waiting() if mode == "blocking" else "CUDA's default"
    import torch

    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    (a @ b).sum().item()
    scheduling = cuda_sync.scheduling(0)
    barrier.wait()
    cpu, start, loops = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - start < SECONDS:
        for _ in range(4):
            product = a @ b
        product.sum().item()
        loops += 1
    results.put((loops, time.process_time() - cpu, time.perf_counter() - start, said, scheduling))


def _one(context: Any, mode: str) -> dict[str, Any]:
    from harness.busy_sampler import processes, runnable_in

    results, barrier = context.Queue(), context.Barrier(PROCESSES + 1)
    workers = [context.Process(target=_work, args=(mode, results, barrier)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    barrier.wait()
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < SECONDS - 0.5:
        table = processes()
        samples.append(runnable_in(table) if table else -1)
        time.sleep(0.25)
    rows = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    samples.sort()
    return {
        "mode": mode,
        "iterations": sum(r[0] for r in rows),
        "cpu_s": round(sum(r[1] for r in rows), 1),
        "wall_s": round(max(r[2] for r in rows), 1),
        "said": rows[0][3],
        "sched": rows[0][4],
        "runnable_p50": samples[len(samples) // 2],
        "runnable_max": samples[-1],
    }


def main() -> None:
    context = mp.get_context("spawn")
    rows = []
    for mode in ("default", "blocking", "default", "blocking"):
        rows.append(_one(context, mode))
        print(json.dumps(rows[-1]), flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "spin.json"), "w") as handle:
        json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
