"""Generated edge graphs as data: a :class:`GraphSpec` (its inputs and a list of calls), and :func:`build`,
which turns it into the edge form a backend's ReplaceViewCopyWithViewPass receives (SPEC §1a).

A spec's inputs are :class:`InputSpec` (shape, dtype, layout, seed; :func:`make_input` makes them fresh),
its calls are :class:`Call` (one FX node each, naming earlier values ``V(i)``). ``repr(spec)`` is Python
that rebuilds it, so a shrunk failure is a runnable repro::

    import torch; from conformance.differential.graph_specs import *; module, inputs = build(GraphSpec(...))

The strategy that draws specs is ``conformance/differential/graph_strategies.py``. No backend and no
Hypothesis here.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node

from conformance.common.edge_form import with_fake_values

__all__ = [
    "DTYPES",
    "LAYOUTS",
    "Call",
    "GraphSpec",
    "InputSpec",
    "InvalidCall",
    "V",
    "build",
    "make_input",
    "node_target",
    "replace_refs",
    "resolve",
]

Inputs = tuple[torch.Tensor, ...]

#: How an input is laid out in memory (each keeps the input's shape): see :func:`make_input`.
LAYOUTS = ("contiguous", "transposed", "sliced", "offset", "expanded", "channels_last")
DTYPES = ("float32", "float64", "bfloat16")


# ============================================================================================ the data


@dataclass(frozen=True)
class V:
    """The value of node ``index`` (inputs first, then one per call), as an argument of a later call."""

    index: int

    def __repr__(self) -> str:
        return f"V({self.index})"


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: str
    layout: str
    seed: int


@dataclass(frozen=True)
class Call:
    """One node: ``target`` is ``aten.<op>.<overload>``, ``getitem``, ``torch.sin`` or ``method:<name>``
    (a ``call_method`` node); ``V(i)`` in ``args``/``kwargs`` (lists included) names earlier values."""

    target: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class GraphSpec:
    """A whole graph; ``repr`` is Python that rebuilds it
    (``from conformance.differential.graph_strategies import *``)."""

    inputs: tuple[InputSpec, ...]
    calls: tuple[Call, ...]
    outputs: Any


# ============================================================================================ building


def make_input(spec: InputSpec) -> torch.Tensor:
    """The input ``spec`` describes, fresh: values ±k/4 (k = 1..8) everywhere in its storage, laid out as
    ``spec.layout`` says (a layout that needs more dimensions than the shape has falls back to contiguous):

    * ``transposed``: the last two dimensions swapped in memory (a transposed view);
    * ``sliced``: every other row of a storage twice as long (a slice with step 2, starting at 1);
    * ``offset``: contiguous, starting 1-3 elements into its storage;
    * ``expanded``: the first dimension of size > 1 has stride 0 (one row seen many times);
    * ``channels_last``: NHWC memory order of a 4-d tensor.
    """
    dtype, shape = getattr(torch, spec.dtype), spec.shape
    gen = torch.Generator().manual_seed(spec.seed)

    def values(*size: int) -> torch.Tensor:
        k = torch.randint(1, 9, size, generator=gen)
        sign = torch.randint(0, 2, size, generator=gen) * 2 - 1
        return ((k * sign).to(torch.float64) / 4).to(dtype)

    layout, numel = spec.layout, math.prod(shape)
    if layout == "transposed" and len(shape) >= 2:
        return values(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    if layout == "sliced" and shape:
        return values(2 * shape[0], *shape[1:])[1::2]
    if layout == "offset":
        start = 1 + spec.seed % 3
        return values(numel + start + 1)[start : start + numel].view(shape)
    wide = [d for d, n in enumerate(shape) if n > 1]
    if layout == "expanded" and wide:
        one = list(shape)
        one[wide[0]] = 1
        return values(*one).expand(shape)
    if layout == "channels_last" and len(shape) == 4:
        return values(*shape).contiguous(memory_format=torch.channels_last)
    return values(*shape)


def node_target(name: str) -> tuple[str, Any]:
    """(FX op, target) of a :class:`Call` target name."""
    if name.startswith("method:"):
        return "call_method", name.removeprefix("method:")
    if name == "getitem":
        return "call_function", operator.getitem
    if name == "torch.sin":
        return "call_function", torch.sin
    _, op, overload = name.split(".")
    return "call_function", getattr(getattr(torch.ops.aten, op), overload)


def resolve(name: str) -> Any:
    """The op (or function, or method name) a :class:`Call` target names."""
    return node_target(name)[1]


def replace_refs(value: Any, fn: Callable[[V], Any]) -> Any:
    """``value`` with every ``V`` in it (lists and tuples included) replaced by ``fn(V)``."""
    if isinstance(value, V):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(replace_refs(v, fn) for v in value)
    return value


class InvalidCall(Exception):
    """The op rejected the call on the values it would meet: the call is dropped."""


def _graph(spec: GraphSpec) -> GraphModule:
    """The FX graph of ``spec``: placeholders ``x<i>``, one node per call, its outputs."""
    graph = Graph()
    nodes = [graph.placeholder(f"x{i}") for i in range(len(spec.inputs))]

    def node(ref: V) -> Node:
        return nodes[ref.index]

    for call in spec.calls:
        kind, target = node_target(call.target)
        kwargs = {k: replace_refs(v, node) for k, v in call.kwargs}
        nodes.append(graph.create_node(kind, target, replace_refs(call.args, node), kwargs))
    graph.output(replace_refs(spec.outputs, node))
    graph.lint()
    return GraphModule(nn.Module(), graph)


def build(spec: GraphSpec) -> tuple[GraphModule, Inputs]:
    """The edge graph ``spec`` describes, with ``meta["val"]`` on every node, and fresh inputs.
    :class:`InvalidCall` if torch's fake kernels reject a graph eager ran (not a graph a pass gets)."""
    inputs = tuple(make_input(s) for s in spec.inputs)
    try:
        return with_fake_values(_graph(spec), inputs), inputs
    except Exception as exc:
        raise InvalidCall(f"fake propagation failed: {type(exc).__name__}: {exc}") from exc
