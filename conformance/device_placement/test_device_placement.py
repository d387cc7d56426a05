"""Chapter device_placement — export-time device placement of method inputs and outputs (SPEC §0, §1b;
protocol parts ``device_placement`` and ``runtime``).

Upstream ExecuTorch retired the runtime option ``skip_copy_output_to_cpu_for_method`` in June 2026 (#20239):
where a method's inputs and outputs live is now chosen when the program is built, per method, with
``skip_h2d_for_method_inputs`` and ``skip_d2h_for_method_outputs`` (upstream's ``PropagateDeviceConfig``;
each a bool or ``{method: bool}``). The protocol passes them as ``lower(..., options={...})``. Every check
names its rule, ``device_placement/<rule>``:

* **validation** (any machine): an unknown method name, a non-bool value or a value of the wrong shape is
  a ``ValueError`` naming the key and the rule; a method fixed to host outputs that the runtime option
  names is a conflict (backends with part ``runtime_options``).
* **matrix** (CUDA): configurations × the multi-method models (``asr``, ``llm`` and, with
  ``transformers``, ``hf_whisper``, ``hf_llm``: ``conformance.common.pipelines.PIPELINE_MODELS``) × dtypes.
  Each method runs once, chained as in real use; a method with device inputs gets device tensors from its
  caller. Held to: where outputs live, values against eager float64, ``execute_stats`` (0 host→device
  bytes for device inputs, 0 device→host bytes for kept outputs), and the torch profiler (no ``Memcpy
  HtoD`` / ``DtoH`` for them; every copy that is made goes through pinned memory — rule
  ``runtime_options/pinned-host-memory``).
* **pipelines** (CUDA): ASR (encoder → decoder) and LLM (prefill → decode with its KV cache) with every
  input and output on the device end to end: tokens equal eager, and no execute moves a byte.
* **PCIe** (CUDA, NVML; runs with the GPU to itself): both mechanisms, ``asr`` and ``llm`` float32, each
  method executed K times per NVML window with its tensors on the host and kept on the device: the bytes
  NVML saw cross PCIe drop by at least 90 % of what the kept tensors hold, less 3 x the noise
  (``device_placement/skip-copy-pcie``, ``device_placement/pcie``; ``conformance.common.pcie_checks``), or
  the case says the saving is below the meter's resolution, with that resolution.
* **zoo** (CUDA): every other zoo model lowered with every input and output on the device.
* **bad inputs** (CUDA): a host tensor, a tensor on another GPU, a wrong dtype for a device-input method
  are ``ValueError``s naming the input, and nothing changes (the inputs, the byte counters, later results).
* **CPU target**: the device is the host, so placement is accepted and changes nothing.

Programs lowered: on CUDA, each multi-method model × 3 dtypes × the matrix's configurations (a backend that
caches compiled artifacts by content, as the reference does, compiles each model and dtype once); on the
CPU, ``llm`` (and ``hf_llm``) float32 once. The validation cases use the zoo's ``add`` as two methods, and
lower it only where a backend accepts the bad option.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import pytest
import torch

from conformance.common import contract_monitor
from conformance.common.checks import assert_raises_invalid_argument, bits, fail, snapshot
from conformance.common.declared_rules import params
from conformance.common.method_runs import (
    MODEL_METHODS,
    NO_H2D_COPY,
    PINNED_HOST_MEMORY,
    PLACEMENT,
    MethodRun,
    WhereRules,
    check_cpu_target,
    check_device_inputs_not_copied,
    check_output_copies,
    check_pinned_copies,
    check_where_data_went,
    cuda_device,
    host_nbytes,
    profiled_copies,
    run_methods,
)
from conformance.common.parts import PlacementRuntimeBackend, part_fixture, require_part
from conformance.common.pcie_checks import (
    COMMAND_ALLOWANCE,
    COMMAND_FACTOR,
    RESOLUTION_FACTOR,
    PerRunTraffic,
    Saving,
    check_savings,
    choose_runs,
    difference,
    worth_measuring,
)
from conformance.common.pipelines import CallStats, pipeline_params, run_greedy
from conformance.common.programs import (
    LOWER,
    SKIP_COPY_OPTION,
    handles,
    lower_or_fail,
    option,
    record,
    require_lowering_device,
)
from conformance.common.rules import rule_id
from conformance.common.session import BACKEND_KEY, cuda_device_count
from conformance.common.token_oracle import STEPS, TOKENS, check_tokens, eager_tokens
from conformance.common.tolerances import DTYPES_BY_NAME
from conformance.models import HF_MODELS, HF_UNAVAILABLE, ZOO
from conformance.protocol import (
    SKIP_D2H,
    SKIP_H2D,
    Backend,
    DevicePlacementBackend,
    RuntimeBackend,
    lowering_devices,
)
from harness import start_gate

if TYPE_CHECKING:
    from harness.nvml_traffic import TrafficMeter

DTYPES = list(DTYPES_BY_NAME)
Options = dict[str, object]

VALIDATION = rule_id("device_placement/validation")
CONFLICT = rule_id("device_placement/conflict")
PIPELINE = rule_id("device_placement/pipeline")
BAD_INPUT = rule_id("device_placement/bad-input")


# Cases annotate them ``PlacementRuntimeBackend`` and ``DevicePlacementBackend``.
placing = part_fixture(
    "device_placement",
    "runtime",
    doc="A backend with export-time placement and a runtime to run what it lowers.",
)
placement = part_fixture(
    "device_placement", doc="A backend with export-time placement (the options' validation needs no runtime)."
)


def covered(options: Mapping[str, object], key: str, method: str) -> bool:
    """Whether flag ``key`` of ``options`` is True for ``method`` (bool: every method; mapping: by name)."""
    value = options.get(key, False)
    return bool(value.get(method, False)) if isinstance(value, Mapping) else bool(value)


# ============================================================================================ validation

#: label → (value, words of which the error must contain one). Lowered: ``two_methods`` (prefill + decode).
BAD_VALUES: dict[str, tuple[object, tuple[str, ...]]] = {
    "unknown-method": ({"decoder": True}, ("unknown", "not a method", "no method", "no such", "not found")),
    "misspelt-case": ({"Decode": True}, ("unknown", "not a method", "no method", "no such", "not found")),
    "int-in-mapping": ({"decode": 1}, ("bool",)),
    "none-in-mapping": ({"decode": None}, ("bool",)),
    "str": ("true", ("bool",)),
    "int": (1, ("bool",)),
    "list": (["decode"], ("bool",)),
}


def validation_device(backend: Backend) -> str:
    """The cheapest target to validate against: the CPU where the backend lowers for it, else CUDA."""
    for device in ("cpu", "cuda"):
        if device in lowering_devices(backend) and (device == "cpu" or cuda_device_count()):
            return device
    pytest.skip(f"backend {backend.name!r} lowers only for {lowering_devices(backend)} and no GPU is present")
    raise AssertionError("unreachable")


def two_methods(device: str) -> dict[str, tuple]:
    """A two-method program any backend should lower quickly: the zoo's ``add`` as ``prefill`` and
    ``decode`` (the validation cases are about the options, so the model must not be what fails)."""
    from conformance.models import get_model

    module, inputs = get_model("add").build(torch.float32, torch.device(device))["forward"]
    return {"prefill": (module, inputs), "decode": (copy.deepcopy(module), inputs)}


@pytest.mark.rules(VALIDATION)
@pytest.mark.parametrize("key", [SKIP_H2D, SKIP_D2H])
@pytest.mark.parametrize("label", list(BAD_VALUES))
def test_placement_options_are_validated(placement: DevicePlacementBackend, key: str, label: str) -> None:
    """device_placement/validation: an unknown method name (case-sensitive) or a non-bool value is an
    invalid-argument error naming the key and the rule (a misspelt method would silently keep the copy)."""
    backend = placement
    device = validation_device(backend)
    value, words = BAD_VALUES[label]
    assert_raises_invalid_argument(
        VALIDATION,
        f"lower(prefill + decode, device={device!r}, options={{{key!r}: {value!r}}})",
        lambda: backend.lower(two_methods(device), device=device, options={key: value}),
        argument=key,
        keywords=words,
    )


@pytest.mark.rules(CONFLICT)
def test_placement_conflicting_with_the_runtime_option_is_rejected(placement: DevicePlacementBackend) -> None:
    """device_placement/conflict: lowering ``decode`` with host outputs while the runtime option names it is
    an invalid-argument error naming both keys (export-time placement wins; the user must drop one)."""
    backend = placement
    require_part(backend, "runtime_options")
    device = validation_device(backend)
    options = {SKIP_D2H: {"decode": False}}
    with option(backend, SKIP_COPY_OPTION, "decode"):
        assert_raises_invalid_argument(
            CONFLICT,
            f"lower(prefill + decode, options={options!r}) with {SKIP_COPY_OPTION}='decode'",
            lambda: backend.lower(two_methods(device), device=device, options=options),
            argument=SKIP_D2H,
            keywords=(SKIP_COPY_OPTION,),
        )


# ================================================================================================ matrix


def configurations(first: str, second: str) -> dict[str, Options]:
    return {
        "outputs-first": {SKIP_D2H: {first: True}},
        "chain": {SKIP_D2H: {first: True}, SKIP_H2D: {second: True}},
        "inputs-all": {SKIP_H2D: True},
        "device-end-to-end": {SKIP_H2D: True, SKIP_D2H: True},
        "explicit-host": {SKIP_H2D: False, SKIP_D2H: False},
    }


MATRIX = [
    pytest.param(model, label, opts, id=f"{model}-{label}")
    for model, (first, second) in MODEL_METHODS.items()
    for label, opts in configurations(first, second).items()
]
if HF_UNAVAILABLE is not None:  # the Hugging Face pipeline models: one skipped case each, with the reason
    MATRIX += [
        pytest.param(name, "all", {}, id=f"{name}-all", marks=pytest.mark.skip(reason=HF_UNAVAILABLE))
        for name in HF_MODELS
    ]


@pytest.mark.rules(LOWER, PINNED_HOST_MEMORY, NO_H2D_COPY, *PLACEMENT.on_cuda)
@pytest.mark.gpu
@pytest.mark.parametrize(("model", "label", "options"), MATRIX)
@pytest.mark.parametrize("dtype", DTYPES)
def test_placement_matrix(
    placing: PlacementRuntimeBackend, dtype: str, model: str, label: str, options: Options
) -> None:
    """device_placement/*: a method lowered with ``skip_d2h`` returns CUDA tensors and moves no byte
    device→host; one lowered with ``skip_h2d`` takes device inputs and moves no byte host→device (counters and
    profiler); every other copy goes through pinned memory; values match float64 eager."""
    backend = placing
    lm = lower_or_fail(backend, model, dtype, "cuda", options)
    device_in = {m for m in lm.methods if covered(options, SKIP_H2D, m)}
    with handles(backend, lm.program, *lm.methods) as made:
        runs = run_methods(backend, lm, made, device_inputs=device_in)
        for method, run in runs.items():
            call = f"execute({model}.{method}, {dtype}) lowered with {options}"
            keep = covered(options, SKIP_D2H, method)
            check_where_data_went(PLACEMENT, call, lm, run, keep, method in device_in)
            check_profiled(PLACEMENT, backend, call, run, keep, method in device_in)


def check_profiled(
    rules: WhereRules, backend: RuntimeBackend, call: str, run: MethodRun, keep: bool, device_in: bool
) -> None:
    """The execute again under the profiler: output copies as placed, no host→device copy of device
    inputs, and every copy through pinned memory."""
    copies = profiled_copies(backend, run, outputs_copied=not keep)
    check_output_copies(rules, call, copies, keep)
    if device_in:
        check_device_inputs_not_copied(call, copies)
    check_pinned_copies(call, copies)


# ============================================================================================== pipelines

END_TO_END: Options = {SKIP_H2D: True, SKIP_D2H: True}


@pytest.mark.rules(LOWER, PIPELINE, TOKENS)
@pytest.mark.gpu
@pytest.mark.parametrize("model", pipeline_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_pipeline_stays_on_the_device(
    placing: PlacementRuntimeBackend, dtype: str, model: str, request: pytest.FixtureRequest
) -> None:
    """device_placement/pipeline: with every input and output on the device, the ASR encoder's output feeds
    the decoder and the LLM's KV cache goes from prefill through every decode step without a host round trip:
    each execute moves 0 bytes either way, and the tokens equal eager PyTorch's (float32 exactly)."""
    backend = placing
    lm = lower_or_fail(backend, model, dtype, "cuda", END_TO_END)
    first = lm.eager[MODEL_METHODS[model][0]][1][0].detach().to(cuda_device())
    call = f"{model} pipeline ({dtype}) lowered with {END_TO_END}"
    stats: CallStats = []
    with handles(backend, lm.program, *lm.methods) as made:
        got = run_greedy(backend, model, made[0], made[1], first, STEPS[model], stats)
    moved = [(m, s) for m, s in stats if s.get("h2d_bytes") != 0 or s.get("d2h_bytes") != 0]
    record(request, executes=len(stats))
    if moved:
        fail(PIPELINE, call, f"{len(moved)} of {len(stats)} executes moved bytes: {moved[:3]}")
    check_tokens(model, lm, got.cpu(), eager_tokens(model, lm.eager).cpu(), call)


#: Every other zoo model (ASR and LLM run above): one method each, all inputs and outputs on the device.
OTHER_ZOO = [name for name in ZOO if name not in MODEL_METHODS]


@pytest.mark.rules(LOWER, PINNED_HOST_MEMORY, NO_H2D_COPY, *PLACEMENT.on_cuda)
@pytest.mark.gpu
@pytest.mark.parametrize("model", OTHER_ZOO)
@pytest.mark.parametrize("dtype", DTYPES)
def test_zoo_model_device_resident(placing: PlacementRuntimeBackend, dtype: str, model: str) -> None:
    """device_placement/zoo: every zoo model lowered with every input and output on the device returns CUDA
    tensors equal to float64 eager, and moves 0 bytes either way (counters and profiler)."""
    backend = placing
    lm = lower_or_fail(backend, model, dtype, "cuda", END_TO_END)
    with handles(backend, lm.program, *lm.methods) as made:
        runs = run_methods(backend, lm, made, device_inputs=set(lm.methods))
        for method, run in runs.items():
            call = f"execute({model}.{method}, {dtype}) lowered with {END_TO_END}"
            check_where_data_went(PLACEMENT, call, lm, run, keep=True, device_in=True)
            check_profiled(PLACEMENT, backend, call, run, keep=True, device_in=True)


# ============================================================================================= bad inputs


def _bad_input_cases() -> list:
    cases = [pytest.param("host-tensor", id="host-tensor"), pytest.param("wrong-dtype", id="wrong-dtype")]
    cases.append(pytest.param("other-gpu", marks=pytest.mark.multi_gpu, id="other-gpu"))
    return cases


@pytest.mark.rules(LOWER, BAD_INPUT)
@pytest.mark.gpu
@pytest.mark.parametrize("kind", _bad_input_cases())
def test_device_input_method_rejects_wrong_inputs(placing: PlacementRuntimeBackend, kind: str) -> None:
    """device_placement/bad-input: a method lowered with ``skip_h2d`` rejects a host tensor, a tensor on
    another GPU and a wrong dtype with a ``ValueError`` naming the input; the inputs, the byte counters of the
    last execute and later results are unchanged."""
    backend = placing
    lm = lower_or_fail(backend, "llm", "float32", "cuda", {SKIP_H2D: True})
    here = cuda_device()
    good = [t.detach().to(here) for t in lm.eager["prefill"][1]]
    with handles(backend, lm.program, "prefill") as (prefill,):
        reference = [t.cpu() for t in backend.execute(prefill, good)]
        stats_before = dict(backend.execute_stats(prefill))
        bad = list(good)
        if kind == "host-tensor":
            bad[0], keywords = good[0].cpu(), ("device", "cuda")
        elif kind == "wrong-dtype":
            bad[0], keywords = good[0].to(torch.int32), ("dtype", "int64")
        else:
            other = torch.device("cuda", (here.index + 1) % torch.cuda.device_count())
            bad[0], keywords = good[0].to(other), ("device", str(here))
        before = [snapshot(t) for t in bad]
        call = f"execute(llm.prefill) lowered with {SKIP_H2D}=True, inputs[0] {kind}"
        assert_raises_invalid_argument(
            BAD_INPUT,
            call,
            lambda: backend.execute(prefill, bad),
            argument="inputs",
            keywords=keywords,
        )
        if any(not torch.equal(bits(a), bits(b)) for a, b in zip(before, bad, strict=True)):
            fail(BAD_INPUT, call, "the rejected call changed its inputs")
        stats_after = dict(backend.execute_stats(prefill))
        if stats_after != stats_before:
            fail(BAD_INPUT, call, f"execute_stats changed from {stats_before} to {stats_after}")
        again = [t.cpu() for t in backend.execute(prefill, good)]
    if any(not torch.equal(a, b) for a, b in zip(reference, again, strict=True)):
        fail(BAD_INPUT, call, "after the rejected call, the same inputs give different outputs")


# =================================================================================================== PCIe

#: The home-made pipeline models: the same method I/O as the Hugging Face ones, and quicker to run.
PCIE_MODELS = ["asr", "llm"]
#: Per NVML window: executes until the bytes the host mode moves reach this, or the time cap.
PCIE_TARGET_BYTES = 16 << 20
PCIE_TIME_CAP_S = 1.0
PCIE_ATTEMPTS = 2
#: mechanism -> the rule its PCIe check names.
MECHANISMS = {
    "runtime-option": rule_id("device_placement/skip-copy-pcie"),
    "export-time": rule_id("device_placement/pcie"),
}


@start_gate.while_held
def _prepare_pcie_cases(config: pytest.Config) -> None:
    """While the GPU-alone phase waits its turn: each PCIe model lowered both ways (``programs``' memo keeps
    them for the cases) and each method loaded and run once, so that a first case's lowering, loads and
    first kernels are not paid while the GPU is the phase's. Nothing here is measured or judged: every
    call it makes, a case makes again (the contract monitor forgets these at the first case's start)."""
    backend = config.stash[BACKEND_KEY]
    for model in PCIE_MODELS:
        base = lower_or_fail(backend, model, "float32", "cuda")
        lower_or_fail(backend, model, "float32", "cuda", END_TO_END)
        with handles(backend, base.program, *base.methods) as made:
            run_methods(backend, base, made)


@pytest.fixture(scope="module")
def pcie_meter() -> Iterator[TrafficMeter]:
    from harness.nvml_traffic import TrafficMeter

    with TrafficMeter(torch.cuda.current_device()) as meter:
        if not meter.supported:
            pytest.skip(f"PCIe byte counters unsupported here: {meter.reason}")
        if meter.calibration is None:  # the traffic_meter chapter fails this (traffic_meter/calibration)
            pytest.skip(f"the NVML meter is not calibrated ({meter.calibration_reason}): no payload figures")
        yield meter


def _per_execute(meter: TrafficMeter, execute: Callable[[], object], runs: int, call: str) -> PerRunTraffic:
    """NVML payload bytes per execute over a window of ``runs`` executes (an invalid window is retried)."""

    def window() -> None:
        # One synchronisation per execute, in both windows alike: a device-resident method never waits on
        # the host, so without it the launch queue fills, the launching thread blocks holding the GIL and
        # the meter's polling thread misses its deadline (windows rejected for 74-182 ms poll gaps).
        for _ in range(runs):
            execute()
            torch.cuda.synchronize()

    for _ in range(PCIE_ATTEMPTS):
        with contract_monitor.paused():  # its checks are kernels: they would cross PCIe in the window
            measured = meter.measure(window)
        traffic = PerRunTraffic.from_measurement(measured, runs)
        if traffic.valid:
            return traffic
    pytest.skip(f"{call}: the NVML window was invalid {PCIE_ATTEMPTS} times ({traffic.why_missing})")
    raise AssertionError("unreachable")


def _executes(backend: RuntimeBackend, run: MethodRun) -> Callable[[], object]:
    return lambda: backend.execute(run.handle, run.inputs)


@contextlib.contextmanager
def _runtime_option(backend: Backend, methods: str) -> Iterator[None]:
    """The runtime skip-copy option naming ``methods`` for the block; nothing at all where it is empty."""
    if not methods:
        yield
        return
    with option(backend, SKIP_COPY_OPTION, methods):
        yield


def _savings(
    backend: RuntimeBackend, meter: TrafficMeter, host: MethodRun, kept: MethodRun, keep: str, call: str
) -> tuple[list[Saving], int]:
    """(h2d and d2h savings per execute, K): ``host`` and ``kept`` each executed K times in a window of
    their own; expected savings from the host tensors each passes and gets back. Where no saving can be
    judged whatever NVML counts (``pcie_checks.worth_measuring``), nothing is measured (K = 0)."""
    expected = {
        "h2d": host_nbytes(host.inputs) - host_nbytes(kept.inputs),
        "d2h": host_nbytes(host.outputs) - host_nbytes(kept.outputs),
    }
    if not worth_measuring(list(expected.values())):
        return [Saving(d, expected[d], None, None) for d in ("h2d", "d2h")], 0
    start = time.perf_counter()
    _executes(backend, host)()
    torch.cuda.synchronize()
    moves = host_nbytes(host.inputs) + host_nbytes(host.outputs)
    runs, _ = choose_runs(moves, time.perf_counter() - start, PCIE_TARGET_BYTES, PCIE_TIME_CAP_S)
    on_host = _per_execute(meter, _executes(backend, host), runs, call)
    with _runtime_option(backend, keep):
        on_device = _per_execute(meter, _executes(backend, kept), runs, call)
    savings = [Saving(d, expected[d], *difference(on_host, on_device, d)) for d in ("h2d", "d2h")]
    return savings, runs


@pytest.mark.rules(LOWER)
@pytest.mark.gpu
@pytest.mark.traffic
@pytest.mark.parametrize("mechanism", params(MECHANISMS))
@pytest.mark.parametrize("model", PCIE_MODELS)
def test_pcie_bytes_saved_as_nvml_counts_them(
    placing: PlacementRuntimeBackend,
    pcie_meter: TrafficMeter,
    model: str,
    mechanism: str,
    request: pytest.FixtureRequest,
) -> None:
    """device_placement/skip-copy-pcie, device_placement/pcie: each method executed alone, K times per NVML
    window, once with every input and output on the host and once with the mechanism keeping them on the
    device (runtime option: outputs, and the next method's inputs chained from them; export time: every input
    and output). What NVML saw cross PCIe must drop by at least 90 % of the bytes the device-resident tensors
    hold (less ``pcie_checks.SIGNIFICANCE`` x the noise of the difference and a command-traffic allowance),
    counted from the tensors the caller sees, not from the backend's counters: a backend whose counters say 0
    while it still stages the data through the host fails. Savings below the meter's resolution
    (``pcie_checks.RESOLUTION_FACTOR`` x the noise, at least ``COMMAND_FACTOR`` x the command-traffic
    allowance) are recorded as such and not judged."""
    backend, rule = placing, MECHANISMS[mechanism]
    if mechanism == "runtime-option":
        require_part(backend, "runtime_options")
    base = lower_or_fail(backend, model, "float32", "cuda")
    export_time = mechanism == "export-time"
    placed = lower_or_fail(backend, model, "float32", "cuda", END_TO_END) if export_time else base
    keep = "" if export_time else ",".join(base.methods)
    figures: dict[str, object] = {}
    judged: list[str] = []
    unresolved: list[str] = []
    with (
        handles(backend, base.program, *base.methods) as host_made,
        handles(backend, placed.program, *placed.methods) as placed_made,
    ):
        host_runs = run_methods(backend, base, host_made)
        with _runtime_option(backend, keep):
            device_in = set(placed.methods) if export_time else set()
            kept_runs = run_methods(backend, placed, placed_made, device_inputs=device_in)
        for method in base.methods:
            call = f"execute({model}.{method}, float32) kept on the device by the {mechanism} mechanism"
            savings, runs = _savings(backend, pcie_meter, host_runs[method], kept_runs[method], keep, call)
            figures[f"{method}_executes_per_window"] = runs
            for s in savings:
                figures[f"{method}_{s.direction}_saved_bytes"] = {
                    "expected": s.expected,
                    "nvml": s.measured,
                    "noise": s.noise,
                }
            record(request, **figures)
            judged += [f"{method} {s.direction}" for s in savings if s.expected > 0]
            unresolved += [f"{method} {s.describe()}" for s in check_savings(rule, call, savings)]
    if not judged:
        fail(rule, f"{model} with {mechanism} placement", "no method kept a tensor on the device")
    if len(unresolved) == len(judged):
        why = (
            f"every saving is below the meter's resolution ({RESOLUTION_FACTOR:g} x its noise, at least "
            f"{COMMAND_FACTOR} x the {COMMAND_ALLOWANCE:,} B command-traffic allowance)"
        )
        pytest.skip(f"{why}: " + "; ".join(unresolved))


# ============================================================================================= CPU target


@pytest.mark.rules(LOWER, *PLACEMENT.on_cpu)
@pytest.mark.parametrize("model", pipeline_params("llm"))
def test_placement_on_a_cpu_target_changes_nothing(placing: PlacementRuntimeBackend, model: str) -> None:
    """device_placement/cpu-target: on a program lowered for the CPU both flags are accepted and change
    nothing: outputs are host tensors, both byte counters are 0, values match float64 eager (the LLM-kind
    models: ``llm`` and, with ``transformers``, ``hf_llm``)."""
    backend = placing
    require_lowering_device(backend, "cpu")
    lm = lower_or_fail(backend, model, "float32", "cpu", END_TO_END)
    with handles(backend, lm.program, *lm.methods) as made:
        runs = run_methods(backend, lm, made)
    for method, run in runs.items():
        call = f"execute({model}.{method}, cpu target) lowered with {END_TO_END}"
        check_cpu_target(PLACEMENT, call, lm, run)
