"""Export-time device placement of method inputs and outputs (upstream's ``PropagateDeviceConfig``).

Upstream ExecuTorch retired the runtime option ``skip_copy_output_to_cpu_for_method`` in June 2026 (#20239):
whether a method's inputs arrive on the device and whether its outputs stay there is decided when the
program is built, per method, with two flags, each a ``bool`` (every method) or ``{method: bool}``:

* ``skip_h2d_for_method_inputs`` — the caller holds the inputs on the device: nothing is copied
  host→device, and a host tensor is an invalid-argument error at execute;
* ``skip_d2h_for_method_outputs`` — outputs are returned as ordinary CUDA tensors: nothing is copied
  device→host.

A flag that covers a method *fixes* that method's placement in the program (``True`` or ``False``); a
method it does not cover is *unfixed* (``None``) and the runtime option may still keep its outputs on the
device. Precedence: export time wins. Naming a method in the runtime option when its outputs were fixed to
the host (``False``) is a conflict, which ``lower`` and ``init`` reject naming both keys.

On a CPU target the device is the host: the flags are accepted and change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PLACEMENT_KEYS",
    "SKIP_D2H",
    "SKIP_H2D",
    "MethodPlacement",
    "PlacementError",
    "placement_conflicts",
    "resolve_placement",
]

SKIP_H2D = "skip_h2d_for_method_inputs"
SKIP_D2H = "skip_d2h_for_method_outputs"
PLACEMENT_KEYS = (SKIP_H2D, SKIP_D2H)


class PlacementError(ValueError):
    """A device-placement option breaks a rule; the message names the key and the rule."""


@dataclass(frozen=True)
class MethodPlacement:
    """One method's export-time placement: ``None`` where no flag covers it (the runtime decides)."""

    inputs_on_device: bool | None = None
    outputs_on_device: bool | None = None

    def to_json(self) -> dict[str, bool | None]:
        return {SKIP_H2D: self.inputs_on_device, SKIP_D2H: self.outputs_on_device}

    @classmethod
    def from_json(cls, raw: object) -> MethodPlacement:
        """From a blob's ``extra["placement"]`` (absent in programs made before placement existed)."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict) or set(raw) != set(PLACEMENT_KEYS):
            raise PlacementError(f'blob extra["placement"] must have the keys {PLACEMENT_KEYS}: {raw}')
        for key in PLACEMENT_KEYS:
            if raw[key] is not None and not isinstance(raw[key], bool):
                raise PlacementError(f'blob extra["placement"][{key!r}] must be a bool or null: {raw[key]!r}')
        return cls(raw[SKIP_H2D], raw[SKIP_D2H])


def _flag(key: str, value: object, methods: Iterable[str]) -> dict[str, bool]:
    """The methods flag ``key`` covers, and its value for each."""
    names = list(methods)
    if isinstance(value, bool):
        return dict.fromkeys(names, value)
    if not isinstance(value, Mapping):
        raise PlacementError(
            f"option {key!r} must be a bool (every method) or a mapping of method name to bool, "
            f"got {type(value).__name__} ({value!r:.80})"
        )
    unknown = sorted(repr(m) for m in value if m not in names)
    if unknown:
        raise PlacementError(
            f"option {key!r} names unknown method(s) {', '.join(unknown)}; the program's methods are "
            f"{names} (a misspelt name would silently keep the copy)"
        )
    for method, flag in value.items():
        if not isinstance(flag, bool):
            raise PlacementError(
                f"option {key!r}: the value for method {method!r} must be a bool, "
                f"got {type(flag).__name__} ({flag!r:.80})"
            )
    return dict(value)


def resolve_placement(options: Mapping[str, Any], methods: Iterable[str]) -> dict[str, MethodPlacement]:
    """Each method's placement from the lowering options (other keys are ignored here)."""
    names = list(methods)
    inputs = _flag(SKIP_H2D, options[SKIP_H2D], names) if SKIP_H2D in options else {}
    outputs = _flag(SKIP_D2H, options[SKIP_D2H], names) if SKIP_D2H in options else {}
    return {m: MethodPlacement(inputs.get(m), outputs.get(m)) for m in names}


def placement_conflicts(placements: Mapping[str, MethodPlacement], runtime_named: Iterable[str]) -> list[str]:
    """Methods whose outputs were fixed to the host at export time but are named in the runtime option."""
    named = set(runtime_named)
    return sorted(m for m, p in placements.items() if p.outputs_on_device is False and m in named)
