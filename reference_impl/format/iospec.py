"""Input/output metadata of a lowered method, carried in the blob header's ``extra["io"]``.

An AOTInductor package records neither input dtypes nor shapes (only a pytree call spec and, behind the
opt-in ``AOTI_RUNTIME_CHECK_INPUTS`` environment variable, generated checks that throw opaque C++ errors),
and a wrong dtype is *not* rejected: the kernel reinterprets the bytes. So lowering records, from the exported
program, what every user input and output must look like, and the runtime checks it before running anything.

JSON schema (``IO_SPEC_VERSION`` 1)::

    {"version": 1,
     "inputs":  [TENSOR, ...],        # user tensor inputs, in call order (non-tensor inputs are baked in)
     "outputs": [TENSOR, ...]}        # user tensor outputs, in order
    TENSOR = {"dtype": "float32",      # torch dtype name without the "torch." prefix
              "shape": [DIM, ...],
              "strides": [int, ...] | null}   # expected strides when static and not contiguous; else null
    DIM    = int                                     # static size
           | {"sym": "s27", "min": 2, "max": 32}     # one symbol; "max" null when unbounded
           | {"expr": "2*s27"}                       # derived size: not checked by the runtime

Checks: dtype exact; rank exact; static sizes exact; a symbol's size within its range and equal wherever the
symbol appears. One waiver: a symbol whose lower bound is exactly 2 also accepts size 1 — export cannot
declare a lower bound of 1 without a warning-laden 0/1 specialisation dance, so ``min=2`` usually means "from
1" (the ASR decoder's first step); AOTInductor offers the same waiver (``aot_inductor.check_lowerbound``).

Use ``io_spec_from_exported_program(ep).to_json()`` at lowering time and store it as ``extra["io"]``. The
module sits in the format floor because both wings use it: the lowering writes the spec, the runtime reads
it back and checks tensors against it.
Without it the runtime still checks the input count (from the package's call spec) and devices, and says
in ``DelegateHandle.io`` that dtypes and shapes are unchecked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reference_impl.format.argument_errors import IOSpecError, RuntimeArgumentError

__all__ = [
    "IO_SPEC_VERSION",
    "IOSpec",
    "SymDim",
    "TensorSpec",
    "io_spec_from_exported_program",
]

IO_SPEC_VERSION = 1

_DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class SymDim:
    """A dynamic size: symbol ``sym`` in ``[min, max]`` (``max`` None: unbounded); ``expr`` set for a derived
    size the runtime does not check."""

    sym: str | None = None
    min: int | None = None
    max: int | None = None
    expr: str | None = None

    def describe(self) -> str:
        if self.expr is not None:
            return self.expr
        upper = "inf" if self.max is None else str(self.max)
        return f"{self.sym}∈[{self.min}, {upper}]"


Dim = int | SymDim


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    shape: tuple[Dim, ...]
    strides: tuple[int, ...] | None = None  # only when static and not contiguous

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def describe_shape(self) -> str:
        return "[" + ", ".join(str(d) if isinstance(d, int) else d.describe() for d in self.shape) + "]"

    def to_json(self) -> dict[str, Any]:
        dims: list[Any] = []
        for d in self.shape:
            if isinstance(d, int):
                dims.append(d)
            elif d.expr is not None:
                dims.append({"expr": d.expr})
            else:
                dims.append({"sym": d.sym, "min": d.min, "max": d.max})
        return {
            "dtype": _dtype_name(self.dtype),
            "shape": dims,
            "strides": None if self.strides is None else list(self.strides),
        }

    @classmethod
    def from_json(cls, raw: object, where: str) -> TensorSpec:
        if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "strides"}:
            raise IOSpecError(f"{where} must be an object with keys dtype, shape, strides; got {raw!r}")
        dtype = _DTYPES.get(raw["dtype"]) if isinstance(raw["dtype"], str) else None
        if dtype is None:
            raise IOSpecError(f"{where}: unknown dtype {raw['dtype']!r}; known: {sorted(_DTYPES)}")
        if not isinstance(raw["shape"], list):
            raise IOSpecError(f"{where}: shape must be a list, got {raw['shape']!r}")
        shape: list[Dim] = []
        for i, d in enumerate(raw["shape"]):
            shape.append(_dim_from_json(d, f"{where} shape[{i}]"))
        strides = raw["strides"]
        if strides is not None and (
            not isinstance(strides, list)
            or len(strides) != len(shape)
            or not all(_is_int(s) for s in strides)
        ):
            raise IOSpecError(f"{where}: strides must be null or {len(shape)} ints, got {strides!r}")
        return cls(dtype, tuple(shape), None if strides is None else tuple(strides))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dim_from_json(d: object, where: str) -> Dim:
    if _is_int(d) and d >= 0:  # type: ignore[operator]
        return d  # type: ignore[return-value]
    if isinstance(d, dict) and set(d) == {"expr"} and isinstance(d["expr"], str):
        return SymDim(expr=d["expr"])
    if (
        isinstance(d, dict)
        and set(d) == {"sym", "min", "max"}
        and isinstance(d["sym"], str)
        and _is_int(d["min"])
        and (d["max"] is None or _is_int(d["max"]))
    ):
        return SymDim(sym=d["sym"], min=d["min"], max=d["max"])
    raise IOSpecError(f"{where} must be a size >= 0, {{sym, min, max}} or {{expr}}; got {d!r}")


@dataclass(frozen=True)
class IOSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": IO_SPEC_VERSION,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }

    @classmethod
    def from_json(cls, raw: object) -> IOSpec:
        where = 'blob extra["io"]'
        if not isinstance(raw, dict) or set(raw) != {"version", "inputs", "outputs"}:
            raise IOSpecError(f"{where} must be an object with keys version, inputs, outputs; got {raw!r}")
        if raw["version"] != IO_SPEC_VERSION:
            raise IOSpecError(f"{where}: version {raw['version']!r} is not supported (supported: 1)")
        parts = []
        for kind in ("inputs", "outputs"):
            items = raw[kind]
            if not isinstance(items, list):
                raise IOSpecError(f"{where}: {kind} must be a list, got {items!r}")
            parts.append(tuple(TensorSpec.from_json(t, f"{where} {kind}[{i}]") for i, t in enumerate(items)))
        return cls(parts[0], parts[1])

    # --- checks ------------------------------------------------------------------------------------------

    def check_shapes(
        self,
        kind: str,
        tensors: Sequence[torch.Tensor],
        specs: Sequence[TensorSpec],
        error: type[RuntimeArgumentError],
        method: str,
        *,
        bindings: dict[str, tuple[int, str]] | None = None,
    ) -> None:
        """Dtype and shape of every tensor against ``specs`` (count checked by the caller)."""
        bindings = {} if bindings is None else bindings
        for index, (tensor, spec) in enumerate(zip(tensors, specs, strict=True)):
            at = f"{kind}[{index}]"
            if tensor.dtype != spec.dtype:
                raise error(
                    f"{at}: method {method!r} expects dtype {spec.dtype}, got {tensor.dtype}; "
                    "inputs are never converted"
                )
            if tensor.dim() != len(spec.shape):
                raise error(
                    f"{at}: method {method!r} expects a {len(spec.shape)}-d tensor of shape "
                    f"{spec.describe_shape()}, got shape {list(tensor.shape)}"
                )
            for axis, (size, dim) in enumerate(zip(tensor.shape, spec.shape, strict=True)):
                _check_dim(at, axis, int(size), dim, spec, list(tensor.shape), method, error, bindings)


def _check_dim(
    at: str,
    axis: int,
    size: int,
    dim: Dim,
    spec: TensorSpec,
    shape: list[int],
    method: str,
    error: type[RuntimeArgumentError],
    bindings: dict[str, tuple[int, str]],
) -> None:
    if isinstance(dim, int):
        if size != dim:
            raise error(
                f"{at}: method {method!r} expects shape {spec.describe_shape()}, got {shape} "
                f"(dim {axis} must be {dim})"
            )
        return
    if dim.expr is not None or dim.sym is None:
        return
    low = dim.min if dim.min is not None else 0
    # Export cannot express a lower bound below 2 without specialising sizes 0 and 1, so a symbol declared
    # from 2 is usually meant to take 1 as well (the ASR decoder's first step); AOTInductor waives such
    # bounds with ``aot_inductor.check_lowerbound = False``. We waive the bound for size 1 only.
    lower_ok = size >= low or (low == 2 and size == 1)
    if not lower_ok or (dim.max is not None and size > dim.max):
        raise error(
            f"{at}: dim {axis} has size {size} but method {method!r} was lowered for "
            f"{dim.sym} in [{low}, {'inf' if dim.max is None else dim.max}] (shape {spec.describe_shape()})"
        )
    seen = bindings.get(dim.sym)
    if seen is None:
        bindings[dim.sym] = (size, f"{at} dim {axis}")
    elif seen[0] != size:
        raise error(
            f"{at}: dim {axis} has size {size} but {seen[1]} has size {seen[0]}; method {method!r} "
            f"requires them equal (both are the dynamic size {dim.sym})"
        )


# --- building the spec from an exported program ---------------------------------------------------------


def _tensor_spec(value: Any, ranges: dict[Any, Any], *, is_input: bool) -> TensorSpec:
    dims: list[Dim] = []
    static = True
    for size in value.shape:
        if isinstance(size, int):
            dims.append(size)
            continue
        static = False
        expr = size.node.expr
        if getattr(expr, "is_Integer", False):
            dims.append(int(expr))
        elif getattr(expr, "is_Symbol", False):
            vr = ranges.get(expr)
            low = int(vr.lower) if vr is not None and _finite(vr.lower) else 0
            high = int(vr.upper) if vr is not None and _finite(vr.upper) else None
            dims.append(SymDim(sym=str(expr), min=low, max=high))
        else:
            dims.append(SymDim(expr=str(expr)))
    strides: tuple[int, ...] | None = None
    if static and all(isinstance(d, int) for d in dims):
        actual = tuple(int(s) for s in value.stride())
        probe = torch.empty(tuple(int(d) for d in dims), device="meta")  # type: ignore[arg-type]
        if not _same_layout(actual, tuple(probe.stride()), tuple(int(d) for d in dims)):  # type: ignore[arg-type]
            strides = actual
    elif is_input and not _contiguous_symbolic(value):
        raise IOSpecError(
            f"an input of shape {list(value.shape)} has strides {list(value.stride())}: the runtime supports "
            "non-contiguous input layouts only for static shapes; export with contiguous example inputs"
        )
    return TensorSpec(value.dtype, tuple(dims), strides)


def _contiguous_symbolic(value: Any) -> bool:
    expected: Any = 1
    for size, stride in reversed(list(zip(value.shape, value.stride(), strict=True))):
        size_expr = getattr(getattr(size, "node", None), "expr", size)
        stride_expr = getattr(getattr(stride, "node", None), "expr", stride)
        if size_expr != 1 and stride_expr != expected:
            return False
        expected = expected * size_expr
    return True


def _finite(bound: Any) -> bool:
    try:
        return bool(bound.is_finite) if hasattr(bound, "is_finite") else abs(float(bound)) != float("inf")
    except (TypeError, ValueError):
        return False


def _same_layout(a: tuple[int, ...], b: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Strides equal wherever they matter (dims of size 1 and empty tensors have no meaningful stride)."""
    if any(s == 0 for s in shape):
        return True
    return all(x == y for x, y, n in zip(a, b, shape, strict=True) if n != 1)


def io_spec_from_exported_program(ep: torch.export.ExportedProgram) -> IOSpec:
    """The user inputs and outputs of ``ep`` (tensors only, in order), with dynamic dims and their ranges."""
    signature = ep.graph_signature
    nodes = {n.name: n for n in ep.graph.nodes}
    ranges = dict(ep.range_constraints)
    inputs = []
    for name in signature.user_inputs:
        value = nodes[name].meta.get("val")
        if isinstance(value, torch.Tensor):
            inputs.append(_tensor_spec(value, ranges, is_input=True))
    from torch.export.graph_signature import OutputKind

    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    returned = output_node.args[0]
    returned = list(returned) if isinstance(returned, (list, tuple)) else [returned]
    outputs = []
    for out_spec, arg in zip(signature.output_specs, returned, strict=False):
        if out_spec.kind != OutputKind.USER_OUTPUT:
            continue
        value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(value, torch.Tensor):
            outputs.append(_tensor_spec(value, ranges, is_input=False))
    return IOSpec(tuple(inputs), tuple(outputs))
