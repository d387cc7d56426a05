"""Plans: the arguments of one protocol call of the differential state machine, as data.

A plan (:class:`LowerPlan`, :class:`CorruptPlan`, :class:`InputsPlan`, :class:`OutputsPlan`) is a small frozen
dataclass whose ``repr`` is the code that makes it, so a shrunk failure prints as a runnable sequence of
calls; the same plan builds the same arguments for the backend under test and for the oracle. The machine
that makes the calls is ``conformance/common/protocol_machine.py``; what the plans build from a zoo method,
and eager's answer, are in ``conformance/common/protocol_inputs.py``; the strategies that draw them in
``conformance/common/protocol_strategies.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from conformance.common.contract_surface import python_value
from conformance.models import get_model
from conformance.protocol import SKIP_COPY_OPTION

__all__ = [
    "BAD_INPUTS",
    "DTYPE",
    "MENU",
    "OPAQUE",
    "OUTPUT_KINDS",
    "SIZES",
    "SKIP_COPY_OPTION",
    "VARIANT",
    "CorruptPlan",
    "InputsPlan",
    "LowerPlan",
    "OddArgument",
    "OutputsPlan",
]

#: The zoo models the machine lowers (float32: every one is pre-lowered for both targets), plus a method
#: that no backend can lower (an op with no kernel) for failing lowers in the middle of a sequence.
MENU: tuple[str, ...] = ("add_mul", "asr", "llm")
OPAQUE = "opaque"
DTYPE = torch.float32


@dataclass(frozen=True)
class LowerPlan:
    """``lower`` of zoo model ``model`` (float32), its methods renamed to ``names`` (None: the model's own),
    with ``options`` (sorted ``(key, value)`` pairs)."""

    model: str
    names: tuple[str, ...] | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def zoo_methods(self) -> tuple[str, ...]:
        return ("forward",) if self.model == OPAQUE else get_model(self.model).methods

    def method_names(self) -> tuple[str, ...]:
        return self.names if self.names is not None else self.zoo_methods()


@dataclass(frozen=True)
class CorruptPlan:
    """How ``init`` gets its program: ``intact``, or ``truncated`` / ``flipped`` (one byte at fraction
    ``at``), ``trailing`` (junk appended), ``empty``, ``not-bytes`` (a str)."""

    kind: str = "intact"
    at: float = 0.5

    def apply(self, program: bytes) -> object:
        if self.kind == "intact":
            return program
        if self.kind == "truncated":
            return program[: int(len(program) * self.at)]
        if self.kind == "flipped":
            index = min(len(program) - 1, int(len(program) * self.at))
            return program[:index] + bytes([program[index] ^ 0x5A]) + program[index + 1 :]
        if self.kind == "trailing":
            return program + b"\x00trailing bytes"
        if self.kind == "empty":
            return b""
        return "not a program"


#: Ways an ``inputs`` argument is broken (``none``: it is not).
BAD_INPUTS: tuple[str, ...] = (
    "fewer", "more", "none-element", "int-element", "bare-tensor", "none-inputs", "wrong-dtype",
    "wrong-rank", "wrong-size", "empty-size", "size-below", "size-above",
)  # fmt: skip
#: ``bad`` (of :class:`InputsPlan`) or ``kind`` (of :class:`OutputsPlan`) ``variant:<v>``: the argument's
#: tensor changed by variant ``<v>`` of ``conformance/common/contract_surface.py`` (any dtype, device, rank,
#: size, layout, or a value of another Python type), whether valid or not: the oracle says.
VARIANT = "variant:"
#: Sizes for a method's dynamic dimensions (``Dim(min, max)``): inside the range, and just past it.
SIZES: tuple[str, ...] = ("example", "min", "max", "mid")


@dataclass(frozen=True)
class InputsPlan:
    """The ``inputs`` of one execute, for whatever method it goes to: values from ``seed``; input ``i`` in
    ``layouts[i % len(layouts)]``; dynamic sizes at ``size``; broken as ``bad`` (at input ``bad_index``);
    ``on_device``: already on the handle's CUDA device (a CUDA target), else host tensors."""

    seed: int = 0
    layouts: tuple[str, ...] = ("contiguous",)
    size: str = "example"
    bad: str = "none"
    bad_index: int = 0
    on_device: bool = False


#: Ways an ``outputs=`` argument is given: not at all, right, or broken one way.
OUTPUT_KINDS: tuple[str, ...] = (
    "none", "provided", "one-more", "one-fewer", "wrong-dtype", "wrong-shape", "non-tensor", "bare-tensor",
    "other-device",
)  # fmt: skip


@dataclass(frozen=True)
class OutputsPlan:
    kind: str = "none"


#: Protocol method -> its positional parameters, as the contract names them (``outputs=`` is optional).
POSITIONAL: dict[str, tuple[str, ...]] = {
    "init": ("program", "method"),
    "execute": ("handle", "inputs"),
    "destroy": ("handle",),
    "execute_stats": ("handle",),
    "set_option": ("key", "value"),
    "get_option": ("key",),
}


@dataclass(frozen=True)
class OddArgument:
    """A call of ``method`` whose argument ``parameter`` is left out (``kind="missing"``: it and those after
    it), replaced by a value of Python type ``detail`` (``kind="type"``: a name of
    ``conformance.common.contract_surface.PYTHON_VALUES``), or by ``count`` times the string ``detail``
    (``kind="limit"``: a string at or past a limit)."""

    method: str
    parameter: str
    kind: str
    detail: str = ""
    count: int = 0

    def value(self) -> object:
        return self.detail * self.count if self.kind == "limit" else python_value(self.detail)

    def arguments(self, valid: list[object]) -> list[object]:
        """``valid`` (the call's arguments, right) with this argument changed."""
        position = POSITIONAL[self.method].index(self.parameter)
        if self.kind == "missing":
            return valid[:position]
        return [*valid[:position], self.value(), *valid[position + 1 :]]
