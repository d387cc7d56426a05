"""Deliberately broken backends: each breaks one rule, so self-tests can prove the suite catches it.

Each wraps the reference backend and changes one behaviour, the way a real backend regresses; the view pass
one re-implements upstream's pass instead, gap included.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from reference_impl import BACKEND as REFERENCE
from reference_impl.lowering import COPY_TO_VIEW


class _Wrapped:
    version = "broken"

    def __init__(self, name: str) -> None:
        self.name = name


class AcceptsDtypeMismatch(_Wrapped):
    """Casts a mismatching mat2 to self's dtype instead of rejecting it (breaks mm_out/same-dtype)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if isinstance(self_, torch.Tensor) and isinstance(mat2, torch.Tensor) and mat2.dtype != self_.dtype:
            mat2 = mat2.to(self_.dtype)
        REFERENCE.mm_out(out, self_, mat2)


class AcceptsCpuTensors(_Wrapped):
    """Upstream's gap: no device-type check; CPU tensors are computed with torch.mm (breaks cuda-device)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (out, self_, mat2)):
            torch.mm(self_, mat2, out=out)
            return
        REFERENCE.mm_out(out, self_, mat2)


@dataclass(frozen=True)
class NaiveViewPassOutcome:
    graph_module: GraphModule
    rewritten: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def _writes(argument: Any) -> bool:
    return argument is not None and argument.alias_info is not None and argument.alias_info.is_write


def _upstream_blocker(node: Node) -> str | None:
    """Upstream's user checks, and nothing else: a call_method user, a user that writes the very argument
    (in-place or out=), or a user that is a view op. Lists, getitem chains and outputs are not looked at."""
    for user in node.users:
        if user.op == "call_method":
            return f"user {user.name} is a call_method ({user.target})"
        schema = getattr(user.target, "_schema", None)
        if user.op != "call_function" or schema is None:
            continue
        if getattr(user.target, "is_view", False):
            return f"user {user.name} ({user.target}) is a view op"
        by_name = {a.name: a for a in schema.arguments}
        positional = zip(schema.arguments, user.args, strict=False)
        keyword = ((by_name.get(k), v) for k, v in user.kwargs.items())
        for argument, value in (*positional, *keyword):
            if value is node and _writes(argument):
                return f"user {user.name} ({user.target}) writes its argument {argument.name}"
    return None


class IgnoresSourceMutation(_Wrapped):
    """Upstream's ReplaceViewCopyWithViewPass widened to every ``*_copy`` op with a view twin: it checks the
    users only, never a later write to the source (or outputs, or containers). It keeps ``meta["val"]``
    truthful and skips a view that cannot be built on the base's layout, so only what it ignores shows."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        module = copy.deepcopy(graph_module)
        outcome = NaiveViewPassOutcome(module)
        for node in module.graph.nodes:
            view = COPY_TO_VIEW.get(node.target) if node.op == "call_function" else None
            if view is None:
                continue
            blocker = _upstream_blocker(node)
            if blocker is not None:
                outcome.refused[node.name] = blocker
                continue
            try:
                value = view(*_fake(node.args), **_fake(node.kwargs))
            except Exception as exc:  # no fake values, or a view the base's strides do not allow
                outcome.refused[node.name] = f"cannot build {view}: {exc}"
                continue
            node.target, node.meta["val"] = view, value
            for user in node.users:
                if user.target is operator.getitem:  # an item of a split/unbind result
                    user.meta["val"] = value[user.args[1]]
            outcome.rewritten.append(node.name)
        if outcome.rewritten:
            module.graph.lint()
            module.recompile()
        return outcome


def _fake(value: Any) -> Any:
    return torch.fx.node.map_aggregate(value, lambda v: v.meta["val"] if isinstance(v, Node) else v)


ACCEPTS_DTYPE_MISMATCH = AcceptsDtypeMismatch("accepts-dtype-mismatch")
ACCEPTS_CPU_TENSORS = AcceptsCpuTensors("accepts-cpu-tensors")
IGNORES_SOURCE_MUTATION = IgnoresSourceMutation("ignores-source-mutation")


class NoMmOut:
    """A backend that implements no protocol part: chapters must skip, not fail."""

    name = "no-parts"
    version = "0"


NO_PARTS = NoMmOut()
