"""What a zoo method takes and returns, for the differential state machine: its spec, the ``inputs`` and
``outputs=`` arguments a plan (``conformance/common/protocol_plans.py``) builds for it, and eager float64's
answer.

Values are judged against eager PyTorch in float64 (never against the oracle's bits); a method's dynamic
dimensions come from its ``dynamic_shapes`` (``Dim(min, max)``), so sizes at and past each bound can be built.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.common.contract_surface import apply_tensor_variant
from conformance.common.oracle import CallResult
from conformance.common.protocol_plans import DTYPE, VARIANT, InputsPlan, OutputsPlan
from conformance.common.strategies import TensorRecipe, dtype_name
from conformance.models import get_model

__all__ = ["InputSpec", "MethodSpec", "build_inputs", "build_outputs", "eager_float64", "method_spec"]


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    low: int
    high: int
    dynamic: tuple[tuple[int, int, int], ...] = ()  # (axis, min, max)


@dataclass
class MethodSpec:
    """One zoo method: its eager module (float32, CPU), example inputs and what its inputs may be."""

    module: torch.nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: tuple[InputSpec, ...]
    float64: torch.nn.Module = field(repr=False, default=None)  # type: ignore[assignment]


_SPECS: dict[tuple[str, str], MethodSpec] = {}


def method_spec(model: str, method: str) -> MethodSpec:
    """The spec of ``model``'s ``method`` (built once per process)."""
    key = (model, method)
    if key not in _SPECS:
        entry = get_model(model)
        module, example = entry.build(DTYPE, torch.device("cpu"))[method]
        dynamic = _dynamic_axes(module, entry.dynamic_shapes_for(method))
        specs = []
        for index, tensor in enumerate(example):
            low, high = 0, 8
            if not tensor.is_floating_point():
                low, high = int(tensor.min()), int(tensor.max()) + 1
            axes = tuple((axis, lo, hi) for (i, axis, lo, hi) in dynamic if i == index)
            specs.append(InputSpec(tuple(tensor.shape), tensor.dtype, low, high, axes))
        float64 = copy.deepcopy(module).to(dtype=torch.float64)
        _SPECS[key] = MethodSpec(module, tuple(example), tuple(specs), float64)
    return _SPECS[key]


def _dynamic_axes(module: torch.nn.Module, shapes: Any) -> list[tuple[int, int, int, int]]:
    """``(input index, axis, min, max)`` of every ``Dim`` in a method's ``dynamic_shapes``."""
    if not shapes:
        return []
    names = list(inspect.signature(module.forward).parameters)
    found = []
    for name, axes in shapes.items() if isinstance(shapes, dict) else enumerate(shapes):
        index = names.index(name) if isinstance(name, str) else int(name)
        for axis, dim in (axes or {}).items():
            found.append((index, int(axis), int(dim.min), int(dim.max)))
    return found


def eager_float64(spec: MethodSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    args = [t.detach().cpu().double() if t.is_floating_point() else t.detach().cpu() for t in inputs]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        out = spec.float64(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _size_for(spec: InputSpec, choice: str) -> tuple[int, ...]:
    shape = list(spec.shape)
    for axis, low, high in spec.dynamic:
        # Below a bound of 2: 0, not 1 (export cannot declare a bound of 1; a size-1 step is the reference's
        # waiver, and a backend that holds the declared bound is not wrong).
        below = 0 if low == 2 else low - 1
        shape[axis] = {
            "min": low,
            "max": high,
            "mid": (low + high) // 2,
            "below": below,
            "above": high + 1,
        }.get(choice, shape[axis])
    return tuple(shape)


def build_inputs(spec: MethodSpec, plan: InputsPlan, device: torch.device) -> object:
    """The ``inputs`` argument ``plan`` describes, for a method of ``spec``, on ``device``."""
    size = {"size-below": "below", "size-above": "above"}.get(plan.bad, plan.size)
    if not any(s.dynamic for s in spec.inputs) and plan.bad in ("size-below", "size-above"):
        size = "example"
    recipes = []
    for index, s in enumerate(spec.inputs):
        layout = plan.layouts[index % len(plan.layouts)]
        recipes.append(
            TensorRecipe(_size_for(s, size), dtype_name(s.dtype), layout, plan.seed + index, s.low, s.high)
        )
    tensors: list[Any] = [r.build(device) for r in recipes]
    at = plan.bad_index % max(1, len(tensors))
    bad = plan.bad
    if bad == "fewer":
        return tensors[:-1]
    if bad == "more":
        return [*tensors, tensors[0].clone()]
    if bad == "none-element":
        tensors[at] = None
    elif bad == "int-element":
        tensors[at] = 3
    elif bad == "bare-tensor":
        return tensors[0]
    elif bad == "none-inputs":
        return None
    elif bad == "wrong-dtype":
        t = tensors[at]
        tensors[at] = t.to(torch.float64 if t.dtype != torch.float64 else torch.float32)
        if not t.is_floating_point():
            tensors[at] = t.to(torch.int32)
    elif bad == "wrong-rank":
        tensors[at] = tensors[at].unsqueeze(0)
    elif bad == "wrong-size":
        t = tensors[at]
        tensors[at] = torch.cat([t, t], dim=-1) if t.dim() else t.reshape(1).repeat(2)
    elif bad == "empty-size":
        t = tensors[at]
        tensors[at] = t.narrow(-1, 0, 0) if t.dim() else t
    elif bad.startswith(VARIANT):  # any tensor a caller can make (conformance/common/contract_surface.py)
        tensors[at] = apply_tensor_variant(tensors[at], bad.removeprefix(VARIANT))
    return tensors


def build_outputs(plan: OutputsPlan, first: CallResult, target: torch.device) -> object:
    """The ``outputs=`` argument ``plan`` describes (None: not given), shaped after ``first``, the oracle's
    answer to the same call without ``outputs=`` (where it succeeded); ``target``: the machine's target
    device, where an ``other-device`` output made on the host goes."""
    if plan.kind == "none":
        return None
    outs = [t for t in first.value] if first.ok else [torch.empty(0)]
    where = [t.device for t in outs]
    made: list[Any] = [
        torch.full(t.shape, 1.5, dtype=t.dtype, device=d)
        if t.dtype.is_floating_point
        else torch.full(t.shape, 7, dtype=t.dtype, device=d)
        for t, d in zip(outs, where, strict=True)
    ]
    kind = plan.kind
    if kind == "one-more":
        made.append(made[0].clone())
    elif kind == "one-fewer":
        made = made[:-1]
    elif kind == "wrong-dtype":
        made[0] = made[0].to(torch.float64 if made[0].dtype != torch.float64 else torch.float32)
    elif kind == "wrong-shape":
        made[0] = torch.cat([made[0], made[0]]) if made[0].dim() else made[0].reshape(1)
    elif kind == "non-tensor":
        made[0] = 1.5
    elif kind == "bare-tensor":
        return made[0]
    elif kind == "other-device" and torch.cuda.is_available():
        other = "cpu" if made[0].is_cuda else target
        made[0] = made[0].to(other)
    elif kind.startswith(VARIANT) and made:
        made[0] = apply_tensor_variant(made[0], kind.removeprefix(VARIANT))
    return made
