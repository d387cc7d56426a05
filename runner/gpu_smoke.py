"""One-call smoke run on a GPU machine: ``python -m runner.gpu_smoke [--out DIR]`` (under 3 minutes).

It exercises, in order: the NVML counter path (call latency, achieved poll rate, how often the driver
publishes new counter values), the traffic meter (idle drift, calibration, 1 GiB and 6 GiB pinned
copies each way, device memory, GPM), one CUDA-event timing with the GPU's clocks, and
``harness.bench --quick``. It prints a short table per step and writes ``DIR/smoke.json`` (the
meter's figures as ``run.traffic`` records) and ``DIR/bench.json``. Exit status 1 if a transfer is off
by more than 5 %, a measurement is invalid, or the bench fails.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.environment import capture_environment
from harness.nvml_counters import CounterSample, integrate
from harness.nvml_poller import CounterPoller
from harness.nvml_traffic import TrafficMeter
from harness.results import new_run, utc_now, write_results

GiB = 1 << 30
MiB = 1 << 20
MAX_ERROR = 0.05
TRANSFER_SIZES = (GiB, 6 * GiB)


def update_intervals(samples: Sequence[CounterSample], counter: str) -> list[float]:
    """Times between successive *changes* of one counter: how often the driver publishes a new value."""
    changes = [b.t for a, b in itertools.pairwise(samples) if getattr(a, counter) != getattr(b, counter)]
    return [b - a for a, b in itertools.pairwise(changes)]


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


def section(title: str) -> None:
    print(f"\n== {title}")


def row(label: str, value: object) -> None:
    print(f"  {label:<34} {value}")


def counter_diagnostics(meter: TrafficMeter, host: Any, dev: Any) -> dict[str, Any]:
    """NVML call latency, the poll rate reached, and counter update granularity during a 1 GiB copy."""
    import torch

    read = meter.reader
    start = time.perf_counter()
    for _ in range(200):
        read()
    latency = (time.perf_counter() - start) / 200
    poller = CounterPoller(read)
    poller.start()
    dev[:GiB].copy_(host[:GiB], non_blocking=True)
    torch.cuda.synchronize(dev.device)
    time.sleep(0.1)
    samples = poller.stop()
    totals = integrate(samples)
    gaps = [b.t - a.t for a, b in itertools.pairwise(samples)]
    h2d = meter.calibration.h2d_counter if meter.calibration else "rx"
    intervals = update_intervals(samples, h2d)
    out = {
        "nvml_read_latency_us": round(latency * 1e6, 1),
        "poll_rate_hz": round((len(samples) - 1) / max(totals.duration_s, 1e-9)),
        "poll_gap_median_ms": round(statistics.median(gaps) * 1e3, 3),
        "poll_gap_max_ms": round(totals.max_gap_s * 1e3, 3),
        "counter_update_interval_median_ms": round(statistics.median(intervals) * 1e3, 3)
        if intervals
        else None,
        "counter_updates_seen": len(intervals) + 1 if intervals else 0,
    }
    for key, value in out.items():
        row(key, value)
    return out


def transfer_row(
    meter: TrafficMeter, direction: str, size: int, host: Any, dev: Any
) -> tuple[dict[str, Any], bool]:
    fn: Callable[[], object]
    if direction == "h2d":
        fn = lambda: dev[:size].copy_(host[:size], non_blocking=True)  # noqa: E731
    else:
        fn = lambda: host[:size].copy_(dev[:size], non_blocking=True)  # noqa: E731
    m = meter.measure(fn)
    payload = m.h2d_payload_bytes if direction == "h2d" else m.d2h_payload_bytes
    other = m.d2h_payload_bytes if direction == "h2d" else m.h2d_payload_bytes
    error = None if payload is None else (payload - size) / size
    ok = m.valid and error is not None and abs(error) <= MAX_ERROR
    error_text = "n/a" if error is None else f"{100 * error:+.2f}%"
    verdict = "ok" if ok else f"FAIL ({m.reason})"
    print(
        f"  {direction} {size / GiB:.0f} GiB: {verdict}; payload error {error_text}; valid={m.valid}; "
        f"counted h2d={m.h2d_bytes} d2h={m.d2h_bytes}; payload={_round(payload)} other={_round(other)}; "
        f"wraps={m.wraps}; window {m.duration_s * 1e3:.0f} ms (settle included); note={m.reason}"
    )
    record = m.to_record(
        "traffic_meter",
        f"traffic_meter[{direction}-{size // MiB}MiB]",
        {"direction": direction, "size": f"{size // MiB}MiB"},
    )
    return record.to_dict(), ok


def run_meter(device: int) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    import torch

    section("traffic meter: drift and calibration")
    started = time.monotonic()
    with TrafficMeter(device) as meter:
        info = meter.describe()
        row("enter (drift + calibration) s", f"{time.monotonic() - started:.2f}")
        if not meter.supported:
            row("UNSUPPORTED", meter.reason)
            return [], info, False
        for key in (
            "gpu_uuid",
            "poll_period_s",
            "drift_bytes_per_s",
            "drift_noise_bytes_per_s",
            "counter_publish_interval_s",
            "settle_window_s",
            "calibration",
            "calibration_reason",
        ):
            row(key, info[key])
        largest = max(TRANSFER_SIZES)
        dev = torch.empty(largest, dtype=torch.uint8, device=f"cuda:{device}")
        dev.random_(0, 256)
        host = torch.empty(largest, dtype=torch.uint8, pin_memory=True)
        host.copy_(dev)
        torch.cuda.synchronize(device)
        section("NVML counter path")
        info["diagnostics"] = counter_diagnostics(meter, host, dev)
        section(f"known pinned transfers (limit ±{100 * MAX_ERROR:.0f}%)")
        records, all_ok = [], meter.calibration is not None
        for size in TRANSFER_SIZES:
            for direction in ("h2d", "d2h"):
                record, ok = transfer_row(meter, direction, size, host, dev)
                records.append(record)
                all_ok &= ok
        section("device memory and GPM (from the last transfer)")
        conditions = records[-1]["conditions"]
        row("memory", conditions.get("memory"))
        row("dram_bw_util", records[-1]["metrics"].get("dram_bw_util", conditions.get("dram_bw_reason")))
        return records, info, all_ok


def run_timing(device: int) -> dict[str, Any]:
    import torch

    from harness.timing import StopPolicy, time_cuda

    section("CUDA-event timing: torch.mm bf16 4096³, L2 flushed")
    a = torch.randn(4096, 4096, device=f"cuda:{device}", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=f"cuda:{device}", dtype=torch.bfloat16)
    m = time_cuda(lambda: a @ b, device, StopPolicy(budget_s=1.0))
    tflops = 2 * 4096**3 / m.value / 1e12
    row("median", f"{m.value * 1e6:.1f} µs ± {m.spread * 1e6:.1f} µs IQR (n={m.n}), {tflops:.0f} TFLOP/s")
    row("stop", m.stop_reason)
    row("conditions", m.conditions)
    return {
        "value_s": m.value,
        "iqr_s": m.spread,
        "n": m.n,
        "stop_reason": m.stop_reason,
        "conditions": m.conditions,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.gpu_smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/smoke", help="directory for smoke.json and bench.json")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to smoke-test here")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    props = torch.cuda.get_device_properties(args.device)
    print(f"torch {torch.__version__} CUDA {torch.version.cuda}; cuda:{args.device} = {props.name}")
    run = new_run(capture_environment(), {"kind": "gpu_smoke"})
    records, meter_info, meter_ok = run_meter(args.device)
    run.traffic.extend(records)
    run.metadata["meter"] = meter_info
    run.metadata["timing"] = run_timing(args.device)
    bench_rc = 0
    if not args.skip_bench:
        section("bench --quick")
        from harness.bench import main as bench_main

        bench_rc = bench_main(["--quick", "--out", str(out / "bench.json"), "--device", str(args.device)])
    run.complete, run.finished_at = True, utc_now()
    write_results(out / "smoke.json", run)
    section("summary")
    row("traffic meter", "OK" if meter_ok else "FAILED (see above)")
    row("bench --quick exit status", bench_rc)
    row("wall time s", f"{time.monotonic() - started:.1f}")
    row("files", f"{out / 'smoke.json'}, {out / 'bench.json'}")
    return 0 if meter_ok and bench_rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
