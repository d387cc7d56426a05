"""Suite ``models``: per pipeline model, the costs and gains of the backend against eager PyTorch.

Models: the zoo's pipeline models (``conformance.common.pipelines.PIPELINE_MODELS``): ``asr``, ``llm`` and,
with ``transformers`` installed (extra ``hf``), the Hugging Face architectures ``hf_whisper`` (Whisper encoder
+ decoder) and ``hf_llm`` (Qwen3 prefill + decode over a static KV cache); float32, CUDA. Without
``transformers`` the Hugging Face models are left out and the suite's log says why.

Figures, per model:

* **lowering** (benchmark record ``models[<model>-float32-lowering]``): ``compile_cold`` / ``compile_warm``
  and ``first_load`` / ``warm_load``, measured exactly as suite ``lowering`` measures them (its worker
  processes: fresh process, empty caches; with ``--quick`` the models' workers run side by side,
  ``concurrent_models`` in the conditions) — and ``eager_ready``: what eager PyTorch pays in this process
  before its first tokens (build the modules, move them to the GPU, run one pipeline). Ratios
  ``compile_cold_vs_eager`` and ``first_load_vs_eager`` (``x``, lower is better) divide by it.
* **latency** (``models[<model>-float32-<mode>]``, modes ``eager``, ``copy``, ``skip_copy``): wall clock of
  one greedy pipeline run (the pipeline's input starts on the host), device synchronised at the end, the
  three modes interleaved round by round; ``latency_per_token`` divides by the tokens one run generates per
  sequence (the batch is in the conditions). ``vs_eager`` (``x``, lower is better) is backend time / eager
  time per round. ``copy``: option ``skip_copy_output_to_cpu_for_method`` = ``""``; ``skip_copy``: it names
  the first method (ASR kind: the encoder's hidden state stays on the GPU) or both (LLM kind: logits and the
  KV cache stay). ``runtime_{h2d,d2h}_bytes_per_token``: the backend's ``execute_stats``, exact.
* **PCIe bytes** (``models[<model>-float32-<mode>-pcie]``): NVML's counters (``harness.nvml_traffic``) over
  K back-to-back runs in one window, divided by K and by the tokens per run; ``vs_eager`` ratios divide by
  eager PyTorch's own per-token bytes measured the same way (eager moves the input in and, per step, the
  next token out: what any caller of a GPU model pays).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from conformance.benchmarks import BenchPipeline, bench_pipelines, exact_metric, ratio_metric
from conformance.benchmarks.lowering import ModelCosts, cost_timings
from conformance.benchmarks.pipeline_records import RunBytes, runtime_bytes
from conformance.benchmarks.pipelines import (
    NVML_TARGET_BYTES,
    NVML_TIME_CAP_S,
    QUICK_NVML_TARGET_BYTES,
    QUICK_NVML_TIME_CAP_S,
)
from conformance.common.pcie_checks import PerRunTraffic, choose_runs
from conformance.protocol import SKIP_COPY_OPTION, part_attributes
from harness.bench import BenchContext, Suite
from harness.records import BenchRecord, Metric, case_name
from harness.timing import Measurement, interleaved_order, paired_ratio, run_adaptive, summarize, warm_up

SUITE = "models"
DTYPE_NAME = "float32"
MODES = ("eager", "copy", "skip_copy")
BACKEND_MODES = ("copy", "skip_copy")  # the modes this suite runs a backend in
NEEDS = part_attributes("lowering", "runtime")


def unavailable_models() -> dict[str, str]:
    """Models the suite would run but cannot here: name → why (the Hugging Face ones without transformers)."""
    from conformance.models import HF_MODELS, HF_UNAVAILABLE

    return {} if HF_UNAVAILABLE is None else dict.fromkeys(HF_MODELS, HF_UNAVAILABLE)


# ---------------------------------------------------------------------------------------------- records


def params_for(model: str, what: str) -> dict[str, str]:
    return {"model": model, "dtype": DTYPE_NAME, "mode": what}


def _per_token(m: Measurement, tokens: int) -> Measurement:
    return summarize([s / tokens for s in m.samples], m.unit, m.converged, m.stop_reason)


def _over(samples: Sequence[float], eager_s: float | None, what: str) -> Metric:
    if not samples:
        return Metric.missing("x", "lower", f"{what}: not measured")
    if not eager_s:
        return Metric.missing("x", "lower", f"{what}: eager PyTorch's figure is missing")
    m = summarize([s / eager_s for s in samples], "x")
    return m.to_metric("lower")


def lowering_record(
    spec: BenchPipeline, costs: ModelCosts, eager_ready_s: float | None, concurrent: int = 1
) -> BenchRecord:
    params = params_for(spec.model, "lowering")
    eager = (
        exact_metric(eager_ready_s, "s", note="one sample")
        if eager_ready_s
        else Metric.missing("s", "lower", "eager PyTorch was not timed")
    )
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="compile_cold",
        metrics={
            **cost_timings(costs),
            "eager_ready": eager,
            "compile_cold_vs_eager": _over(costs.cold_s, eager_ready_s, "compile_cold / eager_ready"),
            "first_load_vs_eager": _over(costs.first_load_s, eager_ready_s, "first_load / eager_ready"),
        },
        conditions={
            "methods": list(costs.methods),
            "program_bytes": list(costs.program_bytes),
            "how": "compile and load in fresh worker processes with empty caches, as suite 'lowering'",
            # --quick measures the models side by side (each cold compile pays inductor's one-off
            # toolchain setup, ~90 s on a fresh H100, so one after another does not fit a CI job).
            "concurrent_models": concurrent,
            "eager_ready": (
                "this process (torch and CUDA already up): build the eager modules on the GPU and run one "
                "greedy pipeline, synchronised"
            ),
        },
    )


def latency_record(
    spec: BenchPipeline,
    mode: str,
    latency: Measurement,
    counted: RunBytes | None,
    vs_eager: Measurement | None,
    batch: int,
) -> BenchRecord:
    params = params_for(spec.model, mode)
    tokens = spec.tokens_per_run
    metrics = {
        "latency": latency.to_metric("lower"),
        "latency_per_token": _per_token(latency, tokens).to_metric("lower"),
    }
    if vs_eager is not None:
        metrics["vs_eager"] = vs_eager.to_metric("lower")
    if counted is not None:
        metrics["runtime_h2d_bytes_per_token"] = exact_metric(counted.h2d / tokens, "B")
        metrics["runtime_d2h_bytes_per_token"] = exact_metric(counted.d2h / tokens, "B")
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="latency",
        metrics=metrics,
        conditions={
            **latency.conditions,
            "kind": spec.kind,
            "methods": list(spec.methods),
            "tokens_per_run": tokens,
            "batch": batch,
            "skip_copy_option": spec.option_value(mode) if mode in BACKEND_MODES else None,
            "executes_per_run": counted.executes if counted else None,
            "runtime_bytes_per_method": counted.per_method if counted else None,
            "timing": "wall clock per whole run, input on the host, device synchronised at the end",
            "converged": latency.converged,
            "stop_reason": latency.stop_reason,
            "spread": "IQR over repeats; vs_eager from per-round ratios (modes interleaved)",
        },
    )


def _bytes_metric(value: float | None, noise: float | None, traffic: PerRunTraffic, tokens: int) -> Metric:
    if value is None:
        return Metric.missing("B", "lower", traffic.why_missing)
    spread = None if noise is None else noise / tokens
    return Metric(unit="B", value=value / tokens, spread=spread, better="lower", n=1, note=traffic.note())


def pcie_record(
    spec: BenchPipeline, mode: str, traffic: PerRunTraffic, eager: PerRunTraffic | None, runs_reason: str
) -> BenchRecord:
    params = {**params_for(spec.model, mode), "measure": "pcie"}
    tokens = spec.tokens_per_run
    metrics = {
        "nvml_h2d_bytes_per_token": _bytes_metric(traffic.h2d, traffic.h2d_noise, traffic, tokens),
        "nvml_d2h_bytes_per_token": _bytes_metric(traffic.d2h, traffic.d2h_noise, traffic, tokens),
    }
    if eager is not None:
        for direction in ("h2d", "d2h"):
            value, noise = getattr(traffic, direction), getattr(traffic, f"{direction}_noise")
            metrics[f"{direction}_vs_eager"] = ratio_metric(
                value,
                noise,
                getattr(eager, direction),
                what=f"{direction} against eager PyTorch",
                missing_reason=traffic.why_missing if value is None else eager.why_missing,
            )
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="nvml_d2h_bytes_per_token",
        metrics=metrics,
        conditions={
            "valid": traffic.valid,
            "reason": traffic.reason,
            "runs_per_window": traffic.runs,
            "runs_chosen_by": runs_reason,
            "tokens_per_run": tokens,
            "window": traffic.window,
            "skip_copy_option": spec.option_value(mode) if mode in BACKEND_MODES else None,
            "note": "per token: K runs in one NVML window, divided by K and by the tokens per run",
        },
    )


# ---------------------------------------------------------------------------------------------- GPU parts


@dataclass
class _Prepared:
    spec: BenchPipeline
    run: dict[str, Callable[[Any], Any]]  # mode → run(stats) → tokens
    batch: int
    eager_ready_s: float


def _prepare(ctx: BenchContext, spec: BenchPipeline, stack: Any) -> _Prepared:
    import torch

    from conformance.common.pipelines import PIPELINE_MODELS, run_greedy
    from conformance.common.programs import handles, lowered, option
    from conformance.models import get_model, greedy

    device = torch.device("cuda", ctx.device_index)
    how = PIPELINE_MODELS[spec.model].greedy
    lm = lowered(ctx.backend, spec.model, getattr(torch, DTYPE_NAME), "cuda")
    made = stack.enter_context(handles(ctx.backend, lm.program, *spec.methods))
    host_input = lm.eager[spec.methods[0]][1][0].detach().cpu()

    torch.cuda.synchronize(device)
    start = time.perf_counter()
    eager = get_model(spec.model).build(getattr(torch, DTYPE_NAME), device)
    first, second = (eager[m][0] for m in spec.methods)

    def run_eager(stats: Any = None) -> Any:
        with torch.no_grad():
            return greedy(how, first, second, host_input.to(device), spec.steps)

    want = run_eager()
    torch.cuda.synchronize(device)
    eager_ready_s = time.perf_counter() - start

    def backend_mode(mode: str) -> Callable[[Any], Any]:
        def run(stats: Any = None) -> Any:
            with option(ctx.backend, SKIP_COPY_OPTION, spec.option_value(mode)):
                return run_greedy(ctx.backend, spec.model, made[0], made[1], host_input, spec.steps, stats)

        return run

    runs = {"eager": run_eager, **{mode: backend_mode(mode) for mode in BACKEND_MODES}}
    for mode in BACKEND_MODES:
        got = runs[mode](None)
        if not torch.equal(got.cpu(), want.cpu()):
            ctx.log(f"  {spec.model}: mode {mode} tokens {got.tolist()} differ from eager's {want.tolist()}")
    return _Prepared(spec, runs, int(host_input.shape[0]), eager_ready_s)


def _time_modes(ctx: BenchContext, p: _Prepared) -> dict[str, Measurement]:
    import torch

    from harness.gpu_state import capture_gpu_state

    device = ctx.device_index

    def take_batch(round_index: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {mode: [] for mode in MODES}
        for i in range(ctx.policy.batch):
            for mode in interleaved_order(MODES, round_index * ctx.policy.batch + i):
                start = time.perf_counter()
                p.run[mode](None)
                torch.cuda.synchronize(device)
                out[mode].append(time.perf_counter() - start)
        return out

    warm_up([lambda mode=mode: p.run[mode](None) for mode in MODES], device, min_calls=3, min_s=0.1)
    results = run_adaptive(take_batch, ctx.policy, unit="s")
    conditions = capture_gpu_state(device).to_conditions()
    return {mode: replace(m, conditions=conditions) for mode, m in results.items()}


def _lowering_costs(ctx: BenchContext, model: str) -> ModelCosts | None:
    from conformance.benchmarks.lowering import FULL_REPEATS, QUICK_REPEATS, WorkerFailed, measure_model

    repeats = QUICK_REPEATS if ctx.quick else FULL_REPEATS
    try:
        return measure_model(ctx.backend_spec, model, ctx.device_index, repeats, ctx.log)
    except (WorkerFailed, OSError, ValueError, KeyError) as exc:
        ctx.fail(f"models[{model}] lowering: {exc}")
        return None


def run_models(ctx: BenchContext) -> None:
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from harness.nvml_traffic import TrafficMeter

    for model, why in unavailable_models().items():
        ctx.log(f"  {model}: left out: {why}")
    target = QUICK_NVML_TARGET_BYTES if ctx.quick else NVML_TARGET_BYTES
    cap_s = QUICK_NVML_TIME_CAP_S if ctx.quick else NVML_TIME_CAP_S
    specs = bench_pipelines()
    with torch.cuda.device(ctx.device_index), contextlib.ExitStack() as stack:
        prepared = [_prepare(ctx, spec, stack) for spec in specs]
        counted: dict[str, dict[str, RunBytes]] = {}
        for p in prepared:
            counted[p.spec.model] = {}
            for mode in BACKEND_MODES:
                stats: list[tuple[str, dict[str, int]]] = []
                p.run[mode](stats)
                counted[p.spec.model][mode] = runtime_bytes(stats)
            lat = _time_modes(ctx, p)
            for mode in MODES:
                ratio = paired_ratio(lat[mode], lat["eager"]) if mode != "eager" else None
                rec = latency_record(p.spec, mode, lat[mode], counted[p.spec.model].get(mode), ratio, p.batch)
                ctx.emit(rec, "benchmark")
                ctx.log(f"  {rec.name}: {lat[mode].value * 1e3:.3f} ms per run")
        with TrafficMeter(ctx.device_index) as meter:
            for p in prepared:
                copy = counted[p.spec.model]["copy"]
                start = time.perf_counter()
                p.run["copy"](None)
                torch.cuda.synchronize(ctx.device_index)
                runs, why = choose_runs(copy.h2d + copy.d2h, time.perf_counter() - start, target, cap_s)
                traffic: dict[str, PerRunTraffic] = {}
                for mode in MODES:
                    if not meter.supported:
                        traffic[mode] = PerRunTraffic.unsupported(meter.reason or "meter unavailable")
                        continue

                    def window(mode: str = mode, runs: int = runs, p: _Prepared = p) -> None:
                        for _ in range(runs):
                            p.run[mode](None)

                    traffic[mode] = PerRunTraffic.from_measurement(meter.measure(window), runs)
                for mode in MODES:
                    eager = traffic["eager"] if mode != "eager" else None
                    ctx.emit(pcie_record(p.spec, mode, traffic[mode], eager, why), "traffic")
    # Last: fresh worker processes, after this process's GPU work is done.
    jobs = len(prepared) if ctx.quick else 1
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        measured = list(pool.map(lambda p: _lowering_costs(ctx, p.spec.model), prepared))
    for p, costs in zip(prepared, measured, strict=True):
        if costs is not None:
            rec = lowering_record(p.spec, costs, p.eager_ready_s, jobs)
            ctx.emit(rec, "benchmark")
            ctx.log(f"  {rec.name}: compile cold {rec.metrics['compile_cold'].value} s")


SUITES: dict[str, Suite] = {
    SUITE: Suite(
        name=SUITE,
        description=(
            "per pipeline model (asr, llm, hf_whisper, hf_llm): lowering cold/warm, first load, latency per "
            "token and PCIe bytes per token, copy and skip-copy, as ratios against eager PyTorch"
        ),
        run=run_models,
        needs_backend=NEEDS,
    ),
}
