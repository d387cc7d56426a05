"""Alias analysis of an edge graph, for the view-copy pass (``view_copy_pass.py``): which storages each value
may share, who writes what and when, and which inputs the program writes back after the graph.

Read from the ops' schemas (alias sets, written arguments); anything the analysis does not understand aliases
all its inputs and writes all of them, so every answer errs on the safe side: a copy judged with it is kept
whenever a write to its source cannot be ruled out.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload
from torch.export.graph_signature import ExportGraphSignature
from torch.fx import Node

from reference_impl.lowering.edge import COPY_TO_VIEW, VIEW_TO_COPY

__all__ = [
    "AliasGraph",
    "ProgramMutations",
    "bound_arguments",
    "is_aliasing_op",
    "is_getitem",
    "is_write",
    "nodes_in",
    "output_node",
    "returns_list",
]


# --- schema helpers


def bound_arguments(node: Node) -> list[tuple[Any, Any]]:
    """(schema argument, value) pairs of an OpOverload call, positional and keyword alike."""
    schema = node.target._schema  # type: ignore[union-attr]
    bound = []
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args) and not argument.kwarg_only:
            bound.append((argument, node.args[index]))
        elif argument.name in node.kwargs:
            bound.append((argument, node.kwargs[argument.name]))
    return bound


def nodes_in(value: Any) -> list[Node]:
    """The graph nodes in an argument: itself, or those inside its lists, tuples and dicts."""
    if isinstance(value, Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in nodes_in(item)]
    if isinstance(value, dict):
        return [n for item in value.values() for n in nodes_in(item)]
    return []


def is_write(argument: Any) -> bool:
    """The schema marks this argument as written (``Tensor(a!)``)."""
    return argument.alias_info is not None and argument.alias_info.is_write


def _aliased_sets(op: OpOverload) -> set[str]:
    return {s for r in op._schema.returns if r.alias_info is not None for s in r.alias_info.before_set}


def _may_be_returned(argument: Any, returned: set[str]) -> bool:
    """The schema says the op's result may share this argument's memory: a return in its alias set, or a
    wildcard (``Tensor(a -> *) self`` of ``split``/``unbind``, whose ``Tensor[]`` items are views of it)."""
    info = argument.alias_info
    return info is not None and bool(set(info.before_set) & returned or "*" in info.after_set)


def is_aliasing_op(op: Any) -> bool:
    """A view, a view-copy, or any op whose output may share an input's memory without writing it."""
    if op in COPY_TO_VIEW or op in VIEW_TO_COPY:
        return True
    if not isinstance(op, OpOverload):
        return False
    returned = _aliased_sets(op)
    return any(_may_be_returned(a, returned) and not a.alias_info.is_write for a in op._schema.arguments)


def returns_list(node: Node) -> bool:
    """The op returns a ``Tensor[]`` (``split``, ``unbind``), whose items a ``getitem`` takes."""
    return isinstance(node.target, OpOverload) and any(
        str(r.type).startswith("List[") for r in node.target._schema.returns
    )


def _may_hold_tensor(node: Node) -> bool:
    # Without a fake value we cannot rule a tensor out, so we assume one.
    if "val" not in node.meta:
        return True
    return _holds_tensor(node.meta["val"])


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(item) for item in value)
    return isinstance(value, torch.Tensor)


def output_node(graph: torch.fx.Graph) -> Node:
    """The graph's ``output`` node."""
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def is_getitem(node: Node) -> bool:
    """Python indexing of a value (an item of a list an op returned, or of a tensor)."""
    return node.op == "call_function" and node.target is operator.getitem


# --- alias analysis


class AliasGraph:
    """Which storages (named by the node that made them) each value may share, and who writes what, when.

    ``as_views`` are ``*_copy`` nodes treated as already rewritten: their value shares their base's storage.
    Anything the analysis does not understand aliases all its inputs and writes all of them: conservative.
    """

    def __init__(self, graph: torch.fx.Graph, as_views: set[Node]) -> None:
        self.order: dict[Node, int] = {}
        self.roots: dict[Node, frozenset[Node]] = {}
        self.writes: list[tuple[int, Node, frozenset[Node]]] = []
        for index, node in enumerate(graph.nodes):
            self.order[node] = index
            self.roots[node] = self._roots(node, as_views)
            written = self._written(node)
            if written:
                roots = frozenset().union(*(self.roots_of(n) for n in written))
                self.writes.append((index, node, roots))

    def roots_of(self, node: Node) -> frozenset[Node]:
        return self.roots.get(node, frozenset({node}))

    def _union(self, nodes: list[Node]) -> frozenset[Node]:
        return frozenset().union(*(self.roots_of(n) for n in nodes))

    def _roots(self, node: Node, as_views: set[Node]) -> frozenset[Node]:
        if node.op in ("placeholder", "get_attr", "output"):
            return frozenset({node})
        if node in as_views:
            return self._union(nodes_in(node.args[0]))
        if is_getitem(node):
            return self._union(nodes_in(node.args[0])) or frozenset({node})
        if node.op == "call_function" and isinstance(node.target, OpOverload):
            returned = _aliased_sets(node.target)
            sources = [
                n
                for argument, value in bound_arguments(node)
                if _may_be_returned(argument, returned)
                for n in nodes_in(value)
            ]
            return self._union(sources) if sources else frozenset({node})
        return frozenset({node}) | self._union(nodes_in((node.args, node.kwargs)))

    @staticmethod
    def _written(node: Node) -> list[Node]:
        if node.op == "call_function" and isinstance(node.target, OpOverload):
            return [n for a, v in bound_arguments(node) if is_write(a) for n in nodes_in(v)]
        if node.op == "call_function" and is_getitem(node):
            return []
        if node.op == "call_method":
            name = str(node.target)
            in_place = name.endswith("_") and not name.startswith("__")
            return nodes_in(node.args[:1]) if in_place else []
        if node.op in ("call_function", "call_module"):
            return [n for n in nodes_in((node.args, node.kwargs)) if _may_hold_tensor(n)]
        return []


# --- program-level mutations


@dataclass(frozen=True)
class ProgramMutations:
    """From an export graph signature: inputs written back after the graph, and the outputs carrying them."""

    placeholders: frozenset[str] = frozenset()
    outputs: frozenset[str] = frozenset()

    @classmethod
    def from_signature(cls, signature: ExportGraphSignature | None) -> ProgramMutations:
        if signature is None:
            return cls()
        placeholders: set[str] = set()
        outputs: set[str] = set()
        for spec in signature.output_specs:
            if not spec.kind.name.endswith("_MUTATION"):
                continue
            if getattr(spec.arg, "name", None):
                outputs.add(spec.arg.name)
            for input_spec in signature.input_specs:
                name = getattr(input_spec.arg, "name", None)
                if name is not None and spec.target in (input_spec.target, name):
                    placeholders.add(name)
        return cls(frozenset(placeholders), frozenset(outputs))
