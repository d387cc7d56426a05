"""Suites ``mm_out`` (the backend's ``mm_out`` vs ``torch.mm(out=)``) and ``threads`` (its thread scaling).

``mm_out``: for each dtype and shape ``MxKxN`` (``out[M,N] = self[M,K] @ mat2[K,N]``) the two competitors
are timed interleaved, one sample each per round with the order alternating, L2 flushed before every
sample (``harness.timing``). Two clocks, as nvbench keeps them:

* GPU time: every batch is queued behind a blocking kernel, so a sample is the device's time for the
  call, without the host's launch cost. ``time`` (ours), ``torch_mm_time``, ``speed_vs_torch_mm``
  (torch time / our time per round, so > 1 means we are faster), ``tflops`` and ``pct_of_peak``, where
  the peak is the best TFLOP/s ``torch.mm`` reached at 8192³ in that dtype *in the same run* (stated in
  each record's ``conditions.peak_reference``).
* Host time: what one call costs the calling thread to enqueue, back to back, interleaved by repeat:
  ``host_time``, ``torch_mm_host_time`` and ``host_speed_vs_torch_mm``. A caller issuing small products
  back to back is bound by this one; the ``threads`` suite shows the same from several threads.

fp32 runs with TF32 off for both, so both do real fp32. Inputs are random normal; outputs start as NaN
and are checked against torch afterwards.

``mm_out`` ends with a model-level figure (``mm_out[llm-decode-float32]``): the LLM decode step with the
program's ``mm`` calls on libtorch's kernel vs the backend's own (``run_decode_route``; target within 2 %).
float32, because that is where inductor leaves the LLM's matmuls as ``aoti_torch_cuda_mm_out`` calls; in
float16/bfloat16 it picks other kernels and the program makes no such call (a GPU run, mm-native-H100).

``threads``: the backend's ``mm_out`` on small shapes from 1, 2, 4 and 8 threads, each thread on its own
stream; total calls/s (median and IQR over repeats) and speedup over one thread, next to ``torch.mm``'s.
Targets (issue 13): at 8 threads ≥ ``torch.mm``'s calls/s at 8 threads and ≥ 3× our one-thread rate
(64³ bf16); ``mm_out``'s ``host_speed_vs_torch_mm`` ≥ 1.0, ``speed_vs_torch_mm`` geomean ≥ 0.99, each ≥ 0.95.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from harness.bench import BenchContext, Suite
from harness.gpu_state import capture_gpu_state
from harness.records import BenchRecord, Metric, case_name
from harness.timing import (
    Measurement,
    paired_ratio,
    summarize,
    time_cuda_interleaved,
    time_host_per_call,
    transform,
)

if TYPE_CHECKING:
    import torch

Shape = tuple[int, int, int]  # (M, K, N)

DTYPES = ("bfloat16", "float16", "float32")
PEAK_SHAPE: Shape = (8192, 8192, 8192)
SMALL: list[Shape] = [(64, 64, 64), (128, 128, 128), (256, 256, 256)]
SKINNY: list[Shape] = [(1, 4096, 4096), (16, 4096, 4096), (4096, 16, 4096)]
SQUARE: list[Shape] = [(n, n, n) for n in (512, 1024, 2048, 4096, 8192)]
# LLM projections: activations [M, 2048] times weights [2048, N].
LLM: list[Shape] = [(m, 2048, n) for m in (1, 16, 128, 2048) for n in (2048, 8192)]
QUICK_SHAPES: list[Shape] = [(64, 64, 64), (1, 4096, 4096), (128, 2048, 8192), (2048, 2048, 2048)]
# Sanity bound on |ours - torch| / max|torch|: the timed call must have computed the product.
CHECK_TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2, "float32": 1e-3}

# Host-time repeats, and calls per repeat: enough for ~2 ms of GPU work, at most HOST_MAX_CALLS.
HOST_REPEATS = {True: 7, False: 21}
HOST_MAX_CALLS = 50

THREAD_COUNTS = (1, 2, 4, 8)
THREAD_SHAPES: list[Shape] = [(64, 64, 64), (256, 256, 256)]


def shape_text(shape: Shape) -> str:
    return "x".join(str(d) for d in shape)


def flops(shape: Shape) -> int:
    m, k, n = shape
    return 2 * m * k * n


def mm_shapes(quick: bool) -> list[Shape]:
    """The sweep, peak shape first (its torch figure is the peak the others are compared with)."""
    shapes = QUICK_SHAPES if quick else [*SMALL, *SKINNY, *SQUARE, *LLM]
    unique = list(dict.fromkeys(shapes))
    return [PEAK_SHAPE, *[s for s in unique if s != PEAK_SHAPE]]


@contextlib.contextmanager
def ieee_fp32_matmul() -> Iterator[dict[str, Any]]:
    """TF32 off for torch.mm while benchmarking (restored after); yields the settings in force."""
    import torch

    settings = torch.backends.cuda.matmul

    def set_tf32(value: bool) -> bool:
        # Newer torch may warn that allow_tf32 is superseded by fp32_precision; the effect is the same.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            old = bool(settings.allow_tf32)
            settings.allow_tf32 = value
            return old

    old = set_tf32(False)
    try:
        yield {
            "allow_tf32": False,
            "allow_fp16_reduced_precision_reduction": bool(settings.allow_fp16_reduced_precision_reduction),
            "allow_bf16_reduced_precision_reduction": bool(settings.allow_bf16_reduced_precision_reduction),
        }
    finally:
        set_tf32(old)


def operands(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """(a, b, out_ours, out_torch): random normal inputs, NaN-poisoned outputs."""
    import torch

    m, k, n = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device=device).to(dtype)
    b = torch.randn(k, n, generator=gen, device=device).to(dtype)
    poisoned = [torch.full((m, n), math.nan, dtype=dtype, device=device) for _ in range(2)]
    return a, b, poisoned[0], poisoned[1]


def check_product(ours: torch.Tensor, reference: torch.Tensor, dtype_name: str) -> str | None:
    """None if ``ours`` matches torch's result closely enough to have been computed; else what is wrong."""
    if ours.isnan().any():
        return "output still holds NaN after the timed runs (never written)"
    scale = reference.abs().max().float().item() or 1.0
    error = (ours.float() - reference.float()).abs().max().item() / scale
    if error > CHECK_TOLERANCE[dtype_name]:
        return f"max |ours - torch.mm| / max|torch.mm| = {error:.2e} > {CHECK_TOLERANCE[dtype_name]}"
    return None


def host_calls(gpu_seconds: float) -> int:
    """Calls per host-time repeat: about 2 ms of GPU work, between 1 and ``HOST_MAX_CALLS``."""
    return max(1, min(HOST_MAX_CALLS, int(2e-3 / max(gpu_seconds, 1e-7))))


def mm_record(
    dtype_name: str,
    shape: Shape,
    ours: Measurement,
    theirs: Measurement,
    peak_tflops: float | None,
    settings: dict[str, Any],
    host: dict[str, Measurement],
) -> BenchRecord:
    """One ``mm_out`` case's figures from the interleaved GPU-time and host-time measurements."""
    work = flops(shape)
    tflops = transform(ours, lambda s: work / s / 1e12, "TFLOP/s")
    if peak_tflops:
        pct = transform(ours, lambda s: 100.0 * work / s / 1e12 / peak_tflops, "%").to_metric("higher")
    else:
        pct = Metric.missing("%", "higher", "no torch.mm peak measured in this run for this dtype")
    params = {"dtype": dtype_name, "shape": shape_text(shape)}
    return BenchRecord(
        suite="mm_out",
        name=case_name("mm_out", params),
        params=params,
        primary="time",
        metrics={
            "time": ours.to_metric("lower"),
            "torch_mm_time": theirs.to_metric("lower"),
            "speed_vs_torch_mm": paired_ratio(theirs, ours).to_metric("higher"),
            "tflops": tflops.to_metric("higher"),
            "pct_of_peak": pct,
            "host_time": host["ours"].to_metric("lower"),
            "torch_mm_host_time": host["torch"].to_metric("lower"),
            "host_speed_vs_torch_mm": paired_ratio(host["torch"], host["ours"]).to_metric("higher"),
        },
        conditions={
            **ours.conditions,
            "shape_order": "MxKxN",
            "peak_reference": {
                "what": f"best TFLOP/s of torch.mm at {shape_text(PEAK_SHAPE)} in {dtype_name}, this run",
                "tflops": None if peak_tflops is None else round(peak_tflops, 2),
            },
            "matmul_settings": settings,
            "converged": ours.converged and theirs.converged,
            "stop_reason": ours.stop_reason,
            "host_time": f"host seconds per call, {host['ours'].n} repeats of back-to-back calls",
            "spread": "IQR of per-sample values; speed ratios from per-round (per-repeat) ratios",
        },
    )


def run_mm_out(ctx: BenchContext) -> None:
    import torch

    device = torch.device("cuda", ctx.device_index)
    mm = ctx.backend.mm_out
    with ieee_fp32_matmul() as settings:
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            peak: float | None = None
            for index, shape in enumerate(mm_shapes(ctx.quick)):
                a, b, out_ours, out_torch = operands(shape, dtype, device, seed=index)
                competitors = {
                    "ours": lambda a=a, b=b, o=out_ours: mm(o, a, b),
                    "torch": lambda a=a, b=b, o=out_torch: torch.mm(a, b, out=o),
                }
                timed = time_cuda_interleaved(
                    competitors, ctx.device_index, ctx.policy, hide_launch_overhead=True
                )
                host = time_host_per_call(
                    competitors,
                    ctx.device_index,
                    calls=host_calls(timed["torch"].value),
                    repeats=HOST_REPEATS[ctx.quick],
                )
                if shape == PEAK_SHAPE:
                    peak = flops(shape) / min(timed["torch"].samples) / 1e12
                problem = check_product(out_ours, out_torch, dtype_name)
                if problem:
                    ctx.fail(f"mm_out[{dtype_name}-{shape_text(shape)}]: {problem}")
                record = mm_record(dtype_name, shape, timed["ours"], timed["torch"], peak, settings, host)
                ctx.emit(record, "benchmark")
                speed = record.metrics["speed_vs_torch_mm"].value
                host_speed = record.metrics["host_speed_vs_torch_mm"].value
                ctx.log(
                    f"  {record.name}: GPU {timed['ours'].value * 1e6:.1f} µs, {speed:.3f}x torch.mm; "
                    f"host {host['ours'].value * 1e6:.1f} µs/call, {host_speed:.3f}x torch.mm"
                )
                del a, b, out_ours, out_torch
            torch.cuda.empty_cache()
    run_decode_route(ctx)


# ------------------------------------------------------------------ model level: LLM decode, mm route A/B

DECODE_DTYPE = "float32"  # the dtype whose compiled decode calls mm_out (see the module docstring)
DECODE_TARGET = 0.98  # libtorch step time / ours: within 2 %


def run_decode_route(ctx: BenchContext) -> None:
    """LLM ``decode`` step time with the program's ``mm`` calls on libtorch's ``aoti_torch_cuda_mm_out``
    vs the backend's own shim: one program lowered both ways (backend ``lower`` option ``native_mm_out``),
    outputs kept on the device, the two executes interleaved (execute returns once the step finished, so
    host time per call is the step time). Skipped, with the reason, for a backend without that option."""
    import torch

    from conformance.models.zoo import get_model
    from conformance.protocol import SKIP_D2H, lower_options, missing_attributes

    backend = ctx.backend
    options = lower_options(backend)
    lacking = missing_attributes(backend, "runtime") + missing_attributes(backend, "lowering")
    if lacking or "native_mm_out" not in options:
        ctx.log(f"  mm_out[llm-decode]: skipped: backend lacks {lacking or ['lower option native_mm_out']}")
        return
    device = torch.device("cuda", ctx.device_index)
    entry = get_model("llm")
    dtype = getattr(torch, DECODE_DTYPE)
    with torch.cuda.device(device):
        eager = entry.build(dtype, device)
        module, inputs = eager["decode"]
        spec = {"decode": (module, inputs, entry.dynamic_shapes_for("decode"))}
        keep = {SKIP_D2H: True} if SKIP_D2H in options else {}
        handles: dict[str, object] = {}
        per_execute: dict[str, object] = {}
        try:
            for route, native in (("libtorch", False), ("ours", True)):
                program = backend.lower(spec, device="cuda", options={"native_mm_out": native, **keep})
                handles[route] = backend.init(program, "decode")
                counter = getattr(backend, "mm_out_calls_per_execute", None)
                per_execute[route] = counter(handles[route]) if callable(counter) else None
            args = list(inputs)
            competitors = {route: (lambda h=h: backend.execute(h, args)) for route, h in handles.items()}
            host = time_host_per_call(
                competitors, ctx.device_index, calls=20, repeats=HOST_REPEATS[ctx.quick]
            )
        finally:
            for h in handles.values():
                backend.destroy(h)
    ratio = paired_ratio(host["libtorch"], host["ours"])
    params = {"model": "llm-decode", "dtype": DECODE_DTYPE}
    record = BenchRecord(
        suite="mm_out",
        name=case_name("mm_out", params),
        params=params,
        primary="step_time",
        metrics={
            "step_time": host["ours"].to_metric("lower"),
            "libtorch_mm_step_time": host["libtorch"].to_metric("lower"),
            "speed_vs_libtorch_mm": ratio.to_metric("higher"),
        },
        conditions={
            "what": "one LLM decode execute (device inputs, device outputs), mm via the backend's shim vs "
            "libtorch's aoti_torch_cuda_mm_out, same compiled program, interleaved",
            "mm_out_calls_per_execute": per_execute,
            "target": f"speed_vs_libtorch_mm >= {DECODE_TARGET} (within 2 %)",
            "outputs_on_device": bool(keep),
        },
    )
    ctx.emit(record, "benchmark")
    verdict = "meets" if ratio.value >= DECODE_TARGET else "misses"
    ctx.log(
        f"  {record.name}: {host['ours'].value * 1e6:.1f} µs/step, libtorch mm "
        f"{host['libtorch'].value * 1e6:.1f} µs/step, {ratio.value:.3f}x ({verdict} >= {DECODE_TARGET}); "
        f"mm_out calls per step: {per_execute}"
    )


# ---------------------------------------------------------------------------------------------- threads


def calls_per_second(
    call_factory: Callable[[], Callable[[], object]],
    threads: int,
    calls_per_thread: int,
    repeats: int,
    device_index: int,
) -> list[float]:
    """Total calls/s of ``threads`` threads (each on its own stream), once per repeat.

    The same threads serve every repeat, so thread start-up and the first call of each thread (where
    a backend creates its per-thread handles) stay outside the timed windows. A window runs from the
    barrier that releases all threads to the barrier they reach once their stream has drained.
    """
    import torch

    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            call = call_factory()
            with torch.cuda.device(device_index):
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    call()
                    stream.synchronize()
                    for _ in range(repeats):
                        barrier.wait()  # start
                        for _ in range(calls_per_thread):
                            call()
                        stream.synchronize()
                        barrier.wait()  # end
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    pool = [threading.Thread(target=worker, name=f"bench-thread-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    rates: list[float] = []
    try:
        for _ in range(repeats):
            barrier.wait()
            start = time.perf_counter()
            barrier.wait()
            rates.append(threads * calls_per_thread / (time.perf_counter() - start))
    except threading.BrokenBarrierError:
        pass  # a worker failed: reported below
    for t in pool:
        t.join()
    if errors:
        raise RuntimeError(f"a benchmark thread failed: {errors[0]!r}") from errors[0]
    return rates


def speedup(base: Measurement, scaled: Measurement) -> Metric:
    """Ratio of medians; noise from the two relative IQRs in quadrature (repeats are not paired)."""
    value = scaled.value / base.value
    rel = math.hypot(base.relative_spread, scaled.relative_spread)
    return Metric(unit="x", value=value, spread=value * rel, better="higher", n=min(base.n, scaled.n))


def run_threads(ctx: BenchContext) -> None:
    import torch

    device = torch.device("cuda", ctx.device_index)
    repeats = 3 if ctx.quick else 7
    calls = 200 if ctx.quick else 1000
    dtypes = ("bfloat16",) if ctx.quick else ("bfloat16", "float32")
    mm = ctx.backend.mm_out
    with ieee_fp32_matmul():
        for dtype_name in dtypes:
            for shape in THREAD_SHAPES:
                a, b, _, _ = operands(shape, getattr(torch, dtype_name), device, seed=0)

                def ours_factory(a: torch.Tensor = a, b: torch.Tensor = b) -> Callable[[], object]:
                    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
                    return lambda: mm(out, a, b)

                def torch_factory(a: torch.Tensor = a, b: torch.Tensor = b) -> Callable[[], object]:
                    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
                    return lambda: torch.mm(a, b, out=out)

                base: Measurement | None = None
                torch_base: Measurement | None = None
                for threads in THREAD_COUNTS:
                    ours = summarize(
                        calls_per_second(ours_factory, threads, calls, repeats, ctx.device_index), "calls/s"
                    )
                    theirs = summarize(
                        calls_per_second(torch_factory, threads, calls, repeats, ctx.device_index), "calls/s"
                    )
                    base, torch_base = base or ours, torch_base or theirs
                    state = capture_gpu_state(ctx.device_index).to_conditions()
                    record = thread_record(dtype_name, shape, threads, ours, theirs, base, torch_base, state)
                    ctx.emit(record, "benchmark")
                    ctx.log(
                        f"  {record.name}: {ours.value:,.0f} calls/s "
                        f"({record.metrics['speedup_vs_1_thread'].value:.2f}x one thread); torch.mm "
                        f"{theirs.value:,.0f} ({record.metrics['torch_mm_speedup_vs_1_thread'].value:.2f}x)"
                    )


def thread_record(
    dtype_name: str,
    shape: Shape,
    threads: int,
    ours: Measurement,
    theirs: Measurement,
    base: Measurement,
    torch_base: Measurement,
    gpu_conditions: dict[str, Any],
) -> BenchRecord:
    params = {"dtype": dtype_name, "shape": shape_text(shape), "threads": str(threads)}
    return BenchRecord(
        suite="threads",
        name=case_name("threads", params),
        params=params,
        primary="calls_per_s",
        metrics={
            "calls_per_s": ours.to_metric("higher"),
            "speedup_vs_1_thread": speedup(base, ours),
            "torch_mm_calls_per_s": theirs.to_metric("higher"),
            "torch_mm_speedup_vs_1_thread": speedup(torch_base, theirs),
        },
        conditions={
            **gpu_conditions,
            "streams": "one per thread",
            "shape_order": "MxKxN",
            "spread": "IQR over repeats; speedup noise from both relative IQRs in quadrature",
        },
    )


SUITES: dict[str, Suite] = {
    "mm_out": Suite(
        name="mm_out",
        description="backend mm_out vs torch.mm(out=): time, ratio, TFLOP/s, % of this run's torch peak",
        run=run_mm_out,
        needs_backend=("mm_out",),
    ),
    "threads": Suite(
        name="threads",
        description="backend mm_out calls/s from 1, 2, 4, 8 threads (one stream each) on small shapes",
        run=run_threads,
        needs_backend=("mm_out",),
    ),
}
