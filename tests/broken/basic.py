"""Deliberately broken backends: each breaks one rule, so self-tests can prove the suite catches it.

Each wraps the reference backend and changes one behaviour, the way a real backend regresses; the view pass
one re-implements upstream's pass instead, gap included.
"""

from __future__ import annotations

import copy
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from conformance.lowering.view_pass_cases import CASES
from reference_impl import BACKEND as REFERENCE
from reference_impl.lowering import COPY_TO_VIEW, VIEW_TO_COPY
from tests.rule_coverage import Breaks


class _Wrapped:
    version = "broken"

    def __init__(self, name: str, breaks: Breaks | None = None) -> None:
        self.name = name
        if breaks is not None:  # what it breaks, for tests.rule_coverage
            self.breaks = breaks


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
        outcome = _user_checked_pass(graph_module, COPY_TO_VIEW, _retarget_with_truthful_meta)
        if outcome.rewritten:
            _repropagate(outcome.graph_module)
        return outcome


def _user_checked_pass(
    graph_module: GraphModule, table: dict[Any, Any], retarget: Callable[[Node, Any], str | None]
) -> NaiveViewPassOutcome:
    """Upstream's shape of pass over a copy of ``graph_module``: every copy in ``table`` whose users do not
    block it goes to ``retarget`` (which rewrites it, or returns why not); nothing else is looked at."""
    module = copy.deepcopy(graph_module)
    outcome = NaiveViewPassOutcome(module)
    for node in module.graph.nodes:
        view = table.get(node.target) if node.op == "call_function" else None
        if view is None:
            continue
        reason = _upstream_blocker(node) or retarget(node, view)
        if reason is not None:
            outcome.refused[node.name] = reason
            continue
        outcome.rewritten.append(node.name)
    if outcome.rewritten:
        module.graph.lint()
        module.recompile()
    return outcome


def _retarget_with_truthful_meta(node: Node, view: Any) -> str | None:
    try:
        value = view(*_fake(node.args), **_fake(node.kwargs))
    except Exception as exc:  # no fake values, or a view the base's strides do not allow
        return f"cannot build {view}: {exc}"
    node.target, node.meta["val"] = view, value
    for user in node.users:
        if user.target is operator.getitem:  # an item of a split/unbind result
            user.meta["val"] = value[user.args[1]]
    return None


def _retarget_keeping_meta(node: Node, view: Any) -> None:
    node.target = view  # upstream: meta["val"] stays the copy's


def _repropagate(module: GraphModule) -> None:
    """Fresh fake values on every node: an op reading a view may take its strides (``add`` does)."""
    placeholders = [n.meta.get("val") for n in module.graph.nodes if n.op == "placeholder"]
    mode = torch._guards.detect_fake_mode(placeholders)
    if mode is None or any(v is None for v in placeholders):
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        FakeTensorProp(module, mode).propagate_dont_convert_inputs(*placeholders)


def _fake(value: Any) -> Any:
    return torch.fx.node.map_aggregate(value, lambda v: v.meta["val"] if isinstance(v, Node) else v)


#: Upstream ExecuTorch 1.5.1's table (``_VIEW_TARGETS``, ATen half): the only copies it turns into views.
UPSTREAM_VIEW_TARGETS = {
    torch.ops.aten.slice_copy.Tensor: torch.ops.aten.slice.Tensor,
    torch.ops.aten.select_copy.int: torch.ops.aten.select.int,
    torch.ops.aten.split_copy.Tensor: torch.ops.aten.split.Tensor,
}


class UpstreamLike(_Wrapped):
    """Upstream ExecuTorch 1.5.1's ReplaceViewCopyWithViewPass as it is (re-implemented, so the self-tests
    need no executorch): its three ops only, its user checks only, and the node retargeted with its old
    ``meta["val"]`` (the copy's contiguous strides). A mapped copy it keeps is ``refused``; an op outside
    its table is in neither list (unmapped)."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        return _user_checked_pass(graph_module, UPSTREAM_VIEW_TARGETS, _retarget_keeping_meta)


class MapsNothing(_Wrapped):
    """A pass that maps no op at all: every copy stays, none is listed (pure coverage, nothing wrong)."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        return NaiveViewPassOutcome(copy.deepcopy(graph_module))


class RefusesEverything(_Wrapped):
    """A pass that maps every op and refuses every copy with a reason (conservative, nothing wrong)."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        outcome = NaiveViewPassOutcome(copy.deepcopy(graph_module))
        for node in outcome.graph_module.graph.nodes:
            if node.op == "call_function" and node.target in COPY_TO_VIEW:
                outcome.refused[node.name] = "refuses every copy"
        return outcome


def _aliases(node: Node) -> set[Node]:
    """Every value sharing ``node``'s memory through view ops: up to its root, then all views of it."""
    root = node
    while root.op == "call_function" and getattr(root.target, "is_view", False):
        root = root.args[0]  # type: ignore[assignment]
    found, todo = {root}, [root]
    while todo:
        for user in todo.pop().users:
            if user.op == "call_function" and getattr(user.target, "is_view", False) and user not in found:
                found.add(user)
                todo.append(user)
    return found


def _writes_any(user: Node, values: set[Node]) -> bool:
    """``user`` may write one of ``values``: a schema argument marked written, or no schema to say."""
    schema = getattr(user.target, "_schema", None)
    if user.op != "call_function" or schema is None:
        return any(v in values for v in user.all_input_nodes)
    by_name = {a.name: a for a in schema.arguments}
    bound = (
        *zip(schema.arguments, user.args, strict=False),
        *((by_name.get(k), v) for k, v in user.kwargs.items()),
    )
    return any(_writes(a) and any(n in values for n in _nodes_of(v)) for a, v in bound)


def _nodes_of(value: Any) -> list[Node]:
    found: list[Node] = []
    torch.fx.node.map_arg(value, found.append)
    return found


def _reads_only(user: Node, node: Node) -> bool:
    """An ordinary op that reads ``node``: it has a schema, is no view and writes nothing."""
    schema = getattr(user.target, "_schema", None)
    return (
        user.op == "call_function"
        and schema is not None
        and not getattr(user.target, "is_view", False)
        and not any(a.alias_info is not None for a in schema.returns)
        and not _writes_any(user, {node})
    )


class RewritesReadsBeforeWrite(_Wrapped):
    """Correct, but not the reference's verdicts: the reference pass, then every copy it refused for a later
    write to the source whose readers (ordinary ops) all run before that write also becomes a view. A view
    read before the write reads what the copy held, so nothing a caller sees changes."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(graph_module)
        module = reference.graph_module
        outcome = NaiveViewPassOutcome(module, list(reference.rewritten), dict(reference.refused))
        order = {n: i for i, n in enumerate(module.graph.nodes)}
        for node in module.graph.nodes:
            if outcome.refused.get(node.name) != "source-mutated" or not isinstance(node.args[0], Node):
                continue
            aliases = _aliases(node.args[0])
            writes = [
                order[n] for n in module.graph.nodes if order[n] > order[node] and _writes_any(n, aliases)
            ]
            readers = list(node.users)
            if not writes or not readers or not all(_reads_only(u, node) for u in readers):
                continue
            if max(order[u] for u in readers) > min(writes):
                continue
            view = COPY_TO_VIEW[node.target]
            node.target, node.meta["val"] = view, view(*_fake(node.args), **_fake(node.kwargs))
            outcome.rewritten.append(node.name)
            del outcome.refused[node.name]
        module.graph.lint()
        module.recompile()
        _repropagate(module)  # its readers take the view's layout too (a mul of a transposed view is)
        return outcome


class RewritesOnlySlices(_Wrapped):
    """Correct, and narrower than the reference: the reference pass, then every view it made that is not a
    ``slice`` goes back to its copy and out of both lists (an op this pass does not map), with fresh fake
    values everywhere. Fewer views than a safe set is still safe: a copy where a view was aliases nothing."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(graph_module)
        module = reference.graph_module
        kept = []
        for node in module.graph.nodes:
            if node.name not in reference.rewritten:
                continue
            if node.target == torch.ops.aten.slice.Tensor:
                kept.append(node.name)
            else:
                node.target = VIEW_TO_COPY[node.target]
        slices = {n.name for n in module.graph.nodes if n.target == torch.ops.aten.slice_copy.Tensor}
        refused = {name: why for name, why in reference.refused.items() if name in slices}
        module.graph.lint()
        module.recompile()
        _repropagate(module)
        return NaiveViewPassOutcome(module, kept, refused)


MM_OUT = "conformance/mm_out/test_mm_out.py"
LOWERING = "conformance/lowering/test_lowering.py"
SUITE_TESTS = "tests/conformance/test_suite_catches_broken_backends.py"
LEVEL_TESTS = "tests/conformance/test_view_pass_levels.py"
#: The view-pass rules a users-only pass ignores (each a *must* where the view is a hazard).
USERS_ONLY_GAPS = ("lowering/source-mutated", "lowering/aliases-output", "lowering/opaque-container")

ACCEPTS_DTYPE_MISMATCH = AcceptsDtypeMismatch(
    "accepts-dtype-mismatch",
    Breaks(
        ("mm_out/dtype-mismatch-mat2",),
        MM_OUT,
        ("-k", "bad_input"),
        cuda=True,
        proven_by=f"{SUITE_TESTS}::test_backend_accepting_dtype_mismatch_fails_the_dtype_rules",
    ),
)
ACCEPTS_CPU_TENSORS = AcceptsCpuTensors(
    "accepts-cpu-tensors",
    Breaks(
        ("mm_out/cuda-device",),
        MM_OUT,
        proven_by=f"{SUITE_TESTS}::test_backend_accepting_cpu_tensors_fails_the_cuda_device_rule",
    ),
)
IGNORES_SOURCE_MUTATION = IgnoresSourceMutation(
    "ignores-source-mutation",
    Breaks(
        (*USERS_ONLY_GAPS, "lowering/opaque-container/policy"),
        LOWERING,
        ("-k", "view_pass"),
        proven_by=f"{LEVEL_TESTS}::test_pass_ignoring_source_mutation_fails_the_rules_it_ignores",
    ),
)
UPSTREAM_LIKE = UpstreamLike(
    "upstream-like",
    Breaks(
        (*USERS_ONLY_GAPS, "lowering/truthful-strides", "lowering/opaque-container/policy"),
        LOWERING,
        ("-k", "view_pass"),
        proven_by=f"{LEVEL_TESTS}::test_upstream_like_pass_fails_its_defects_and_nothing_else",
    ),
)
MAPS_NOTHING = MapsNothing("maps-nothing")  # correct (coverage only): breaks nothing
REFUSES_EVERYTHING = RefusesEverything(
    "refuses-everything",
    Breaks(
        (
            *sorted({f"lowering/{c.rule}/missed-rewrite" for c in CASES if c.rewrite}),
            "lowering/slicing-heavy/missed-rewrite",
        ),
        LOWERING,
        ("-k", "view_pass"),
        strict_should=True,
        proven_by=f"{LEVEL_TESTS}::test_pass_refusing_everything_it_maps_is_should_only",
    ),
)
REWRITES_READS_BEFORE_WRITE = RewritesReadsBeforeWrite("rewrites-reads-before-write")
REWRITES_ONLY_SLICES = RewritesOnlySlices("rewrites-only-slices")  # correct: breaks nothing


class NoMmOut:
    """A backend that implements no protocol part: chapters must skip, not fail."""

    name = "no-parts"
    version = "0"


NO_PARTS = NoMmOut()
