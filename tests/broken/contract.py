"""Broken backends that break what the contract states for *every* call (``conformance/protocol.py``, "Every
call"): the contract monitor (``conformance/common/contract_monitor.py``) must name each first, under its own
rule, in whichever chapter the call was made. Each wraps the reference and slips once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import BAD_INPUTS, MULTI_METHOD, Forwarding
from tests.broken.generated import DIFFERENTIAL
from tests.rule_coverage import Breaks

LOWERING = "conformance/lowering/test_lowering.py"


class WritesResultIntoInputs(Forwarding):
    """Computes, then writes its first result into the caller's first input where the sizes allow (an
    "in-place" fast path that reuses the input's memory as the output's staging buffer)."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        first = inputs[0] if isinstance(inputs, (list, tuple)) and inputs else None
        if isinstance(first, torch.Tensor) and results and first.numel() == results[0].numel():
            first.copy_(results[0].reshape(first.shape).to(first.dtype))
        return results


class ReturnsATuple(Forwarding):
    """Returns ``execute``'s results as a tuple (a caller that appends to, or assigns into, them breaks)."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> Any:
        return tuple(REFERENCE.execute(handle, inputs, outputs))


class UnknownMethodIsKeyError(Forwarding):
    """Looks the method up in a dict and lets the ``KeyError`` of an unknown name escape."""

    def init(self, program: Any, method: Any) -> Any:
        try:
            return REFERENCE.init(program, method)
        except ValueError as exc:
            if "method" in str(exc).lower() and isinstance(method, str):
                raise KeyError(method) from None
            raise


class ReusesOutputBuffers(Forwarding):
    """Keeps one set of output tensors per handle and returns them again on every execute, refilled: the
    results a caller holds from the previous call change under it."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._buffers: dict[int, list[torch.Tensor]] = {}

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        if outputs is not None:
            return results
        kept = self._buffers.get(id(handle))
        if kept is None or [(t.shape, t.dtype, t.device) for t in kept] != [
            (t.shape, t.dtype, t.device) for t in results
        ]:
            self._buffers[id(handle)] = list(results)
            return results
        for buffer, fresh in zip(kept, results, strict=True):
            buffer.copy_(fresh)
        return list(kept)


class StatsAsFloats(Forwarding):
    """Reports the byte counters as floats (an average over copies, not a count)."""

    def execute_stats(self, handle: Any) -> Mapping[str, Any]:
        return {k: float(v) for k, v in REFERENCE.execute_stats(handle).items()}


class LowerFreesExampleInputs(Forwarding):
    """Frees the caller's example inputs once the program is exported ("they are not needed any more"),
    by filling them with zeros in place."""

    def lower(self, methods: Mapping[str, Sequence[Any]], **kwargs: Any) -> bytes:
        program = REFERENCE.lower(methods, **kwargs)
        for spec in methods.values():
            for t in spec[1] if len(spec) > 1 else ():
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    t.zero_()
        return program


WRITES_RESULT_INTO_INPUTS = WritesResultIntoInputs(
    "writes-result-into-inputs",
    Breaks(("contract/inputs-untouched",), MULTI_METHOD, ("-k", "cpu and not asr")),
)
RETURNS_A_TUPLE = ReturnsATuple(
    "returns-a-tuple", Breaks(("contract/result-signature",), MULTI_METHOD, ("-k", "cpu and not asr"))
)
UNKNOWN_METHOD_IS_KEY_ERROR = UnknownMethodIsKeyError(
    "unknown-method-is-key-error",
    Breaks(("contract/error-class",), BAD_INPUTS, ("-k", "init_with_a_bad_method and unknown-method-cpu")),
)
REUSES_OUTPUT_BUFFERS = ReusesOutputBuffers(
    "reuses-output-buffers",
    Breaks(("contract/results-owned",), MULTI_METHOD, ("-k", "cpu and not asr")),
)
STATS_AS_FLOATS = StatsAsFloats(
    "stats-as-floats",
    Breaks(
        ("contract/result-signature",),
        DIFFERENTIAL,
        ("-k", "execute_calls and cpu", "--generated-no-shrink"),
    ),
)
LOWER_FREES_EXAMPLE_INPUTS = LowerFreesExampleInputs(
    "lower-frees-example-inputs",
    Breaks(("contract/inputs-untouched",), LOWERING, ("-k", "cpu and add_mul and float32")),
)
