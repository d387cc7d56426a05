"""Suite ``pipelines``: the zoo's ASR-like and LLM-like models end to end, with and without skip-copy.

Pipelines (``conformance.common.pipelines``, driven through the backend protocol, float32 on CUDA):

* ``asr``: ``encoder(features)`` once, then ``decoder(tokens, hidden)`` for 6 steps on the growing sequence.
  Skip-copy mode names ``encoder`` (its hidden state stays on the GPU for every decoder step).
* ``llm``: ``prefill(prompt)`` then ``decode`` for 8 steps through the KV cache. Skip-copy mode names
  ``prefill,decode`` (logits and caches stay on the GPU).

The pipeline's input (features / prompt) starts on the CPU, as a caller's data would; the loops return
CPU token ids. Modes: ``copy`` (option ``skip_copy_output_to_cpu_for_method`` = ``""``, every output
comes back to the CPU), ``skip_copy`` (the runtime option names the methods above) and ``placed`` (export-time
placement, upstream's current mechanism: the program is lowered with ``skip_h2d_for_method_inputs`` and
``skip_d2h_for_method_outputs`` both ``True``, and the caller holds the pipeline's input on the device, so
nothing crosses PCIe in the runtime; only for backends with part ``device_placement``). ``copy`` and
``skip_copy`` run on the same handles; every mode must give the same tokens.

Figures, per pipeline and mode:

* **latency** (benchmark record ``pipelines[<p>-float32-<mode>]``): wall clock of one whole pipeline run,
  ending with a device synchronisation, after warm-up; median and IQR over repeats, the two modes
  interleaved round by round (order alternating). No L2 flush: this is end to end. The ``skip_copy``
  record also has ``speed_vs_copy`` (per-round copy time / skip time; > 1: skip-copy is faster).
  ``runtime_*_bytes``: the sum of ``execute_stats`` over one run (exact counts: spread 0).
* **PCIe bytes** (traffic record ``pipelines[<p>-float32-<mode>-pcie]``): NVML's counters
  (``harness.nvml_traffic.TrafficMeter``: drift-subtracted, calibrated payload estimates). A run moves only
  KBs, below NVML's noise, so K back-to-back runs are measured in one window and the totals divided by K;
  K is chosen so the runtime-counted bytes of the ``copy`` mode reach 64 MiB (16 MiB with ``--quick``) or
  the window reaches 10 s (2 s); both modes use the same K. ``nvml_*_bytes`` are per run with the
  window's noise / K as spread; ``valid`` and the meter's reason are in the conditions and the metric
  notes. ``*_agreement`` = NVML payload / runtime count (1.0 = every byte the runtime reports and no
  other). NVML also sees what the runtime does not count: the loop's own torch copies (the next token,
  ``[B, 1]`` int64 per step, to the host in ``skip_copy`` mode), kernel launch and synchronisation
  traffic. So agreement is expected a little above 1 in ``copy`` mode and far above it where the
  runtime counts almost nothing.
* **saved** (traffic records ``pipelines[<p>-float32-skip_copy_saving]`` and ``...-placed_saving]``):
  device→host and host→device bytes per run, ``copy`` minus the mode, from the runtime counters and from
  NVML, and their agreement (NVML saving / runtime saving); the runtime's saving per method is in the
  conditions. The pipeline loop does different work per mode (with outputs kept, its token handling runs
  as GPU kernels, whose launches NVML counts host→device), which is no saving of the backend's: so each
  mode's loop is also measured alone — one run's outputs recorded, then K runs of the loop replayed on them
  with no backend in it — and the NVML savings are net of it (``loop_bytes_per_run`` in the conditions).
  On the H100 before this (827b974), the LLM's whole-run host→device agreement was 0.868 / 0.875.
* **saved per method** (``...-<mode>_saving-<method>]``, param ``method``): each method executed alone, K
  times per mode in its own NVML window, on the inputs the pipeline gives it in that mode: the loop's
  traffic is not in these, so they are the figures to judge the meter by. Where a saving is under
  ``RESOLUTION_FACTOR`` (10) × the difference's noise, the agreement says "below the meter's resolution"
  with that resolution instead of a ratio. A saving of a few kB is largely the fixed cost of each copy
  (its commands and completion cross PCIe too: on the H100, export time saved 11-16 % more than the
  payload), so each per-method record also holds NVML to the payload plus the copies saved × what one
  small pinned copy moves beyond its payload, measured in the same run
  (``*_saved_expected_nvml``, ``*_saved_agreement_per_copy``). The whole-run records do the same with the
  copies one run saved (host tensors into and out of every execute, counted by the recording backend).
  On the H100 (c4b4f79) every per-method per-copy agreement was 0.982-1.017.

An agreement ratio's ``better`` is ``near-1``: neither direction is better, closeness to 1 is (the
dashboard says so, and a change is reported, never gated as slower).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from conformance.benchmarks import BACKEND_MODES, BenchPipeline, bench_pipelines
from conformance.benchmarks.pipeline_records import (
    DTYPE_NAME,
    PLACED_OPTIONS,
    SUITE,
    PerCopy,
    RunBytes,
    latency_record,
    pcie_record,
    runtime_bytes,
    saving_record,
)
from conformance.common.pcie_checks import PerRunTraffic, choose_runs
from conformance.protocol import SKIP_COPY_OPTION, part_attributes
from harness.bench import BenchContext, Suite
from harness.gpu_state import capture_gpu_state
from harness.records import BenchRecord, Metric
from harness.timing import Measurement, interleaved_order, paired_ratio, run_adaptive, warm_up

if TYPE_CHECKING:
    from harness.nvml_traffic import TrafficMeter

MODES = BACKEND_MODES

NVML_TARGET_BYTES = 64 << 20
NVML_TIME_CAP_S = 10.0
QUICK_NVML_TARGET_BYTES = 16 << 20
QUICK_NVML_TIME_CAP_S = 2.0

# Protocol parts are all-or-nothing, as for the chapters.
NEEDS = part_attributes("lowering", "runtime")


#: The two home-made pipelines (the ``models`` suite runs every pipeline model, Hugging Face ones too).
PIPELINES: tuple[BenchPipeline, ...] = tuple(p for p in bench_pipelines() if p.model in ("asr", "llm"))


# ---------------------------------------------------------------------------------------------- GPU parts


def measure_copy_overheads(
    meter: TrafficMeter, device_index: int, size: int = 4096, copies: int = 2000
) -> tuple[dict[str, dict[str, float | None]] | None, str | None]:
    """NVML bytes one ``size``-byte pinned copy moves beyond its payload, per copy kind and direction:
    ``copies`` copies each way, one synchronisation after each (as the method windows do)."""
    import torch

    if not meter.supported:
        return None, meter.reason or "meter unavailable"
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", device_index))
    pairs = {"h2d_copy": (dev, host), "d2h_copy": (host, dev)}
    found: dict[str, dict[str, float | None]] = {}
    for kind, (dst, src) in pairs.items():

        def window(dst: Any = dst, src: Any = src) -> None:
            for _ in range(copies):
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(device_index)

        traffic = PerRunTraffic.from_measurement(meter.measure(window), copies)
        if not traffic.valid or traffic.h2d is None or traffic.d2h is None:
            return None, f"per-copy cost not measured: {traffic.why_missing}"
        payload = {"h2d": size if kind == "h2d_copy" else 0, "d2h": size if kind == "d2h_copy" else 0}
        found[kind] = {"h2d": traffic.h2d - payload["h2d"], "d2h": traffic.d2h - payload["d2h"]}
    return found, None


def host_tensors(tensors: Sequence[Any]) -> int:
    """How many of ``tensors`` live on the host: each is one copy across PCIe for a CUDA program."""
    return sum(1 for t in tensors if getattr(t, "device", None) is not None and t.device.type == "cpu")


@dataclass
class _Prepared:
    spec: BenchPipeline
    handles: dict[str, list[object]]
    """mode → the handles it runs (``copy`` and ``skip_copy`` share one program's)."""
    inputs: dict[str, Any]
    """mode → the pipeline's input: on the host, or on the device for ``placed``."""
    models: dict[str, Any] = field(default_factory=dict)
    """mode → the ``LoweredModel`` its handles run (the per-method windows execute its example inputs)."""
    counted: dict[str, RunBytes] = field(default_factory=dict)

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(m for m in MODES if m in self.handles)

    def run(self, backend: Any, mode: str, stats: Any = None) -> Any:
        return self.spec.run(backend, self.handles[mode], self.inputs[mode], stats)


def _run_in_mode(ctx: BenchContext, prepared: _Prepared, mode: str, stats: Any = None) -> Any:
    from conformance.common.programs import option

    with option(ctx.backend, SKIP_COPY_OPTION, prepared.spec.option_value(mode)):
        return prepared.run(ctx.backend, mode, stats)


def _time_modes(ctx: BenchContext, prepared: _Prepared) -> dict[str, Measurement]:
    """Wall time per run of each mode, interleaved; the option is set outside the timed window."""
    import torch

    from conformance.common.programs import option

    backend, spec, device = ctx.backend, prepared.spec, ctx.device_index
    modes = prepared.modes

    def take_batch(round_index: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {mode: [] for mode in modes}
        for i in range(ctx.policy.batch):
            for mode in interleaved_order(modes, round_index * ctx.policy.batch + i):
                with option(backend, SKIP_COPY_OPTION, spec.option_value(mode)):
                    start = time.perf_counter()
                    prepared.run(backend, mode)
                    torch.cuda.synchronize(device)
                    out[mode].append(time.perf_counter() - start)
        return out

    for mode in modes:
        with option(backend, SKIP_COPY_OPTION, spec.option_value(mode)):
            warm_up([lambda mode=mode: prepared.run(backend, mode)], device, min_calls=3, min_s=0.1)
    results = run_adaptive(take_batch, ctx.policy, unit="s")
    conditions = capture_gpu_state(device).to_conditions()
    return {mode: replace(m, conditions=conditions) for mode, m in results.items()}


class _Recorder:
    """The backend, with every execute's outputs kept in call order (what one run handed its loop) and
    the host tensors each execute took and gave (each one a copy across PCIe for a CUDA program)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.outputs: list[list[Any]] = []
        self.copies = {"h2d_copy": 0, "d2h_copy": 0}

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> list[Any]:
        result = list(self._backend.execute(handle, inputs))
        self.outputs.append(result)
        self.copies["h2d_copy"] += host_tensors(inputs)
        self.copies["d2h_copy"] += host_tensors(result)
        return result

    def execute_stats(self, handle: object) -> dict[str, int]:
        return dict(self._backend.execute_stats(handle))


class _Replay:
    """Stands in for the backend in the greedy loop: hands back one recorded run's outputs, in call order,
    and moves nothing itself. A window of replays holds only the loop's own traffic (its token copies,
    its kernels' launches), the same in kind as in the real run, because it gets the same tensors where the
    real run had them."""

    def __init__(self, outputs: Sequence[list[Any]]) -> None:
        self._outputs = list(outputs)
        self._next = 0

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> list[Any]:
        result = self._outputs[self._next % len(self._outputs)]
        self._next += 1
        return list(result)

    def execute_stats(self, handle: object) -> dict[str, int]:
        return {"h2d_bytes": 0, "d2h_bytes": 0}


def _record_run(ctx: BenchContext, prepared: _Prepared, mode: str) -> _Recorder:
    """One run of the pipeline in ``mode`` through a ``_Recorder``."""
    from conformance.common.programs import option

    recorder = _Recorder(ctx.backend)
    with option(ctx.backend, SKIP_COPY_OPTION, prepared.spec.option_value(mode)):
        prepared.run(recorder, mode)
    return recorder


def _measure_loop_nvml(
    meter: TrafficMeter, prepared: _Prepared, mode: str, runs: int, recorded: _Recorder
) -> PerRunTraffic:
    """NVML bytes per run of the pipeline's loop alone in ``mode``: ``runs`` replays of one recorded run."""
    if not meter.supported:
        return PerRunTraffic.unsupported(meter.reason or "meter unavailable")
    replay = _Replay(recorded.outputs)

    def window() -> None:
        for _ in range(runs):
            prepared.run(replay, mode)

    return PerRunTraffic.from_measurement(meter.measure(window), runs)


def _measure_nvml(
    ctx: BenchContext, meter: TrafficMeter, prepared: _Prepared, mode: str, runs: int
) -> PerRunTraffic:
    if not meter.supported:
        return PerRunTraffic.unsupported(meter.reason or "meter unavailable")

    def window() -> None:
        from conformance.common.programs import option

        with option(ctx.backend, SKIP_COPY_OPTION, prepared.spec.option_value(mode)):
            for _ in range(runs):
                prepared.run(ctx.backend, mode)

    return PerRunTraffic.from_measurement(meter.measure(window), runs)


def _prepare(ctx: BenchContext, spec: BenchPipeline, stack: Any) -> _Prepared:
    import torch

    from conformance.common.programs import handles, lowered
    from conformance.protocol import missing_attributes

    dtype = getattr(torch, DTYPE_NAME)
    model = lowered(ctx.backend, spec.model, dtype, "cuda")
    made = stack.enter_context(handles(ctx.backend, model.program, *spec.methods))
    host_input = model.eager[spec.methods[0]][1][0].detach().cpu()
    prepared = _Prepared(
        spec,
        {"copy": made, "skip_copy": made},
        {"copy": host_input, "skip_copy": host_input},
        {"copy": model, "skip_copy": model},
    )
    lacking = missing_attributes(ctx.backend, "device_placement")
    if lacking:
        ctx.log(f"  {spec.name}: mode 'placed' skipped: the backend lacks {lacking}")
        return prepared
    placed = lowered(ctx.backend, spec.model, dtype, "cuda", PLACED_OPTIONS)
    prepared.handles["placed"] = stack.enter_context(handles(ctx.backend, placed.program, *spec.methods))
    prepared.inputs["placed"] = host_input.to(torch.device("cuda", ctx.device_index))
    prepared.models["placed"] = placed
    return prepared


def _method_calls(ctx: BenchContext, p: _Prepared, mode: str) -> dict[str, tuple[object, list[Any]]]:
    """method → (handle, inputs) as ``mode`` passes them: each method executed once, in order, on the
    example inputs (on the device for ``placed``), chained as the pipeline chains them."""
    from conformance.common.method_runs import run_methods
    from conformance.common.programs import option

    lm = p.models[mode]
    device_inputs = set(lm.methods) if mode == "placed" else set()
    with option(ctx.backend, SKIP_COPY_OPTION, p.spec.option_value(mode)):
        runs = run_methods(ctx.backend, lm, p.handles[mode], device_inputs=device_inputs)
    return {method: (run.handle, run.inputs) for method, run in runs.items()}


def _per_method_savings(
    ctx: BenchContext,
    meter: TrafficMeter,
    p: _Prepared,
    target: int,
    cap_s: float,
    overheads: tuple[dict[str, dict[str, float | None]] | None, str | None],
) -> None:
    """Per method: K executes of that method alone per mode in one NVML window each, so what the pipeline
    loop itself moves (tokens, its own kernels' launches) is not in the figures; savings vs ``copy``."""
    import torch

    from conformance.common.programs import option

    calls = {mode: _method_calls(ctx, p, mode) for mode in p.modes}
    for method in p.spec.methods:
        counted: dict[str, RunBytes] = {}
        copies: dict[str, dict[str, int]] = {}
        for mode in p.modes:
            handle, inputs = calls[mode][method]
            with option(ctx.backend, SKIP_COPY_OPTION, p.spec.option_value(mode)):
                outputs = ctx.backend.execute(handle, inputs)
            counted[mode] = runtime_bytes([(method, dict(ctx.backend.execute_stats(handle)))])
            copies[mode] = {"h2d_copy": host_tensors(inputs), "d2h_copy": host_tensors(outputs)}
        start = time.perf_counter()
        handle, inputs = calls["copy"][method]
        ctx.backend.execute(handle, inputs)
        torch.cuda.synchronize(ctx.device_index)
        per_execute_s = time.perf_counter() - start
        runs, _ = choose_runs(counted["copy"].h2d + counted["copy"].d2h, per_execute_s, target, cap_s)

        def window(mode: str, method: str = method, runs: int = runs) -> None:
            handle, inputs = calls[mode][method]
            with option(ctx.backend, SKIP_COPY_OPTION, p.spec.option_value(mode)):
                for _ in range(runs):
                    ctx.backend.execute(handle, inputs)
                    # Every mode alike: a device-resident execute never waits, and a full launch queue
                    # starves the meter's polling thread (windows rejected for missed polls).
                    torch.cuda.synchronize(ctx.device_index)

        traffic: dict[str, PerRunTraffic] = {}
        for mode in p.modes:
            if not meter.supported:
                traffic[mode] = PerRunTraffic.unsupported(meter.reason or "meter unavailable")
                continue
            measured = meter.measure(lambda mode=mode: window(mode))
            traffic[mode] = PerRunTraffic.from_measurement(measured, runs)
        for mode in p.modes[1:]:
            saved = {kind: copies["copy"][kind] - copies[mode][kind] for kind in ("h2d_copy", "d2h_copy")}
            per_copy = PerCopy(saved, *overheads)
            record = saving_record(
                p.spec,
                counted["copy"],
                counted[mode],
                traffic["copy"],
                traffic[mode],
                mode,
                method=method,
                per_copy=per_copy,
            )
            ctx.emit(record, "traffic")
            _log_saving(ctx, record)


def run_pipelines(ctx: BenchContext) -> None:
    import contextlib

    import torch

    from harness.nvml_traffic import TrafficMeter

    quick = ctx.quick
    target = QUICK_NVML_TARGET_BYTES if quick else NVML_TARGET_BYTES
    cap_s = QUICK_NVML_TIME_CAP_S if quick else NVML_TIME_CAP_S
    with torch.cuda.device(ctx.device_index), contextlib.ExitStack() as stack:
        prepared = [_prepare(ctx, spec, stack) for spec in PIPELINES]
        # Counted bytes and a correctness check: both modes must produce the same tokens.
        for p in prepared:
            tokens: dict[str, Any] = {}
            for mode in p.modes:
                stats: list[tuple[str, dict[str, int]]] = []
                tokens[mode] = _run_in_mode(ctx, p, mode, stats)
                p.counted[mode] = runtime_bytes(stats)
                if not torch.equal(tokens["copy"], tokens[mode]):
                    ctx.fail(
                        f"{p.spec.name}: mode {mode} changed the tokens: {tokens['copy'].tolist()} vs "
                        f"{tokens[mode].tolist()}"
                    )
        latencies = {p.spec.name: _time_modes(ctx, p) for p in prepared}
        for p in prepared:
            lat = latencies[p.spec.name]
            for mode in p.modes:
                speed = paired_ratio(lat["copy"], lat[mode]) if mode != "copy" else None
                record = latency_record(p.spec, mode, lat[mode], p.counted[mode], speed)
                ctx.emit(record, "benchmark")
                ctx.log(
                    f"  {record.name}: {lat[mode].value * 1e3:.3f} ms ±{100 * lat[mode].relative_spread:.1f}%"
                    f", runtime d2h {p.counted[mode].d2h} B, h2d {p.counted[mode].h2d} B per run"
                )
        with TrafficMeter(ctx.device_index) as meter:
            described = meter.describe()
            for p in prepared:
                lat = latencies[p.spec.name]
                copy_bytes = p.counted["copy"].h2d + p.counted["copy"].d2h
                slowest = max(lat[mode].value for mode in p.modes)
                runs, why = choose_runs(copy_bytes, slowest, target, cap_s)
                traffic = {mode: _measure_nvml(ctx, meter, p, mode, runs) for mode in p.modes}
                recorded = {mode: _record_run(ctx, p, mode) for mode in p.modes}
                loop = {mode: _measure_loop_nvml(meter, p, mode, runs, recorded[mode]) for mode in p.modes}
                overheads = measure_copy_overheads(meter, ctx.device_index)
                for mode in p.modes:
                    ctx.emit(
                        pcie_record(p.spec, mode, traffic[mode], p.counted[mode], why, described), "traffic"
                    )
                # The saving of whole runs, net of the loop's own traffic in each mode: the loop does
                # different work per mode (tokens handled on the GPU or the host), which is not a saving.
                net = {mode: traffic[mode].minus(loop[mode]) for mode in p.modes}
                for mode in p.modes[1:]:
                    copies = recorded["copy"].copies
                    saved = {kind: n - recorded[mode].copies[kind] for kind, n in copies.items()}
                    saving = saving_record(
                        p.spec,
                        p.counted["copy"],
                        p.counted[mode],
                        net["copy"],
                        net[mode],
                        mode,
                        loop=loop,
                        per_copy=PerCopy(saved, *overheads),
                    )
                    ctx.emit(saving, "traffic")
                    _log_saving(ctx, saving)
                _per_method_savings(ctx, meter, p, target, cap_s, overheads)


def _log_saving(ctx: BenchContext, record: BenchRecord) -> None:
    m = record.metrics

    def shown(metric: Metric) -> str:
        if metric.value is None:
            return f"n/a ({metric.note})"
        if metric.unit == "x":
            return f"{metric.value:.3f}x"
        return f"{metric.value:,.0f} B"

    def direction(d: str) -> str:
        text = (
            f"{d} saved runtime {shown(m[f'{d}_saved_runtime'])}, NVML {shown(m[f'{d}_saved_nvml'])}, "
            f"agreement {shown(m[f'{d}_saved_agreement'])}"
        )
        per_copy = m.get(f"{d}_saved_agreement_per_copy")
        return text if per_copy is None else f"{text}, with per-copy costs {shown(per_copy)}"

    ctx.log(f"  {record.name}: {direction('d2h')}; {direction('h2d')}")


SUITES: dict[str, Suite] = {
    SUITE: Suite(
        name=SUITE,
        description=(
            f"ASR ({PIPELINES[0].description}) and LLM ({PIPELINES[1].description}) end to end: latency, "
            "runtime and NVML bytes: copy, runtime skip-copy option, export-time placement"
        ),
        run=run_pipelines,
        needs_backend=NEEDS,
    ),
}
