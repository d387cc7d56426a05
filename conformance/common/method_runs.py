"""Run each method of a multi-method zoo program once, chained as in real use, and judge what came back.

Shared by the chapters on where data lives (``runtime_options``: the runtime skip-copy option;
``device_placement``: export-time placement): outputs' devices, values against eager float64, the
backend's byte counters, and the copies the torch profiler saw.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, fields

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.common.checks import assert_model_output_close, fail
from conformance.common.pipelines import PIPELINE_MODELS
from conformance.common.programs import LoweredModel
from conformance.common.rules import rule_id
from conformance.protocol import RuntimeBackend

#: The multi-method (pipeline) models and their two methods in call order: ``asr``, ``llm`` and, with
#: ``transformers`` installed, ``hf_whisper`` and ``hf_llm``
#: (``conformance.common.pipelines.PIPELINE_MODELS``).
MODEL_METHODS: dict[str, tuple[str, str]] = {name: p.methods for name, p in PIPELINE_MODELS.items()}
#: How one method's outputs feed the next: method → {input index: (source method, output index)}.
#: ASR kind: hidden states ← encoder output; LLM kind: k/v caches ← prefill's caches.
FEEDS: dict[str, dict[str, dict[int, tuple[str, int]]]] = {
    name: {p.methods[1]: dict(p.feeds)} for name, p in PIPELINE_MODELS.items()
}


PINNED_HOST_MEMORY = rule_id("runtime_options/pinned-host-memory")


@dataclass(frozen=True)
class WhereRules:
    """The rule ids of one mechanism that decides where a method's data lives, ``<family>/<check>`` in the
    family of the mechanism's chapter: the runtime skip-copy option (:data:`SKIP_COPY`, ``runtime_options``)
    or export-time placement (:data:`PLACEMENT`, ``device_placement``). The checks below take one of them,
    so the ids are looked up in the rule table once, on import."""

    output_device: str
    values: str
    d2h_bytes: str
    h2d_bytes: str
    d2h_copy: str
    no_d2h_copy: str
    cpu_target: str

    @classmethod
    def of(cls, family: str) -> WhereRules:
        ids = {f.name: rule_id(f"{family}/{f.name.replace('_', '-')}") for f in fields(cls)}
        return cls(**ids)

    @property
    def on_cuda(self) -> tuple[str, ...]:
        """What :func:`check_where_data_went` and :func:`check_output_copies` fail with: a case running
        them declares these (``conformance/common/declared_rules.py``)."""
        return (
            self.output_device,
            self.values,
            self.d2h_bytes,
            self.h2d_bytes,
            self.d2h_copy,
            self.no_d2h_copy,
        )

    @property
    def on_cpu(self) -> tuple[str, ...]:
        """What :func:`check_cpu_target` fails with."""
        return (self.cpu_target, self.values)


SKIP_COPY = WhereRules.of("runtime_options")
PLACEMENT = WhereRules.of("device_placement")
NO_H2D_COPY = rule_id("device_placement/no-h2d-copy")


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def host_nbytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the host tensors among ``tensors``: what must cross PCIe to reach or leave the device."""
    return nbytes([t for t in tensors if t.device.type == "cpu"])


def cuda_device() -> torch.device:
    """The device a handle made by ``init`` runs on: the current CUDA device (``init`` takes no device)."""
    return torch.device("cuda", torch.cuda.current_device())


@dataclass
class MethodRun:
    method: str
    handle: object
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    stats: dict[str, int]


def run_methods(
    backend: RuntimeBackend, lm: LoweredModel, made: Sequence[object], device_inputs: Collection[str] = ()
) -> dict[str, MethodRun]:
    """Execute every method once, in order: host copies of the example inputs, chained through ``FEEDS``.

    A method in ``device_inputs`` gets every input on the current CUDA device, as a caller that already
    holds device tensors would pass them (the copy is the caller's, made before the execute).
    """
    runs: dict[str, MethodRun] = {}
    for method, handle in zip(lm.methods, made, strict=True):
        inputs = [t.detach().cpu() for t in lm.eager[method][1]]
        for index, (source, output) in FEEDS.get(lm.model.name, {}).get(method, {}).items():
            inputs[index] = runs[source].outputs[output]
        if method in device_inputs:
            inputs = [t.to(cuda_device()) for t in inputs]
            torch.cuda.synchronize()
        outputs = list(backend.execute(handle, inputs))
        stats = dict(backend.execute_stats(handle))
        runs[method] = MethodRun(method, handle, inputs, outputs, stats)
    return runs


def float64_reference(lm: LoweredModel, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Eager PyTorch in float64 on the CPU, same (already rounded) weights and inputs, SDPA's math kernel."""
    module = copy.deepcopy(lm.eager[method][0]).to(device="cpu", dtype=torch.float64)
    args = [t.detach().cpu().double() if t.is_floating_point() else t.detach().cpu() for t in inputs]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        out = module(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    return float((g - r).norm() / r.norm().clamp_min(1e-300))


def check_values(rule: str, call: str, lm: LoweredModel, run: MethodRun) -> None:
    """Each output in the program's dtype, and norm-wise within ``MODEL_TOLERANCES`` of float64 eager."""
    refs = float64_reference(lm, run.method, run.inputs)
    if len(run.outputs) != len(refs):
        fail(rule, call, f"returned {len(run.outputs)} outputs, eager returns {len(refs)}")
    for index, (got, ref) in enumerate(zip(run.outputs, refs, strict=True)):
        if got.dtype != lm.dtype:
            fail(rule, call, f"output {index} is {got.dtype}, eager gives {lm.dtype}")
        assert_model_output_close(rule, f"{call}: output {index}", got, ref)


def devices(tensors: Sequence[torch.Tensor]) -> list[str]:
    return [str(t.device) for t in tensors]


def memcpy_names(fn: Callable[[], object]) -> tuple[list[str], int]:
    """Run ``fn`` under the torch profiler: (names of the memcpy activities, count of GPU activities).

    CUPTI names copies like ``Memcpy DtoH (Device -> Pinned)`` / ``Memcpy DtoH (Device -> Pageable)`` and
    ``Memcpy HtoD (Pinned -> Device)`` / ``Memcpy HtoD (Pageable -> Device)``; they appear as device events
    and as the kernels attached to the CPU op that launched them.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        # A kernel of our own: CUPTI works if the profiler saw anything, even where ``fn`` launched nothing
        # (a backend serving cached host outputs must not turn the check into a skip).
        torch.ones(1, device=cuda_device()).add_(1)
        torch.cuda.synchronize()
    names: list[str] = []
    for event in prof.events():
        if event.device_type != DeviceType.CPU:
            names.append(event.name)
        names.extend(kernel.name for kernel in getattr(event, "kernels", []))
    return [n for n in names if n.startswith("Memcpy")], len(names)


def check_pinned_copies(call: str, copies: Sequence[str]) -> None:
    """runtime_options/pinned-host-memory: every host↔device copy the profiler saw used pinned host memory (a
    pageable copy is correct but synchronous and ~35× slower device→host on an H200: SPEC §1b)."""
    pageable = sorted({n for n in copies if "Pageable" in n})
    if pageable:
        fail(PINNED_HOST_MEMORY, call, f"the profiler saw copies through pageable memory {pageable}")


def check_where_data_went(
    rules: WhereRules, call: str, lm: LoweredModel, run: MethodRun, keep: bool, device_in: bool = False
) -> None:
    """``<mechanism>/output-device``, ``/values``, ``/d2h-bytes``, ``/h2d-bytes`` of one CUDA execute: outputs
    kept on the device or copied to the host as the mechanism says, values against float64 eager, and
    counters that count exactly the host inputs and the copied outputs."""
    want = str(cuda_device()) if keep else "cpu"
    if any(d != want for d in devices(run.outputs)):
        where = "kept on the device" if keep else "copied to the host"
        fail(rules.output_device, call, f"outputs are {where}: want {want}, got {devices(run.outputs)}")
    check_values(rules.values, call, lm, run)
    d2h, want_d2h = run.stats.get("d2h_bytes"), 0 if keep else nbytes(run.outputs)
    if d2h != want_d2h:
        fail(rules.d2h_bytes, call, f"execute_stats d2h_bytes = {d2h}, want {want_d2h}")
    h2d = run.stats.get("h2d_bytes")
    want_h2d = host_nbytes(run.inputs)
    if h2d != want_h2d:
        why = (
            "inputs arrive on the device"
            if device_in
            else "the host inputs' bytes; device inputs are not copied"
        )
        fail(rules.h2d_bytes, call, f"execute_stats h2d_bytes = {h2d}, want {want_h2d} ({why})")


#: Profiled executes at most before a call whose outputs came back to the host is said to have copied
#: nothing device→host. The profiler may lose a record: one cold GPU run saw no 'Memcpy DtoH' for a copy
#: that the call made (``examples/runs/2026-11-29-stream-holds-H200/``). A backend that copies nothing
#: shows none in any of them; one that copies shows it in the next.
PROFILES_FOR_A_COPY = 3


def profiled_copies(backend: RuntimeBackend, run: MethodRun, outputs_copied: bool) -> list[str]:
    """The execute again under the profiler: the memcpy activities it made (skips where CUPTI saw nothing).
    Where the outputs came back to the host (``outputs_copied``) and no device→host copy was seen, it is
    profiled again, up to ``PROFILES_FOR_A_COPY`` times; every profile's copies are returned, and a warning
    names how many missed the copy that a later one saw."""
    copies: list[str] = []
    for attempt in range(1, PROFILES_FOR_A_COPY + 1):
        seen, activities = memcpy_names(lambda: backend.execute(run.handle, run.inputs))
        if activities == 0:
            pytest.skip("the torch profiler recorded no CUDA activity (CUPTI unavailable?): no copy observed")
        copies += seen
        if not outputs_copied or _device_to_host(seen):
            if attempt > 1:
                missed = f"{attempt - 1} of {attempt} profiles"
                warnings.warn(
                    f"the profiler saw no 'Memcpy DtoH' in {missed} of one execute",
                    ProfilerMissedACopy,
                    stacklevel=2,
                )
            break
    return copies


class ProfilerMissedACopy(UserWarning):
    """A profile of an execute lacked a device→host copy that a later profile of the same execute saw."""


def _device_to_host(copies: Sequence[str]) -> list[str]:
    return sorted({n for n in copies if "DtoH" in n})


def check_output_copies(rules: WhereRules, call: str, copies: Sequence[str], keep: bool) -> None:
    """``<mechanism>/no-d2h-copy`` for kept outputs, ``/d2h-copy`` for copied ones."""
    dtoh = _device_to_host(copies)
    if keep and dtoh:
        fail(rules.no_d2h_copy, call, f"outputs are kept on the device, yet the profiler saw {dtoh}")
    if not keep and not dtoh:
        fail(rules.d2h_copy, call, "outputs came back to the host, but the profiler saw no 'Memcpy DtoH'")


def check_device_inputs_not_copied(call: str, copies: Sequence[str]) -> None:
    """``device_placement/no-h2d-copy``: a method whose inputs arrive on the device copies nothing
    host→device. Only export-time placement hands a method device inputs, so only its chapter calls it (a
    check no case can fail is no check)."""
    htod = sorted({n for n in copies if "HtoD" in n})
    if htod:
        fail(NO_H2D_COPY, call, f"inputs arrive on the device, yet the profiler saw {htod}")


def check_cpu_target(rules: WhereRules, call: str, lm: LoweredModel, run: MethodRun) -> None:
    """``<mechanism>/cpu-target``: a program lowered for the CPU returns host tensors and moves 0 bytes
    across PCIe whatever placement was asked for; ``<mechanism>/values`` against float64 eager."""
    if any(d != "cpu" for d in devices(run.outputs)):
        fail(
            rules.cpu_target,
            call,
            f"outputs on {devices(run.outputs)}; a CPU target returns host tensors",
        )
    stats = {k: run.stats.get(k) for k in ("h2d_bytes", "d2h_bytes")}
    if stats != {"h2d_bytes": 0, "d2h_bytes": 0}:
        fail(rules.cpu_target, call, f"execute_stats {stats}: a CPU target moves nothing across PCIe")
    check_values(rules.values, call, lm, run)
