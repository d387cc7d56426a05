"""Broken backends for the bad-inputs and program-format chapters: each wraps the reference backend and
slips one way a real backend does, and declares (``breaks``) the rules those chapters must fail it on.

``tests/conformance/test_broken_chapter_backends.py`` runs each through its chapter (CPU cases only: every bug
here is in the host-side wrapper, the same for either target) and holds the declaration true; the reference
passes the same selection. ``python -m tests.rule_coverage`` lists them per rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import BAD_INPUTS, PROGRAM_FORMAT, Forwarding
from tests.rule_coverage import Breaks

# ============================================================================================ bad inputs


class TrustsItsArguments(Forwarding):
    """``execute`` checks nothing itself: it hands the handle's runner whatever ``inputs`` it got and copies
    the results into ``outputs`` with ``copy_``. So callers get AOTInductor's own ``RuntimeError`` (wrong
    count), pybind's ``TypeError`` (a non-tensor), an ``AttributeError`` (not a handle), a silent run on a
    wrongly shaped tensor (the kernel reads ``[4, 32]`` whatever it was given), or a silent cast/short copy
    into the caller's outputs. (CUDA handles keep the reference's path: the bug is in the CPU wrapper.)"""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        if getattr(handle, "device", None) is not None and handle.device.type == "cuda":
            return REFERENCE.execute(handle, inputs, outputs)
        with torch.no_grad():
            results = list(handle._runner.run(inputs))
        if outputs is None:
            return results
        for dst, src in zip(outputs, results):  # noqa: B905 - the bug: no count check
            dst.copy_(src)
        return list(outputs)


class DestroyIsANoOp(Forwarding):
    """``destroy`` does nothing, "the runner is freed when the handle is garbage collected": a destroyed
    handle still executes, still reports stats, and can be destroyed again, silently."""

    def destroy(self, handle: Any) -> None:
        return None


class LoadErrorsAsRuntimeError(Forwarding):
    """``init`` reports every load failure as ``RuntimeError("failed to load ...")``, as a C++ loader behind
    pybind does (ExecuTorch's bindings turn ``Error::InvalidProgram`` into ``RuntimeError``): an unknown
    method, a corrupt, truncated, empty or non-bytes program is refused, but not as an invalid argument."""

    def init(self, program: bytes, method: str) -> object:
        try:
            return REFERENCE.init(program, method)
        except ValueError as exc:
            raise RuntimeError(f"failed to load method {method!r} of the program: {exc}") from exc


#: What ``execute`` lets through when it checks nothing (``wrong-size-empty`` is left out: the kernel would
#: read past an empty tensor's storage; the dtype rules: ``CASTS_INPUTS`` proves them).
UNCHECKED_ARGUMENTS = (
    "one-input-fewer", "one-input-more", "no-inputs", "wrong-rank-3d", "wrong-rank-1d", "wrong-size",
    "wrong-size-transposed", "non-tensor-element", "none-element", "inputs-none", "inputs-a-bare-tensor",
    "outputs-one-more", "outputs-wrong-dtype", "outputs-wrong-shape", "outputs-non-tensor",
    "outputs-a-bare-tensor", "not-a-handle",
)  # fmt: skip
TRUSTS_ITS_ARGUMENTS = TrustsItsArguments(
    "trusts-its-arguments",
    Breaks(
        tuple(f"bad_inputs/{rule}" for rule in UNCHECKED_ARGUMENTS),
        BAD_INPUTS,
        (
            "-k",
            "(change_nothing and cpu-program and not wrong-dtype and not wrong-size-empty)"
            " or (bad_outputs and cpu-program) or something_not_a_handle",
        ),
    ),
)


class ZeroFillsEmptyInputs(Forwarding):
    """Meets an empty input where the method's shape is static with zeros of that shape ("an empty batch
    means nothing to add"): the call runs on zeros instead of being rejected, and the caller never learns
    its tensor was empty (breaks bad_inputs/wrong-size-empty)."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> Any:
        specs = getattr(getattr(handle, "io", None), "inputs", None)
        if specs is not None and isinstance(inputs, (list, tuple)):
            inputs = [
                torch.zeros(spec.shape, dtype=t.dtype, device=t.device)
                if torch.is_tensor(t) and t.numel() == 0 and spec.is_static and t.dim() == len(spec.shape)
                else t
                for t, spec in zip(inputs, specs, strict=False)
            ] + list(inputs[len(specs) :])
        return REFERENCE.execute(handle, inputs, outputs)


ZERO_FILLS_EMPTY_INPUTS = ZeroFillsEmptyInputs(
    "zero-fills-empty-inputs",
    Breaks(
        ("bad_inputs/wrong-size-empty",),
        BAD_INPUTS,
        ("-k", "change_nothing and wrong-size-empty-cpu-program"),
    ),
)
DESTROY_IS_A_NO_OP = DestroyIsANoOp(
    "destroy-is-a-no-op",
    Breaks(
        ("bad_inputs/execute-after-destroy", "bad_inputs/destroy-twice", "bad_inputs/stats-after-destroy"),
        BAD_INPUTS,
        ("-k", "destroyed_handle and cpu-program"),
    ),
)
LOAD_ERRORS_AS_RUNTIME_ERROR = LoadErrorsAsRuntimeError(
    "load-errors-as-runtime-error",
    Breaks(
        (
            "bad_inputs/unknown-method",
            "bad_inputs/unknown-method-empty-name",
            "bad_inputs/method-not-a-string",
            "bad_inputs/corrupt-program",
        ),
        BAD_INPUTS,
        ("-k", "(bad_method or corrupt_program) and cpu-program"),
    ),
)

# ======================================================================================== program format


class LowersOnlyTheFirstMethod(Forwarding):
    """``lower`` takes the first method of the mapping and silently drops the rest ("a program is one
    ``forward``", as exporters built for a single entry point do): the other methods are not in the file."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        first = dict(list(methods.items())[:1]) if isinstance(methods, Mapping) else methods
        return REFERENCE.lower(first, device=device, options=options)


LOAD_ERRORS_AS_RUNTIME_ERROR_FORMAT = LoadErrorsAsRuntimeError(
    "load-errors-as-runtime-error",
    Breaks(
        tuple(
            f"program_format/{r}"
            for r in ("empty", "not-bytes", "truncated", "flipped-byte", "trailing-data")
        ),
        PROGRAM_FORMAT,
        (
            "-k",
            "empty_program or not_bytes or trailing_bytes"
            " or (truncated_program and cpu-program and three-quarters)"
            " or (flipped_byte and cpu-program and (first-byte or last-byte))",
        ),
    ),
)
LOWERS_ONLY_THE_FIRST_METHOD = LowersOnlyTheFirstMethod(
    "lowers-only-the-first-method",
    Breaks(("program_format/multi-method",), PROGRAM_FORMAT, ("-k", "every_method and cpu-program")),
)
