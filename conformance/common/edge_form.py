"""The edge form of a graph, as a backend's ``ReplaceViewCopyWithViewPass`` receives it (SPEC §1a): views
functionalized into their ``*_copy`` twins, ``meta["val"]`` on every node (as ``torch.export`` leaves it).

The vocabulary the suite's graphs are written in (:func:`view_twin`, :func:`is_view_op`), fake values on a
hand-built graph (:func:`with_fake_values`), and :func:`edge_graph`, which exports a module into the edge
form: parameters and buffers become ordinary inputs, and each write-back becomes an explicit ``aten.copy_``
into that input at the end of the graph, so a pass that only sees a ``GraphModule`` can still see the
mutation. The catalogue (``conformance/lowering/view_pass_cases.py``) and the generated graphs
(``conformance/differential/graph_specs.py``) are built with it. No backend is imported here.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch._ops import OpOverload
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

__all__ = ["edge_graph", "is_view_op", "view_twin", "with_fake_values"]

aten = torch.ops.aten
Inputs = tuple[torch.Tensor, ...]


def _twin(op: OpOverload, name: str) -> OpOverload | None:
    packet = getattr(aten, name, None)
    return getattr(packet, op._overloadname, None) if packet is not None else None


def view_twin(op: object) -> OpOverload | None:
    """The view op of a ``*_copy`` op (``slice_copy.Tensor`` → ``slice.Tensor``), or None if it has none."""
    if not isinstance(op, OpOverload) or op.namespace != "aten" or not op._opname.endswith("_copy"):
        return None
    twin = _twin(op, op._opname.removesuffix("_copy"))
    return twin if twin is not None and twin.is_view else None


def is_view_op(op: object) -> bool:
    """An op whose schema returns an alias of an argument without writing it (``Tensor(a) -> Tensor(a)``)."""
    return isinstance(op, OpOverload) and op.is_view


# Export's reshape of a fresh tensor: an alias at run time whose schema does not say so; edge form makes it
# a view_copy too.
_UNSAFE_VIEWS = (aten._unsafe_view.default,)


def _copy_twin(view: OpOverload) -> OpOverload:
    if view in _UNSAFE_VIEWS:
        return aten.view_copy.default
    twin = _twin(view, f"{view._opname}_copy")
    if twin is None:
        raise ValueError(f"{view} has no *_copy twin: the catalogue cannot put this graph in edge form")
    return twin


def with_fake_values(module: GraphModule, inputs: Inputs) -> GraphModule:
    """``module`` with ``meta["val"]`` on every node, propagated from ``inputs`` (as ``torch.export`` leaves
    them: each input's layout, strides and storage offset included)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        FakeTensorProp(module).propagate(*inputs)
    return module


def edge_graph(module: nn.Module, inputs: Inputs) -> tuple[GraphModule, Inputs]:
    """Export ``module``, decompose to core ATen, turn views into ``*_copy`` ops, make write-backs explicit.

    The result takes parameters, buffers and constants first (in the export signature's order), then the
    user inputs; every buffer or input the program writes back gets an ``aten.copy_`` into its placeholder
    just before the output, which returns the user outputs only. Copy nodes are named after their op.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        exported = torch.export.export(module, inputs, strict=False)
        exported = exported.run_decompositions(torch.export.default_decompositions())
    gm, signature = exported.graph_module, exported.graph_signature
    graph = gm.graph
    tensors = {**exported.state_dict, **exported.constants}
    user = iter(inputs)
    values = tuple(
        next(user) if spec.kind is InputKind.USER_INPUT else tensors[spec.target].detach().clone()  # type: ignore[index]
        for spec in signature.input_specs
    )
    placeholder_of = {spec.target: spec.arg.name for spec in signature.input_specs}  # type: ignore[union-attr]
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    output = next(n for n in graph.nodes if n.op == "output")
    results, kept = output.args[0], []
    for spec, value in zip(signature.output_specs, results, strict=True):  # type: ignore[arg-type]
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
            target = placeholders[placeholder_of.get(spec.target, spec.target)]  # type: ignore[arg-type]
            with graph.inserting_before(output):
                graph.call_function(aten.copy_.default, (target, value))
        else:
            kept.append(value)
    output.args = (tuple(kept),)
    for node in list(graph.nodes):
        if node.op == "call_function" and (is_view_op(node.target) or node.target in _UNSAFE_VIEWS):
            copy_op = _copy_twin(node.target)  # type: ignore[arg-type]
            with graph.inserting_before(node):
                replacement = graph.create_node(
                    "call_function", copy_op, node.args, node.kwargs, name=copy_op._opname
                )
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
    graph.lint()
    result = GraphModule(nn.Module(), graph)
    return with_fake_values(result, values), values
