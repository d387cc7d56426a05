"""Suite ``view_pass``: the slicing-heavy block lowered with and without the view-copy pass.

The zoo's ``slicing_block`` (float32, CUDA) is lowered twice: as the backend always does (``with_pass``:
the same program the conformance chapters use) and with the view-copy pass switched off
(``without_pass``). Both programs run the same device-resident inputs with their outputs kept on the GPU
(option ``skip_copy_output_to_cpu_for_method`` = ``forward``, where the backend has runtime options;
without, the outputs are copied out and the conditions say so), so the figures are the method's own.
On a machine without CUDA the suite lowers for the CPU instead and times each execute on the host clock
(no device memory or DRAM figures there).

Switching the pass off is not part of the protocol's ``lower(methods, *, device)``. A backend that wants
this suite accepts an ``options`` keyword: ``lower(methods, *, device, options={"view_pass": False})``
(checked with ``inspect.signature``; an explicit ``options`` parameter, not ``**kwargs``). Without it the
suite measures what it can (latency with the pass, the rewrite count), records the ``without_pass``
figures as missing with the reason, and the case is skipped as unsupported for that backend.

Figures (benchmark record ``view_pass[slicing_block-float32]``):

* ``time_with_pass`` / ``time_without_pass``: one ``execute`` each, timed with CUDA events on the
  caller's stream (L2 flushed before every sample, warm-up first), the two programs interleaved round by
  round; median and IQR. ``execute`` is blocking, so the time includes the runtime's launch work.
* ``speed_from_pass``: per-round time without / time with (> 1: the pass made it faster).
* ``rewrites`` / ``copies``: how many ``*_copy`` nodes of the block's edge graph the backend's
  ``view_copy_pass`` (protocol part ``view_pass``) turned into views, of how many that have a view twin.
  The edge graph is the suite's own (``conformance.common.edge_form.edge_graph``) — the form every
  backend's pass is held to — not necessarily the exact graph the backend's ``lower`` builds.
* ``peak_memory_with_pass`` / ``..._without_pass``: device bytes one ``execute`` allocates at its peak
  beyond what was allocated before it (torch's caching-allocator statistics, which AOTInductor code
  allocates through): the materialised copies the pass turns into views are what it saves. The same on
  every call, so the spread is the range over 3 calls.
* ``dram_bw_util_with_pass`` / ``..._without_pass`` (only where NVML GPM works: Hopper or newer, no
  MIG): DRAM bandwidth utilisation in % of peak over a window of back-to-back executes (~0.3 s, no L2
  flush). One reading each, no noise figure; omitted (reason in the conditions) where GPM is unsupported.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from conformance.protocol import SKIP_COPY_OPTION, implements, part_attributes
from harness.bench import BenchContext, Suite, SuiteSkipped
from harness.records import BenchRecord, Metric, case_name
from harness.timing import Measurement, paired_ratio

SUITE = "view_pass"
MODEL = "slicing_block"
DTYPE_NAME = "float32"
METHOD = "forward"
VARIANTS = ("with_pass", "without_pass")
WITHOUT_PASS_OPTIONS: Mapping[str, Any] = {"view_pass": False}
DRAM_WINDOW_S = 0.3
QUICK_DRAM_WINDOW_S = 0.2
# |with − without| / max|with| above this means the two programs do not compute the same thing.
OUTPUT_TOLERANCE = 1e-4

# Protocol parts are all-or-nothing, as for the chapters.
NEEDS = part_attributes("lowering", "runtime")


def lower_accepts_options(backend: object) -> tuple[bool, str]:
    """(True, "") if ``backend.lower`` takes an explicit ``options`` keyword; else (False, why not)."""
    lower = getattr(backend, "lower", None)
    if not callable(lower):
        return False, "the backend has no lower()"
    try:
        signature = inspect.signature(lower)
    except (TypeError, ValueError) as exc:
        return False, f"cannot inspect the backend's lower(): {exc}"
    param = signature.parameters.get("options")
    if param is None or param.kind not in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
        return False, (
            f"the backend's lower{signature} takes no 'options' keyword, so the view-copy pass cannot be "
            "switched off through it (wanted: lower(methods, *, device, options={'view_pass': False}))"
        )
    return True, ""


def count_rewrites(backend: object, dtype: Any) -> tuple[int, int, int] | str:
    """(rewrites, copies, refusals) of the backend's ``view_copy_pass`` on the block's edge graph, or why."""
    if not implements(backend, "view_pass"):
        return "the backend does not implement view_copy_pass (protocol part view_pass)"
    from conformance.common.edge_form import edge_graph, view_twin
    from conformance.models import get_model

    module, inputs = get_model(MODEL).build(dtype, "cpu")[METHOD]
    graph, _ = edge_graph(module, inputs)
    copies = sum(1 for n in graph.graph.nodes if n.op == "call_function" and view_twin(n.target) is not None)
    outcome = backend.view_copy_pass(copy.deepcopy(graph))
    return len(outcome.rewritten), copies, len(outcome.refused)


def view_pass_record(
    with_pass: Measurement,
    without_pass: Measurement | None,
    rewrites: tuple[int, int, int] | str,
    *,
    unsupported: str = "",
    dram: Mapping[str, float | None] | None = None,
    peak_bytes: Mapping[str, list[int]] | None = None,
    conditions: Mapping[str, Any] | None = None,
    device: str = "cuda",
) -> BenchRecord:
    """The suite's record; ``without_pass`` None (``unsupported`` says why) leaves those figures missing.
    The CPU target's record is named apart (``view_pass[slicing_block-float32-cpu]``)."""
    params = {"model": MODEL, "dtype": DTYPE_NAME, **({"device": device} if device != "cuda" else {})}
    metrics: dict[str, Metric] = {"time_with_pass": with_pass.to_metric("lower")}
    if without_pass is None:
        why = unsupported or "not measured"
        metrics["time_without_pass"] = Metric.missing("s", "lower", why)
        metrics["speed_from_pass"] = Metric.missing("x", "higher", why)
    else:
        metrics["time_without_pass"] = without_pass.to_metric("lower")
        metrics["speed_from_pass"] = paired_ratio(without_pass, with_pass).to_metric("higher")
    if isinstance(rewrites, str):
        metrics["rewrites"] = Metric.missing("nodes", "higher", rewrites)
        metrics["copies"] = Metric.missing("nodes", "lower", rewrites)
    else:
        done, copies, _ = rewrites
        metrics["rewrites"] = Metric(unit="nodes", value=done, spread=0.0, better="higher", n=1)
        metrics["copies"] = Metric(unit="nodes", value=copies, spread=0.0, better="lower", n=1)
    for variant, samples in (peak_bytes or {}).items():
        metrics[f"peak_memory_{variant}"] = Metric(
            unit="B", value=max(samples), spread=max(samples) - min(samples), better="lower", n=len(samples)
        )
    for variant, value in (dram or {}).items():
        if value is not None:
            metrics[f"dram_bw_util_{variant}"] = Metric(
                unit="%", value=value, spread=None, better="lower", n=1
            )
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="time_with_pass",
        metrics=metrics,
        conditions={
            **with_pass.conditions,
            **(dict(conditions) if conditions else {}),
            "refusals": None if isinstance(rewrites, str) else rewrites[2],
            "converged": with_pass.converged and (without_pass is None or without_pass.converged),
            "stop_reason": with_pass.stop_reason,
            "timing": (
                "CUDA events around one execute, L2 flushed before each sample"
                if with_pass.conditions.get("timing") is None
                else with_pass.conditions["timing"]
            ),
            "spread": "IQR of per-sample values; speed_from_pass from per-round ratios",
        },
    )


def _max_relative_difference(a: Any, b: Any) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        scale = x.abs().max().float().item() or 1.0
        worst = max(worst, (x.float() - y.float()).abs().max().item() / scale)
    return worst


def _peak_memory(
    fns: Mapping[str, Callable[[], object]], device_index: int, calls: int = 3
) -> dict[str, list[int]]:
    """Per fn, the device bytes each call allocated at its peak beyond what was allocated before it."""
    import torch

    out: dict[str, list[int]] = {}
    for name, fn in fns.items():
        out[name] = []
        for _ in range(calls):
            torch.cuda.synchronize(device_index)
            before = torch.cuda.memory_allocated(device_index)
            torch.cuda.reset_peak_memory_stats(device_index)
            result = fn()
            torch.cuda.synchronize(device_index)
            out[name].append(torch.cuda.max_memory_allocated(device_index) - before)
            del result
    return out


def _dram_utilisation(
    ctx: BenchContext, fns: Mapping[str, Callable[[], object]], seconds_per_call: Mapping[str, float]
) -> tuple[dict[str, float | None], str | None]:
    """GPM DRAM bandwidth utilisation over a window of back-to-back calls of each fn; or why none."""
    import torch

    from harness.gpu_state import NvmlUnavailable, nvml_handle, nvml_session, torch_device_uuid
    from harness.locks import gpu_lock
    from harness.nvml_memory import GpmDramBandwidth

    window = QUICK_DRAM_WINDOW_S if ctx.quick else DRAM_WINDOW_S
    out: dict[str, float | None] = {}
    reason: str | None = None
    try:
        uuid = torch_device_uuid(ctx.device_index)
        with nvml_session() as nvml, gpu_lock(uuid):
            handle = nvml_handle(nvml, uuid)
            for name, fn in fns.items():
                gpm = GpmDramBandwidth(nvml, handle)
                if not gpm.supported:
                    return {}, gpm.reason
                calls = max(1, math.ceil(window / max(seconds_per_call[name], 1e-7)))
                torch.cuda.synchronize(ctx.device_index)
                gpm.begin()
                start = time.perf_counter()
                while True:
                    for _ in range(calls):
                        fn()
                    torch.cuda.synchronize(ctx.device_index)
                    if time.perf_counter() - start >= window:
                        break
                out[name] = gpm.end()
                if out[name] is None:
                    reason = gpm.reason
    except NvmlUnavailable as exc:
        return {}, str(exc)
    return out, reason


def _keeping_outputs(ctx: BenchContext) -> tuple[contextlib.AbstractContextManager[object], str]:
    """(the block that keeps ``forward``'s outputs where they were computed, what it means): on a GPU, the
    runtime option where the backend has it; otherwise the outputs are what execute returns."""
    from conformance.common.parts import skip_reason
    from conformance.common.programs import option

    if ctx.device != "cuda":
        return contextlib.nullcontext(), "CPU target: outputs are host tensors, nothing to copy"
    if skip_reason(ctx.backend, "runtime_options"):
        return contextlib.nullcontext(), "copied to the host: the backend has no runtime option to keep them"
    return option(ctx.backend, SKIP_COPY_OPTION, METHOD), "kept on the GPU (runtime skip-copy option)"


def run_view_pass(ctx: BenchContext) -> None:
    import torch

    from conformance.common.programs import handles, lowered
    from conformance.models import get_model
    from harness.timing import time_cuda_interleaved, time_host_interleaved

    dtype = getattr(torch, DTYPE_NAME)
    rewrites = count_rewrites(ctx.backend, dtype)
    accepts, unsupported = lower_accepts_options(ctx.backend)
    on_gpu = ctx.device == "cuda"
    keep, outputs_where = _keeping_outputs(ctx)
    with torch.cuda.device(ctx.device_index) if on_gpu else contextlib.nullcontext():
        model = lowered(ctx.backend, MODEL, dtype, ctx.device)
        programs = {"with_pass": model.program}
        sizes = {"with_pass": len(model.program)}
        lower_s: dict[str, float] = {}
        if accepts:
            entry = get_model(MODEL)
            spec = {n: (mod, ins, entry.dynamic_shapes_for(n)) for n, (mod, ins) in model.eager.items()}
            start = time.perf_counter()
            programs["without_pass"] = ctx.backend.lower(
                spec, device=ctx.device, options=dict(WITHOUT_PASS_OPTIONS)
            )
            lower_s["without_pass"] = time.perf_counter() - start
            sizes["without_pass"] = len(programs["without_pass"])
        inputs = list(model.eager[METHOD][1])
        names = list(programs)
        with keep, contextlib.ExitStack() as stack:
            made = {
                name: stack.enter_context(handles(ctx.backend, programs[name], METHOD))[0] for name in names
            }
            fns = {name: (lambda h=made[name]: ctx.backend.execute(h, inputs)) for name in names}
            outputs = {name: fn() for name, fn in fns.items()}
            if "without_pass" in outputs:
                diff = _max_relative_difference(outputs["with_pass"], outputs["without_pass"])
                if diff > OUTPUT_TOLERANCE:
                    ctx.fail(
                        f"{MODEL}: outputs with and without the view-copy pass differ: max relative "
                        f"difference {diff:.2e} > {OUTPUT_TOLERANCE}"
                    )
            if on_gpu:
                timed = time_cuda_interleaved(fns, ctx.device_index, ctx.policy)
                peak_bytes = _peak_memory(fns, ctx.device_index)
                dram, dram_reason = _dram_utilisation(ctx, fns, {name: m.value for name, m in timed.items()})
            else:  # a CPU target: wall clock per call; device memory and DRAM counters do not apply
                timed, peak_bytes = time_host_interleaved(fns, ctx.policy), {}
                dram, dram_reason = {}, "CPU target: no GPU counters"
    record = view_pass_record(
        timed["with_pass"],
        timed.get("without_pass"),
        rewrites,
        unsupported=f"unsupported by backend {ctx.backend_spec!r}: {unsupported}" if not accepts else "",
        dram=dram,
        peak_bytes=peak_bytes,
        conditions={
            "program_bytes": sizes,
            "programs_identical": None if not accepts else programs["with_pass"] == programs["without_pass"],
            "lower_without_pass_s": lower_s.get("without_pass"),
            "without_pass_options": dict(WITHOUT_PASS_OPTIONS),
            "dram_bw_reason": dram_reason,
            "outputs": outputs_where,
        },
        device=ctx.device,
    )
    ctx.emit(record, "benchmark")
    _log(ctx, record)
    if not accepts:
        raise SuiteSkipped(
            f"unsupported for backend {ctx.backend_spec!r}: {unsupported}; recorded the with-pass latency "
            "and the rewrite count only"
        )


def _log(ctx: BenchContext, record: BenchRecord) -> None:
    from harness.formatting import show_quantity

    def shown(key: str) -> str:
        metric = record.metrics.get(key)
        if metric is None:
            return "omitted"
        if metric.value is None:
            return "n/a"
        return f"{metric.value:g}" if metric.unit == "nodes" else show_quantity(metric.value, metric.unit)

    def pair(words: str, key: str, why: str) -> str:
        """``words with/without A/B``, or why the pair was not measured (never ``omitted/omitted``)."""
        both = (f"{key}_with_pass", f"{key}_without_pass")
        if all(name not in record.metrics for name in both):
            return f"{words}: not measured ({why})"
        return f"{words} with/without {shown(both[0])}/{shown(both[1])}"

    on_cpu = "CPU target: no device memory" if record.params.get("device") == "cpu" else "not recorded"
    dram_why = str(record.conditions.get("dram_bw_reason") or "no reason recorded")
    ctx.log(
        f"  {record.name}: with pass {shown('time_with_pass')}, without {shown('time_without_pass')}, "
        f"speed from pass {shown('speed_from_pass')}, rewrites {shown('rewrites')}/{shown('copies')}, "
        f"{pair('peak memory', 'peak_memory', on_cpu)}, {pair('DRAM util', 'dram_bw_util', dram_why)}"
    )


SUITES: dict[str, Suite] = {
    SUITE: Suite(
        name=SUITE,
        description=(
            "slicing_block lowered with and without the view-copy pass: execute latency, rewrites, "
            "peak device memory per execute, DRAM utilisation (GPM) where supported"
        ),
        run=run_view_pass,
        needs_cuda=False,
        needs_backend=NEEDS,
    ),
}
