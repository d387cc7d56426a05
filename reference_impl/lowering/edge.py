"""Edge-like graphs: ``torch.export``, core-ATen decomposition, and views functionalized into ``*_copy`` ops.

ExecuTorch's edge dialect carries no aliasing views: every view op is replaced by its ``*_copy`` twin, so
each value owns its memory. The CUDA backend's ``ReplaceViewCopyWithViewPass`` later undoes that where safe.
``VIEW_TO_COPY`` / ``COPY_TO_VIEW`` below are the single table both directions use.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

__all__ = [
    "COPY_TO_VIEW",
    "DEFAULT_PRESERVED_OPS",
    "VIEW_TO_COPY",
    "fake_arguments",
    "functionalize_views",
    "quiet_pytree_deprecation",
    "recompute_node_val",
    "refresh_fake_meta",
    "to_edge_graph",
]

_log = logging.getLogger(__name__)

# (view op, overload) pairs with a ``<op>_copy.<overload>`` twin. ``transpose``, ``t`` and ``unbind`` mostly
# decompose away under the core table (``narrow`` always does), but hand-built graphs can still hold them.
_VIEW_OPS: tuple[tuple[str, str], ...] = (
    ("slice", "Tensor"),
    ("select", "int"),
    ("view", "default"),
    ("view", "dtype"),
    ("permute", "default"),
    ("transpose", "int"),
    ("t", "default"),
    ("expand", "default"),
    ("unsqueeze", "default"),
    ("squeeze", "default"),
    ("squeeze", "dim"),
    ("squeeze", "dims"),
    ("alias", "default"),
    ("detach", "default"),
    ("unfold", "default"),
    ("diagonal", "default"),
    ("as_strided", "default"),
    ("split", "Tensor"),
    ("split_with_sizes", "default"),
    ("unbind", "int"),
    ("_reshape_alias", "default"),
)


def _overload(name: str, overload: str) -> OpOverload | None:
    # getattr chains, because an overload missing from one torch version must not break import on another.
    packet = getattr(torch.ops.aten, name, None)
    return getattr(packet, overload, None) if packet is not None else None


def _build_table() -> dict[OpOverload, OpOverload]:
    table: dict[OpOverload, OpOverload] = {}
    for name, overload in _VIEW_OPS:
        view, copy = _overload(name, overload), _overload(f"{name}_copy", overload)
        if view is not None and copy is not None:
            table[view] = copy
    return table


VIEW_TO_COPY: Mapping[OpOverload, OpOverload] = _build_table()
"""Every aliasing view op we know → its functional ``*_copy`` twin (same arguments, fresh output)."""

COPY_TO_VIEW: Mapping[OpOverload, OpOverload] = {copy: view for view, copy in VIEW_TO_COPY.items()}
"""The "view twin" of every ``*_copy`` op: what ``ReplaceViewCopyWithViewPass`` may retarget to."""

# One-way only: ``_unsafe_view`` is a view that export emits for reshapes of fresh tensors; its copy form is
# ``view_copy``, and the way back is the ordinary ``view``.
_EXTRA_TO_COPY: Mapping[OpOverload, OpOverload] = {
    op: torch.ops.aten.view_copy.default for op in (_overload("_unsafe_view", "default"),) if op is not None
}

DEFAULT_PRESERVED_OPS: tuple[OpOverload, ...] = (torch.ops.aten.scaled_dot_product_attention.default,)
"""Kept whole through decomposition: preprocess compiles SDPA itself (with the MATH kernel forced)."""


def to_edge_graph(
    module: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    *,
    dynamic_shapes: Any = None,
    preserve_ops: Iterable[OpOverload] = DEFAULT_PRESERVED_OPS,
) -> torch.export.ExportedProgram:
    """Export ``module``, decompose to core ATen (keeping ``preserve_ops``), turn every view into its copy."""
    exported = torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    table = torch.export.default_decompositions()
    for op in preserve_ops:
        table.pop(op, None)
    with quiet_pytree_deprecation():
        edge = exported.run_decompositions(table)
    functionalize_views(edge.graph_module)
    return edge


@contextlib.contextmanager
def quiet_pytree_deprecation() -> Iterator[None]:
    """Hide the ``LeafSpec`` FutureWarning that copying export's pytree specs raises inside torch itself."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        yield


def functionalize_views(graph_module: torch.fx.GraphModule) -> int:
    """Retarget every view op (in every nested graph) to its ``*_copy`` twin; returns how many changed."""
    top: list[torch.fx.Node] = []
    nested: list[torch.fx.Node] = []
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        retargeted = []
        for node in module.graph.nodes:
            copy = VIEW_TO_COPY.get(node.target) or _EXTRA_TO_COPY.get(node.target)
            if node.op == "call_function" and copy is not None:
                node.target = copy
                retargeted.append(node)
        if retargeted:
            module.graph.lint()
            module.recompile()
            (top if module is graph_module else nested).extend(retargeted)
    if top or nested:
        # Copies are contiguous where the views were strided, which changes the strides of everything
        # downstream too: the top-level graph is re-propagated; nested graphs get their copies' own values.
        refresh_fake_meta(graph_module, fallback_nodes=top)
        for node in nested:
            recompute_node_val(node)
    return len(top) + len(nested)


class _SymbolSafeFakeProp(FakeTensorProp):
    """Fake propagation that computes a ``*_copy`` node as its view twin made contiguous.

    Same value (a copy op returns a fresh contiguous tensor), but some copy ops' fake kernels guard on
    symbolic sizes where their views do not: ``slice_copy(pos, 0, None, s0)`` specialised ``s0`` in the
    program's shared ShapeEnv, silently turning a dynamic-shape export static.
    """

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _fake_value(target, args, kwargs)


def _fake_value(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``target(*args, **kwargs)`` on fake values, a ``*_copy`` op as its view made contiguous."""
    view = COPY_TO_VIEW.get(target)
    if view is None or "out" in kwargs:
        return target(*args, **kwargs)
    try:
        viewed = view(*args, **kwargs)
    except Exception:  # view_copy of a base no view fits (it reshapes): the copy op's own kernel
        return target(*args, **kwargs)
    return torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda t: t.clone(memory_format=torch.contiguous_format), viewed
    )


def materialize_remaining_copies(graph_module: torch.fx.GraphModule) -> int:
    """Rewrite each ``*_copy`` node the view pass kept as ``view`` + ``clone``; returns how many.

    Same value (a copy op is its view, cloned contiguous) and no aliasing (the clone is fresh), but
    inductor compiles ``clone`` itself, whereas some copy ops have no AOTInductor C shim and would go
    through the proxy executor (``aten.select_copy.int`` does, in torch 2.11 and 2.13). Ops with more
    than one output (``split_copy``, ``unbind_copy``) are left as they are.
    """
    changed = 0
    for node in list(graph_module.graph.nodes):
        view = COPY_TO_VIEW.get(node.target) if node.op == "call_function" else None
        if view is None or "out" in node.kwargs or len(view._schema.returns) != 1:
            continue
        if str(view._schema.returns[0].type) != "Tensor":
            continue
        node.target = view
        with graph_module.graph.inserting_after(node):
            clone = graph_module.graph.call_function(
                torch.ops.aten.clone.default, (node,), {"memory_format": torch.contiguous_format}
            )
        node.replace_all_uses_with(clone, delete_user_cb=lambda user, fresh=clone: user is not fresh)
        recompute_node_val(node)
        recompute_node_val(clone)
        changed += 1
    if changed:
        graph_module.graph.lint()
        graph_module.recompile()
    return changed


def refresh_fake_meta(
    graph_module: torch.fx.GraphModule, fallback_nodes: Sequence[torch.fx.Node] = ()
) -> bool:
    """Recompute ``meta["val"]`` of the top-level graph by fake propagation from the placeholders' values.

    Returns False (and recomputes only ``fallback_nodes``, one op at a time) when the placeholders carry no
    fake values or propagation fails, so those nodes' metadata never describes the old graph.
    """
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    values = [n.meta.get("val") for n in placeholders]
    mode = next((v.fake_mode for v in values if hasattr(v, "fake_mode")), None)
    if mode is not None and all("val" in n.meta for n in placeholders):
        try:
            _SymbolSafeFakeProp(graph_module, mode).propagate_dont_convert_inputs(*values)
        except Exception as error:  # any failure only costs precision, never correctness
            _log.debug("fake propagation failed, recomputing single nodes: %s", error)
        else:
            for node in graph_module.graph.nodes:
                _refresh_tensor_meta(node)
            return True
    for node in fallback_nodes:
        recompute_node_val(node)
    return False


def _refresh_tensor_meta(node: torch.fx.Node) -> None:
    # ``tensor_meta`` duplicates shape/stride facts of ``val``; a stale copy is worse than none.
    if "tensor_meta" not in node.meta:
        return
    value = node.meta.get("val")
    try:
        from torch.fx.passes.shape_prop import _extract_tensor_metadata
    except ImportError:  # private helper: drop the stale copy if a torch version moved it
        node.meta.pop("tensor_meta")
        return
    if isinstance(value, torch.Tensor):
        node.meta["tensor_meta"] = _extract_tensor_metadata(value)
    else:
        node.meta.pop("tensor_meta")


def recompute_node_val(node: torch.fx.Node) -> bool:
    """Run one node's op on its inputs' fake values and store the result; False if that is impossible."""
    if not isinstance(node.target, OpOverload):
        return False
    try:
        args, kwargs = fake_arguments(node)
        value = _fake_value(node.target, args, kwargs)
    except Exception as error:  # no fake inputs, or the op rejects them: leave the node as it was
        _log.debug("cannot recompute meta['val'] of %s: %s", node.name, error)
        return False
    node.meta["val"] = value
    _refresh_tensor_meta(node)
    for user in node.users:
        if user.target is operator.getitem and isinstance(node.meta["val"], (list, tuple)):
            user.meta["val"] = node.meta["val"][user.args[1]]
            _refresh_tensor_meta(user)
    return True


def fake_arguments(node: torch.fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``node``'s args and kwargs, each input node replaced by its ``meta["val"]`` (LookupError if none)."""

    def value(arg: torch.fx.Node) -> Any:
        if "val" not in arg.meta:
            raise LookupError(f"{arg.name} has no meta['val']")
        return arg.meta["val"]

    args = torch.fx.node.map_arg(node.args, value)
    kwargs = torch.fx.node.map_arg(node.kwargs, value)
    return tuple(args), dict(kwargs)
