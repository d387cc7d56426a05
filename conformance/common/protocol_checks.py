"""How the differential state machine judges what a protocol call did, beyond the oracle's verdict on
whether it is an error (``conformance/common/oracle.py``): values against float64 eager, where outputs land,
provided outputs filled, results the caller holds left alone, option read-backs, racing threads.

Each check fails with the ``differential/*`` rule it enforces (``conformance/catalogue/rule_table.py``);
the machine that makes the calls is ``conformance/common/protocol_machine.py``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance.common.checks import assert_model_output_close, bits, fail
from conformance.common.observed import shared_pairs, structure, structure_difference
from conformance.common.oracle import CallResult, call, judge
from conformance.common.protocol_inputs import MethodSpec, eager_float64
from conformance.common.protocol_plans import SKIP_COPY_OPTION
from conformance.common.rules import rule_id
from harness import stream_hold

__all__ = [
    "BUSY_S",
    "RULES",
    "Held",
    "busy_caller_stream",
    "check_aliasing",
    "check_execute_results",
    "check_held",
    "check_output_devices",
    "check_read_at_once",
    "check_results",
    "check_structure",
    "check_thread_results",
    "compare_option_call",
    "compare_read_back",
    "flat_tensors",
    "read_at_once",
    "snapshot",
    "unchanged",
]

# The rules this module checks (conformance/catalogue/rule_table.py).
OPTION_READ_BACK = rule_id("differential/option-read-back")
INPUTS_UNTOUCHED = rule_id("differential/inputs-untouched")
VALUES = rule_id("differential/values")
OUTPUT_DEVICE = rule_id("differential/output-device")
OUTPUTS_OWNED = rule_id("differential/outputs-owned")
OUTPUTS_FILLED = rule_id("differential/outputs-filled")
THREADS = rule_id("differential/threads")
STRUCTURE = rule_id("differential/result-structure")
#: Every rule the checks of this module name.
RULES = (
    OPTION_READ_BACK,
    INPUTS_UNTOUCHED,
    VALUES,
    OUTPUT_DEVICE,
    OUTPUTS_OWNED,
    OUTPUTS_FILLED,
    THREADS,
    STRUCTURE,
)


def flat_tensors(value: object) -> list[torch.Tensor]:
    """The tensors of an argument or result: itself, or the tensor items of a list or tuple."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def snapshot(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The bits of ``tensors`` now, to compare with :func:`unchanged` after a call."""
    return [bits(t).clone() for t in tensors]


def unchanged(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> bool:
    return all(torch.equal(b, bits(a)) for b, a in zip(before, after, strict=True))


def _reference_for(ref: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The float64 reference, as ``assert_model_output_close`` takes it for an output like ``out``."""
    return ref if ref.is_floating_point() else ref.to(out.dtype) if not out.is_floating_point() else ref


# ============================================================================================== options


def compare_option_call(backend: Any, oracle: Any, key: object, value: object) -> str:
    """``set_option(key, value)`` on both sides, judged, then the read-back of ``key`` (and of the known
    key, where ``key`` is another): the same outcomes and the same values. Returns the call's text."""
    text = f"set_option({key!r}, {value!r})"
    want = call(
        oracle.set_option, key, value
    )  # the oracle first: a journal notes its answer (crash_journal.py)
    judge("set_option", text, call(backend.set_option, key, value), want)
    compare_read_back(backend, oracle, f"get_option({key!r}) after {text}", key)
    if key != SKIP_COPY_OPTION:
        after = f"get_option({SKIP_COPY_OPTION!r}) after {text}"
        compare_read_back(backend, oracle, after, SKIP_COPY_OPTION)
    return text


def compare_read_back(backend: Any, oracle: Any, text: str, key: object) -> None:
    """``get_option(key)`` on both sides: the same outcome, and the same value; and the backend's answer
    read from another thread is the same (options are backend-wide)."""
    want = call(oracle.get_option, key)
    got = call(backend.get_option, key)
    judge("get_option", text, got, want)
    if got.ok and want.ok and (type(got.value) is not type(want.value) or got.value != want.value):
        fail(
            OPTION_READ_BACK,
            text,
            f"returned {got.value!r}; after the same calls the oracle returns {want.value!r}",
        )
    elsewhere: list[CallResult] = []
    reader = threading.Thread(target=lambda: elsewhere.append(call(backend.get_option, key)))
    reader.start()
    reader.join()
    other = elsewhere[0]
    if other.ok != got.ok or (got.ok and (type(other.value), other.value) != (type(got.value), got.value)):
        seen = other.value if other.ok else other.describe()
        fail(
            OPTION_READ_BACK,
            f"{text}, read from another thread",
            f"gave {seen!r} where the calling thread reads {got.value if got.ok else got.describe()!r}; "
            "options are backend-wide, the same for every thread",
        )


def check_structure(text: str, got: object, want: object) -> None:
    """What a successful call returned has the structure of the oracle's answer
    (``conformance/common/observed.py``: container and length, each tensor's class, dtype, shape, device,
    layout and ``requires_grad``, a mapping's keys and value types)."""
    difference = structure_difference(structure(got), structure(want))
    if difference is not None:
        fail(STRUCTURE, text, f"{difference}; a caller sees what the oracle returns, in this structure")


def check_aliasing(text: str, got: Sequence[object], want: Sequence[object]) -> None:
    """No two results of one call share memory unless the oracle's do: a caller writing one would change
    the other."""
    extra = sorted(shared_pairs(got) - shared_pairs(want))
    if extra:
        i, j = extra[0]
        fail(
            OUTPUTS_OWNED,
            text,
            f"result[{i}] and result[{j}] share memory (the oracle's do not): writing one changes the other; "
            "returned tensors belong to the caller",
        )


# ============================================================================================== execute


@dataclass
class Held:
    """A result the caller still holds: the call, the object it returned (a list), the tensors in it, and
    their bits then."""

    call: str
    returned: object
    tensors: list[torch.Tensor]
    before: list[torch.Tensor]

    @classmethod
    def of(cls, call: str, returned: object) -> Held:
        tensors = flat_tensors(returned)
        return cls(call, returned, list(tensors), snapshot(tensors))


def check_held(held: Sequence[Held], text: str) -> None:
    """No result the caller still holds changed during call ``text``: neither its tensors' values, nor the
    list itself (the tensors in it, their number)."""
    for earlier in held:
        if not unchanged(earlier.before, earlier.tensors):
            fail(
                OUTPUTS_OWNED,
                text,
                f"changed the outputs an earlier call returned ({earlier.call}); returned tensors belong to "
                "the caller and no later call may write them",
            )
        now = flat_tensors(earlier.returned)
        if len(now) != len(earlier.tensors) or any(
            a is not b for a, b in zip(now, earlier.tensors, strict=True)
        ):
            fail(
                OUTPUTS_OWNED,
                text,
                f"changed the list an earlier call returned ({earlier.call}): its items were replaced; the "
                "returned list belongs to the caller",
            )


def check_execute_results(
    text: str, spec: MethodSpec, inputs: object, got: object, want: object, given: object
) -> None:
    """A successful execute's results against the oracle's (``want``): the outputs' devices first (the
    structure holds them too; this rule names that slip), then the structure, the aliasing, the values and
    the provided outputs (``given``)."""
    check_output_devices(text, got, want)
    check_structure(text, got, want)
    check_aliasing(text, got, want)
    check_results(text, spec, inputs, got, want, given)


def check_output_devices(text: str, got: object, want: object) -> None:
    """A successful execute's outputs lie on the devices the oracle puts them (placement and options).
    Checked before the result's structure, which holds each tensor's device too: where only devices
    differ, this rule names the slip."""
    if not isinstance(got, (list, tuple)) or not isinstance(want, (list, tuple)) or len(got) != len(want):
        return  # the structure's to name
    if not all(isinstance(t, torch.Tensor) for t in (*got, *want)):
        return
    devices, oracle_devices = [t.device.type for t in got], [t.device.type for t in want]
    if devices != oracle_devices:
        fail(
            OUTPUT_DEVICE,
            text,
            f"outputs on {devices}; the oracle puts them on {oracle_devices} (placement and options)",
        )


def check_results(
    text: str,
    spec: MethodSpec,
    inputs: object,
    got: object,
    want: object,
    given: object,
) -> None:
    """A successful execute's results (``got``; the oracle's: ``want``): a list of tensors with eager's
    values, and provided outputs (``given``) holding the same (their devices: ``check_output_devices``)."""
    results = list(got) if isinstance(got, (list, tuple)) else None  # type: ignore[call-overload]
    if results is None or not all(isinstance(t, torch.Tensor) for t in results):
        fail(VALUES, text, f"must return a list of tensors, got {type(got).__name__}")
    expected = eager_float64(spec, flat_tensors(inputs))
    if len(results) != len(expected):
        fail(VALUES, text, f"returned {len(results)} outputs; eager returns {len(expected)}")
    for index, (out, ref) in enumerate(zip(results, expected, strict=True)):
        assert_model_output_close(VALUES, f"{text}: output {index}", out, _reference_for(ref, out))
    if given is not None:
        for index, (dst, ref) in enumerate(zip(flat_tensors(given), expected, strict=False)):
            assert_model_output_close(
                OUTPUTS_FILLED,
                f"{text}: provided outputs[{index}] after the call",
                dst,
                _reference_for(ref, dst),
            )


# ============================================================================================== streams

#: How long the caller's stream is held as a CUDA call is made (``harness/stream_hold.py``; a front-end hold
#: ends sooner, when the call returns): work the backend enqueues behind it is not done when a call that
#: only enqueues returns.
BUSY_S = 0.001
_side_streams: dict[tuple[str, int], torch.cuda.Stream] = {}


def _side_stream(role: str) -> torch.cuda.Stream:
    """One stream per role and device, made once (creating streams per call would be its own cost)."""
    key = (role, torch.cuda.current_device())
    if key not in _side_streams:
        _side_streams[key] = torch.cuda.Stream()
    return _side_streams[key]


@contextlib.contextmanager
def busy_caller_stream(device: str, seed: int) -> Iterator[None]:
    """On a CUDA target: the call is made with the caller's current stream busy (held for ``BUSY_S``, a
    front-end hold until the block ends), on a non-default stream for odd ``seed``s (that stream first
    waits for the work the caller did on its default stream: a correct caller's order). On the host:
    nothing."""
    if device != "cuda" or not torch.cuda.is_available():
        yield
        return
    caller = _side_stream("caller") if seed % 2 else torch.cuda.current_stream()
    caller.wait_stream(torch.cuda.current_stream())
    with stream_hold.held(caller, BUSY_S), torch.cuda.stream(caller):
        yield
    torch.cuda.current_stream().wait_stream(caller)


def read_at_once(results: object) -> list[torch.Tensor]:
    """What a consumer reads the moment a call returns: host results copied now (no synchronisation), CUDA
    results copied on a stream of the consumer's own, without waiting for anything (the protocol: outputs
    are safe to read on any stream once execute returns)."""
    seen = []
    for t in flat_tensors(results):
        if t.device.type == "cuda":
            consumer = _side_stream("consumer")
            with torch.cuda.stream(consumer):
                seen.append(t.detach().clone())
        else:
            seen.append(t.detach().clone())
    return seen


def check_read_at_once(text: str, seen: Sequence[torch.Tensor], results: object) -> None:
    """What was read when the call returned (:func:`read_at_once`) is what the results hold once all work
    is done: the backend finished before returning."""
    for index, (early, final) in enumerate(zip(seen, flat_tensors(results), strict=False)):
        if early.shape != final.shape or not torch.equal(bits(early), bits(final.detach())):
            where = "on another stream" if final.device.type == "cuda" else "on the host"
            fail(
                VALUES,
                text,
                f"output {index} read {where} as the call returned differs from its final value: execute "
                "returned before its work was done (outputs must be safe to read once execute returns)",
            )


# ============================================================================================== threads


def check_thread_results(
    spec: MethodSpec,
    texts: Sequence[str],
    inputs: Mapping[int, object],
    before: Mapping[int, list[torch.Tensor]],
    results: Mapping[int, CallResult],
) -> None:
    """Executes that raced each other (thread ``i``: call ``texts[i]`` on ``inputs[i]``, whose values were
    ``before[i]``, giving ``results[i]``). What a racing call did wrong is named by the rule it breaks: its
    inputs written, results that share memory with another thread's, and only then values or errors that
    differ from a lone call."""
    for i, text in enumerate(texts):
        if not unchanged([bits(t) for t in before[i]], flat_tensors(inputs[i])):
            fail(INPUTS_UNTOUCHED, text, "changed its inputs; execute never writes them")
    storages: dict[int, int] = {}
    for i, text in enumerate(texts):
        outs = flat_tensors(results[i].value) if results[i].ok else []
        for out in outs:
            other = storages.setdefault(out.untyped_storage().data_ptr(), i)
            if other != i and out.numel():
                fail(
                    OUTPUTS_OWNED,
                    text,
                    f"returned an output sharing memory with thread {other}'s results; returned tensors "
                    "belong to their caller",
                )
    for i, text in enumerate(texts):
        outcome = results[i]
        if not outcome.ok:
            fail(THREADS, text, f"a valid execute racing others {outcome.describe()}")
        expected = eager_float64(spec, before[i])
        for index, (out, ref) in enumerate(zip(outcome.value, expected, strict=False)):
            assert_model_output_close(THREADS, f"{text}: output {index}", out, _reference_for(ref, out))
