"""Throwaway: do case workers sharing one GPU spin while they wait? 12 processes, default vs blocking sync."""
import multiprocessing as mp, os, sys, time, json

def work(mode, q, barrier, seconds):
    from harness import cuda_sync
    said = cuda_sync.block_while_waiting() if mode == "blocking" else "default"
    import torch
    a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
    (a @ b).sum().item()
    sched = cuda_sync.scheduling(0)
    barrier.wait()
    c0, t0, n = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(4):
            y = a @ b
        y.sum().item(); n += 1
    q.put((mode, n, time.process_time() - c0, time.perf_counter() - t0, said, sched))

def main():
    from harness.busy_sampler import processes, runnable_in
    ctx = mp.get_context("spawn")
    out = []
    for mode in ("default", "blocking", "default", "blocking"):
        q = ctx.Queue(); k = 12; barrier = ctx.Barrier(k + 1)
        ps = [ctx.Process(target=work, args=(mode, q, barrier, 8.0)) for _ in range(k)]
        [p.start() for p in ps]
        barrier.wait()
        samples = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 7.5:
            t = processes(); samples.append(runnable_in(t) if t else -1); time.sleep(0.25)
        rs = [q.get() for _ in ps]; [p.join() for p in ps]
        it = sum(r[1] for r in rs); cpu = sum(r[2] for r in rs); wall = max(r[3] for r in rs)
        samples.sort()
        row = dict(mode=mode, iterations=it, cpu_s=round(cpu, 1), wall_s=round(wall, 1), said=rs[0][4], sched=rs[0][5],
                   runnable_p50=samples[len(samples)//2], runnable_max=samples[-1])
        out.append(row); print(json.dumps(row), flush=True)
    os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "spin.json"), "w"), indent=1)

if __name__ == "__main__":
    main()
