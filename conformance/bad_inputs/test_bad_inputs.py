"""Chapter bad inputs — a call that breaks a rule is a clear error and changes nothing (SPEC §1b).

Each case breaks exactly one rule of ``init`` / ``execute`` / ``destroy`` (protocol part ``runtime``) and must
raise an invalid-argument error (``ValueError`` or a subclass, never a crash, never another type) whose
message names the argument and the rule. And **nothing else is affected**:

* caller-provided ``outputs`` of the rejected call stay bit for bit what they were;
* the handle that was called wrongly still gives correct results on the next, valid call (unless the case
  is about a destroyed handle);
* a second, healthy handle of the same program, made before the bad call, gives correct results right after;
* after a bad ``init``, the same program still initialises and runs.

Rules read ``bad_inputs/<rule>``. Program: the zoo's ``add_mul`` (``x * y + z``, three float32 ``[4, 32]``
inputs, one output) lowered for the CPU, and for CUDA in the ``cuda-program`` cases (marked ``gpu``): two
distinct compiles in all. Inputs are small integers, so every expected result is exact.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from conformance.common.checks import (
    CORRUPT_PROGRAM_WORDS,
    PROGRAM_WORDS,
    UNKNOWN_METHOD_WORDS,
    assert_exact,
    assert_raises_invalid_argument,
    assert_untouched,
    fail,
    snapshot,
)
from conformance.common.declared_rules import params
from conformance.common.parts import LoweringRuntimeBackend
from conformance.common.programs import SKIP_COPY_OPTION, LoweredModel, handles, lowered, option
from conformance.common.rules import family_ids, rule_id
from conformance.protocol import RuntimeBackend

MODEL, METHOD, DTYPE = "add_mul", "forward", torch.float32
SENTINEL = 1.5
"""What caller-provided outputs hold before a rejected call; they must still hold it afterwards."""

TARGETS = [
    pytest.param("cpu", id="cpu-program"),
    pytest.param("cuda", id="cuda-program", marks=pytest.mark.gpu),
]

# Words of which an error message must contain one, per rule (case-insensitive).
COUNT_WORDS = ("takes", "expects", "expected", "number of", "count", "returns", "provided")
DTYPE_WORDS = ("dtype",)
RANK_WORDS = ("rank", "dim", "shape")
SIZE_WORDS = ("shape", "size", "dim")
TENSOR_WORDS = ("tensor",)
SEQUENCE_WORDS = ("list", "tuple", "sequence")
DEVICE_WORDS = ("device",)
DESTROYED_WORDS = ("destroy",)
NOT_A_HANDLE_WORDS = ("init", "not a handle", "handle type")
METHOD_TYPE_WORDS = ("str", "string", "type")

# The rules of this chapter (conformance/catalogue/rule_table.py); the families': *_RULE_IDS.
WRONG_DEVICE = rule_id("bad_inputs/wrong-device")
OTHER_GPU = rule_id("bad_inputs/other-gpu")
OUTPUTS_WRONG_DEVICE = rule_id("bad_inputs/outputs-wrong-device")
NOT_A_HANDLE = rule_id("bad_inputs/not-a-handle")
CORRUPT_PROGRAM = rule_id("bad_inputs/corrupt-program")


# ------------------------------------------------------------------------------------------------ helpers


def exact_inputs(lm: LoweredModel, device: str | torch.device = "cpu", seed: int = 0) -> list[torch.Tensor]:
    """Small integers in the method's input shapes and dtypes: ``x * y + z`` is exact in any float dtype."""
    _, example = lm.eager[METHOD]
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(-8, 9, tuple(t.shape), generator=gen).to(device=device, dtype=t.dtype) for t in example
    ]


def eager_outputs(lm: LoweredModel, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The eager module's outputs, computed in float64 on the CPU and rounded once to the program's dtype."""
    module, _ = lm.eager[METHOD]
    reference = copy.deepcopy(module).to(device="cpu", dtype=torch.float64)
    with torch.no_grad():
        result = reference(*(t.detach().cpu().double() for t in inputs))
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    return [o.to(lm.dtype) for o in outs]


def describe(value: object) -> str:
    """A short description of an argument for failure messages (tensors by dtype, shape and device)."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)} on {value.device}"
    if isinstance(value, list):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    text = repr(value)
    return text if len(text) <= 40 else f"<{type(value).__name__}>"


def sentinels(expected: Sequence[torch.Tensor], device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Caller-provided outputs of the right dtype and shape, filled with ``SENTINEL``."""
    return [torch.full(e.shape, SENTINEL, dtype=e.dtype, device=device) for e in expected]


def assert_all_untouched(rule: str, call: str, outputs: Any, before: list[torch.Tensor]) -> None:
    tensors = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or [])
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if tensors and tensors[0].is_cuda:
        torch.cuda.synchronize()  # a stray asynchronous write would land by now
    for index, (old, new) in enumerate(zip(before, tensors, strict=True)):
        assert_untouched(rule, call, f"outputs[{index}]", old, new)


def snapshots(outputs: Any) -> list[torch.Tensor]:
    """Copies of the tensors among ``outputs``, whatever the case passes (``Any``: often wrong on purpose)."""
    tensors = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or [])
    return [snapshot(t) for t in tensors if isinstance(t, torch.Tensor)]


def assert_still_healthy(
    runtime: RuntimeBackend,
    rule: str,
    healthy: dict[str, object],
    good: list[torch.Tensor],
    expected: list[torch.Tensor],
) -> None:
    """Every handle in ``healthy`` (role → handle) runs the valid inputs to the exact result."""
    for role, handle in healthy.items():
        call = f"execute({role}, {describe(good)}) right after the rejected call"
        try:
            outs = runtime.execute(handle, good)
        except Exception as exc:  # reported as the rule break it is
            fail(
                rule,
                call,
                f"a rejected call must change nothing, but this raised {type(exc).__name__}: {exc}",
            )
        if len(outs) != len(expected):
            fail(rule, call, f"returned {len(outs)} outputs, expected {len(expected)}")
        for got, want in zip(outs, expected, strict=True):
            assert_exact(rule, call, got.cpu(), want)


def assert_program_rejected(rule: str, call: str, fn: Callable[[], object]) -> BaseException:
    """``fn()`` (an ``init`` of a corrupt program) raises an invalid-argument error blaming the program."""
    exc = assert_raises_invalid_argument(rule, call, fn, argument="", keywords=CORRUPT_PROGRAM_WORDS)
    if not any(word in str(exc).lower() for word in PROGRAM_WORDS):
        fail(rule, call, f"the error must say the program is at fault (one of {list(PROGRAM_WORDS)}): {exc}")
    return exc


# ------------------------------------------------------------------------------------------------- inputs

Make = Callable[[list[torch.Tensor]], object]


def _replace(index: int, make: Callable[[torch.Tensor], object]) -> Make:
    def build(good: list[torch.Tensor]) -> object:
        bad: list[object] = list(good)
        bad[index] = make(good[index])
        return bad

    return build


# rule → (keywords the message must contain one of, builder of the bad ``inputs`` from the good ones)
INPUT_RULES: dict[str, tuple[tuple[str, ...], Make]] = {
    "one-input-fewer": (COUNT_WORDS, lambda g: g[:-1]),
    "one-input-more": (COUNT_WORDS, lambda g: [*g, g[0].clone()]),
    "no-inputs": (COUNT_WORDS, lambda g: []),
    "wrong-dtype-float64": (DTYPE_WORDS, _replace(1, lambda t: t.double())),
    "wrong-dtype-float16": (DTYPE_WORDS, _replace(0, lambda t: t.half())),
    "wrong-dtype-int64": (DTYPE_WORDS, _replace(2, lambda t: t.long())),
    "wrong-rank-3d": (RANK_WORDS, _replace(0, lambda t: t[None])),
    "wrong-rank-1d": (RANK_WORDS, _replace(1, lambda t: t.flatten())),
    "wrong-size": (SIZE_WORDS, _replace(2, lambda t: t[:, :-1].contiguous())),
    "wrong-size-transposed": (SIZE_WORDS, _replace(0, lambda t: t.t().contiguous())),
    "wrong-size-empty": (SIZE_WORDS, _replace(1, lambda t: t[:0])),
    "non-tensor-element": (TENSOR_WORDS, _replace(2, lambda t: 3.0)),
    "none-element": (TENSOR_WORDS, _replace(0, lambda t: None)),
    "inputs-none": (SEQUENCE_WORDS, lambda g: None),
    "inputs-a-bare-tensor": (SEQUENCE_WORDS, lambda g: g[0]),
}
INPUT_RULE_IDS = family_ids("bad_inputs/{bad_input}", INPUT_RULES)


def reject_execute(
    runtime: RuntimeBackend,
    lm: LoweredModel,
    rule: str,
    *,
    inputs: Any,
    outputs: Any,
    argument: str,
    keywords: tuple[str, ...],
) -> None:
    """``execute(inputs, outputs)`` on a fresh handle is rejected naming ``argument``; nothing is affected.
    ``inputs`` and ``outputs`` are ``Any``: wrong on purpose, of whatever type the rule breaks."""
    good = exact_inputs(lm)
    expected = eager_outputs(lm, good)
    with option(runtime, SKIP_COPY_OPTION, ""), handles(runtime, lm.program, METHOD, METHOD) as made:
        victim, bystander = made
        before = snapshots(outputs)
        call = f"execute({lm.device} handle, inputs={describe(inputs)}, outputs={describe(outputs)})"
        assert_raises_invalid_argument(
            rule,
            call,
            lambda: runtime.execute(victim, inputs, outputs),
            argument=argument,
            keywords=keywords,
        )
        assert_all_untouched(rule, call, outputs, before)
        assert_still_healthy(
            runtime,
            rule,
            {"the handle just called wrongly": victim, "a second handle": bystander},
            good,
            expected,
        )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rule", params(INPUT_RULE_IDS))
def test_bad_inputs_are_rejected_and_change_nothing(
    runtime: LoweringRuntimeBackend, target: str, rule: str
) -> None:
    """bad_inputs/<rule>: inputs breaking one rule (count, dtype, rank, size, type) raise an invalid-argument
    error naming ``inputs`` and the rule; outputs untouched; this handle and a second one still work."""
    keywords, make = INPUT_RULES[rule]
    lm = lowered(runtime, MODEL, DTYPE, target)
    good = exact_inputs(lm)
    reject_execute(
        runtime,
        lm,
        INPUT_RULE_IDS[rule],
        inputs=make(good),
        outputs=sentinels(eager_outputs(lm, good)),
        argument="inputs",
        keywords=keywords,
    )


@pytest.mark.rules(WRONG_DEVICE)
@pytest.mark.gpu
def test_cuda_tensor_to_cpu_program(runtime: LoweringRuntimeBackend) -> None:
    """bad_inputs/wrong-device: a CUDA input to a program lowered for the CPU is rejected naming ``inputs``
    and the device (it is never silently copied back); outputs untouched; the handles still work."""
    lm = lowered(runtime, MODEL, DTYPE, "cpu")
    good = exact_inputs(lm)
    reject_execute(
        runtime,
        lm,
        WRONG_DEVICE,
        inputs=_replace(1, lambda t: t.to("cuda"))(good),
        outputs=sentinels(eager_outputs(lm, good)),
        argument="inputs",
        keywords=DEVICE_WORDS,
    )


@pytest.mark.rules(OTHER_GPU)
@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_tensor_on_another_gpu_to_cuda_program(runtime: LoweringRuntimeBackend) -> None:
    """bad_inputs/other-gpu: for a CUDA program initialised on cuda:0, an input on cuda:1 is rejected
    naming ``inputs`` and the device; outputs untouched; the handles still work."""
    torch.cuda.set_device(0)
    lm = lowered(runtime, MODEL, DTYPE, "cuda")
    good = exact_inputs(lm)
    reject_execute(
        runtime,
        lm,
        OTHER_GPU,
        inputs=_replace(2, lambda t: t.to("cuda:1"))(good),
        outputs=sentinels(eager_outputs(lm, good)),
        argument="inputs",
        keywords=DEVICE_WORDS,
    )


# ------------------------------------------------------------------------------------------------ outputs

MakeOutputs = Callable[[list[torch.Tensor]], object]

# rule → (keywords, builder of bad caller-provided ``outputs`` from the expected results)
OUTPUT_RULES: dict[str, tuple[tuple[str, ...], MakeOutputs]] = {
    "outputs-one-more": (COUNT_WORDS, lambda e: sentinels([*e, e[0]])),
    "outputs-wrong-dtype": (DTYPE_WORDS, lambda e: [s.double() for s in sentinels(e)]),
    "outputs-wrong-shape": (SIZE_WORDS, lambda e: [s[:, :-1].contiguous() for s in sentinels(e)]),
    "outputs-non-tensor": (TENSOR_WORDS, lambda e: [SENTINEL] * len(e)),
    "outputs-a-bare-tensor": (SEQUENCE_WORDS, lambda e: sentinels(e)[0]),
}
OUTPUT_RULE_IDS = family_ids("bad_inputs/{bad_output}", OUTPUT_RULES)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rule", params(OUTPUT_RULE_IDS))
def test_bad_outputs_are_rejected_and_left_untouched(
    runtime: LoweringRuntimeBackend, target: str, rule: str
) -> None:
    """bad_inputs/<rule>: caller-provided outputs breaking one rule raise an invalid-argument error naming
    ``outputs``; every provided tensor is left untouched (nothing was written before the checks); the
    handles still work."""
    keywords, make = OUTPUT_RULES[rule]
    lm = lowered(runtime, MODEL, DTYPE, target)
    good = exact_inputs(lm)
    reject_execute(
        runtime,
        lm,
        OUTPUT_RULE_IDS[rule],
        inputs=good,
        outputs=make(eager_outputs(lm, good)),
        argument="outputs",
        keywords=keywords,
    )


@pytest.mark.rules(OUTPUTS_WRONG_DEVICE)
@pytest.mark.gpu
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_cuda_outputs_where_outputs_go_to_the_cpu(runtime: LoweringRuntimeBackend, target: str) -> None:
    """bad_inputs/outputs-wrong-device: with the skip-copy option not naming the method, outputs go to
    the CPU, so caller-provided CUDA outputs are rejected naming ``outputs`` and the device, untouched."""
    lm = lowered(runtime, MODEL, DTYPE, target)
    good = exact_inputs(lm)
    reject_execute(
        runtime,
        lm,
        OUTPUTS_WRONG_DEVICE,
        inputs=good,
        outputs=sentinels(eager_outputs(lm, good), device="cuda"),
        argument="outputs",
        keywords=DEVICE_WORDS,
    )


# -------------------------------------------------------------------------------------- destroyed handles

AFTER_DESTROY = {
    "execute": rule_id("bad_inputs/execute-after-destroy"),
    "destroy": rule_id("bad_inputs/destroy-twice"),
    "execute_stats": rule_id("bad_inputs/stats-after-destroy"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("call_after", params(AFTER_DESTROY))
def test_destroyed_handle_is_rejected(runtime: LoweringRuntimeBackend, target: str, call_after: str) -> None:
    """bad_inputs/execute-after-destroy, destroy-twice, stats-after-destroy: a destroyed handle is an
    invalid-argument error naming ``handle`` and that it was destroyed (never a crash or a use-after-free);
    outputs untouched; another handle of the program still works, and a new one can be made."""
    rule = AFTER_DESTROY[call_after]
    lm = lowered(runtime, MODEL, DTYPE, target)
    good = exact_inputs(lm)
    expected = eager_outputs(lm, good)
    with option(runtime, SKIP_COPY_OPTION, ""), handles(runtime, lm.program, METHOD) as (bystander,):
        victim = runtime.init(lm.program, METHOD)
        runtime.execute(victim, good)  # used once: it has state to release
        runtime.destroy(victim)
        outputs = sentinels(expected)
        before = snapshots(outputs)
        calls: dict[str, tuple[str, Callable[[], object]]] = {
            "execute": (
                f"execute(destroyed handle, {describe(good)}, outputs={describe(outputs)})",
                lambda: runtime.execute(victim, good, outputs),
            ),
            "destroy": ("destroy(destroyed handle)", lambda: runtime.destroy(victim)),
            "execute_stats": (
                "execute_stats(destroyed handle)",
                lambda: runtime.execute_stats(victim),
            ),
        }
        call, fn = calls[call_after]
        assert_raises_invalid_argument(rule, call, fn, argument="handle", keywords=DESTROYED_WORDS)
        assert_all_untouched(rule, call, outputs, before)
        with handles(runtime, lm.program, METHOD) as (fresh,):
            assert_still_healthy(
                runtime, rule, {"a second handle": bystander, "a handle made after": fresh}, good, expected
            )


@pytest.mark.rules(NOT_A_HANDLE)
@pytest.mark.parametrize("not_a_handle", [None, METHOD, 0], ids=["None", "method-name", "int"])
def test_execute_on_something_not_a_handle(runtime: LoweringRuntimeBackend, not_a_handle: object) -> None:
    """bad_inputs/not-a-handle: execute on a value that init did not return is an invalid-argument error
    naming ``handle``; a real handle still works."""
    rule = NOT_A_HANDLE
    lm = lowered(runtime, MODEL, DTYPE, "cpu")
    good = exact_inputs(lm)
    expected = eager_outputs(lm, good)
    with option(runtime, SKIP_COPY_OPTION, ""), handles(runtime, lm.program, METHOD) as (bystander,):
        outputs = sentinels(expected)
        before = snapshots(outputs)
        call = f"execute({not_a_handle!r}, {describe(good)}, outputs={describe(outputs)})"
        assert_raises_invalid_argument(
            rule,
            call,
            lambda: runtime.execute(not_a_handle, good, outputs),
            argument="handle",
            keywords=NOT_A_HANDLE_WORDS,
        )
        assert_all_untouched(rule, call, outputs, before)
        assert_still_healthy(runtime, rule, {"a real handle": bystander}, good, expected)


# ----------------------------------------------------------------------------------------------- init


#: rule → (the method name, wrong on purpose: ``Any``; keywords the message must contain one of)
METHOD_RULES: dict[str, tuple[Any, tuple[str, ...]]] = {
    "unknown-method": ("no_such_method", UNKNOWN_METHOD_WORDS),
    "unknown-method-empty-name": ("", (*UNKNOWN_METHOD_WORDS, "empty")),
    "method-not-a-string": (None, METHOD_TYPE_WORDS),
}
METHOD_RULE_IDS = family_ids("bad_inputs/{bad_method}", METHOD_RULES)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rule", params(METHOD_RULE_IDS))
def test_init_with_a_bad_method_is_rejected(runtime: LoweringRuntimeBackend, target: str, rule: str) -> None:
    """bad_inputs/unknown-method, unknown-method-empty-name, method-not-a-string: init of a method the
    program does not have raises an invalid-argument error naming ``method``; a handle made before still
    works, and the right method still initialises."""
    method, keywords = METHOD_RULES[rule]
    lm = lowered(runtime, MODEL, DTYPE, target)
    good = exact_inputs(lm)
    expected = eager_outputs(lm, good)
    with option(runtime, SKIP_COPY_OPTION, ""), handles(runtime, lm.program, METHOD) as (bystander,):
        call = f"init(<{lm.model.name} program>, {method!r})"
        assert_raises_invalid_argument(
            METHOD_RULE_IDS[rule],
            call,
            lambda: runtime.init(lm.program, method),
            argument="method",
            keywords=keywords,
        )
        with handles(runtime, lm.program, METHOD) as (fresh,):
            assert_still_healthy(
                runtime,
                METHOD_RULE_IDS[rule],
                {"a handle made before": bystander, "a handle made after": fresh},
                good,
                expected,
            )


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "random-bytes": lambda p: random.Random(20).randbytes(4096),
    "first-64-bytes-zeroed": lambda p: bytes(64) + p[64:],
    "reversed": lambda p: p[::-1],
}


@pytest.mark.rules(CORRUPT_PROGRAM)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_init_with_a_corrupt_program_is_rejected(
    runtime: LoweringRuntimeBackend, target: str, corruption: str
) -> None:
    """bad_inputs/corrupt-program: init of a corrupt program raises an invalid-argument error that blames
    the program and says what is wrong (never a crash); a handle of the intact program made before still
    works, and the intact program still initialises. The format chapter sweeps truncations and flips."""
    rule = CORRUPT_PROGRAM
    lm = lowered(runtime, MODEL, DTYPE, target)
    good = exact_inputs(lm)
    expected = eager_outputs(lm, good)
    bad = CORRUPTIONS[corruption](lm.program)
    with option(runtime, SKIP_COPY_OPTION, ""), handles(runtime, lm.program, METHOD) as (bystander,):
        call = f"init(<{len(bad)} bytes: {corruption}>, {METHOD!r})"
        assert_program_rejected(rule, call, lambda: runtime.init(bad, METHOD))
        with handles(runtime, lm.program, METHOD) as (fresh,):
            assert_still_healthy(
                runtime,
                rule,
                {"a handle made before": bystander, "a handle made after": fresh},
                good,
                expected,
            )
