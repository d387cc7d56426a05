"""``ReplaceViewCopyWithViewPass``: turn edge ``*_copy`` ops back into views wherever nobody can tell.

A copy is a snapshot; a view is a window onto live memory. Retargeting ``slice_copy`` to ``slice`` saves a
kernel and a buffer, and is only correct when nothing can observe the difference. Upstream (ExecuTorch's CUDA
backend) checks the node's users only, and misses a mutation of the *source* after the slice, which turns the
snapshot into a live view. This pass rewrites every ``*_copy`` op that has a view twin, refusing whenever:

1. ``call-method-user``  a user is a ``call_method`` node (no schema describes its effect);
2. ``written-by-user``   a user's schema marks the argument it receives as written (in-place or ``out=``);
3. ``view-user``         a user is itself a view / view-copy / otherwise aliasing op (upstream's rule);
4. ``source-mutated``    the base (or any alias of it) is written after the node, in the graph or by the
                         program's buffer / user-input write-back;
5. ``aliases-output``    the result or its base aliases a written-back output, or the result is returned and
                         would alias an input, a buffer or another output, or itself (an ``expand``'s
                         stride 0, overlapping windows: writing one element would change another);
6. ``opaque-container``  the value reaches a user through something the pass cannot see through (a list
                         argument the op may write, a nested list, a ``getitem`` chain, an op without schema);
7. ``not-viewable``      the view op itself would fail on the base's layout (``view`` on clashing strides),
                         or would once the other copies are views, or would change the layout that an
                         ``as_strided`` downstream reads (it addresses storage, not values).

Only the top-level graph is visited. Rewritten nodes get a ``meta["val"]`` with the view's real strides and
storage offset, and the graph's fake values are refreshed downstream.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch._ops import OpOverload
from torch.export.graph_signature import ExportGraphSignature
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from reference_impl.lowering.alias_analysis import (
    AliasGraph,
    ProgramMutations,
    bound_arguments,
    is_aliasing_op,
    is_getitem,
    is_write,
    nodes_in,
    output_node,
    returns_list,
)
from reference_impl.lowering.edge import (
    COPY_TO_VIEW,
    fake_arguments,
    quiet_pytree_deprecation,
    refresh_fake_meta,
)

__all__ = [
    "Reason",
    "Refusal",
    "ReplaceViewCopyWithViewPass",
    "Rewrite",
    "ViewPassReport",
    "run_view_copy_pass",
]


class Reason(str, Enum):
    """Why a ``*_copy`` node was left alone; the value is the short id the report and tests use."""

    CALL_METHOD_USER = "call-method-user"
    WRITTEN_BY_USER = "written-by-user"
    VIEW_USER = "view-user"
    SOURCE_MUTATED = "source-mutated"
    ALIASES_OUTPUT = "aliases-output"
    OPAQUE_CONTAINER = "opaque-container"
    NOT_VIEWABLE = "not-viewable"


# Rule order decides which reason a node reports when several apply.
_RANK = {reason: rank for rank, reason in enumerate(Reason)}


@dataclass(frozen=True)
class Rewrite:
    node: str
    before: str
    after: str


@dataclass(frozen=True)
class Refusal:
    node: str
    op: str
    reason: Reason
    detail: str


@dataclass
class ViewPassReport:
    """What one run did: every rewrite (op before → after) and every refusal (reason id + a sentence)."""

    rewrites: list[Rewrite] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)

    def reason_for(self, node_name: str) -> Reason | None:
        return next((r.reason for r in self.refusals if r.node == node_name), None)

    def refusal_counts(self) -> dict[str, int]:
        return dict(Counter(r.reason.value for r in self.refusals))

    def summary(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.refusal_counts().items())) or "none"
        return f"{len(self.rewrites)} rewritten, {len(self.refusals)} refused ({counts})"


_Verdict = tuple[Reason, str]


# --- the pass


class ReplaceViewCopyWithViewPass(PassBase):
    """Retarget safe ``*_copy`` nodes of the top-level graph to their view twins (rules: see the module doc).

    ``graph_signature`` (from the ExportedProgram) tells the pass which inputs and buffers the program writes
    back; without it, only mutations visible in the graph are known. ``report`` describes the last call.
    """

    def __init__(self, graph_signature: ExportGraphSignature | None = None) -> None:
        super().__init__()
        self._mutations = ProgramMutations.from_signature(graph_signature)
        self._views: dict[Node, Any] = {}
        self.report = ViewPassReport()

    def call(self, graph_module: GraphModule) -> PassResult:
        self.report = ViewPassReport()
        graph = graph_module.graph
        refused: dict[Node, _Verdict] = {}
        views: dict[Node, Any] = {}
        for node in graph.nodes:
            if node.op != "call_function" or node.target not in COPY_TO_VIEW:
                continue
            verdict = self._local_verdict(node)
            if verdict is None:
                verdict, views[node] = self._view_value(node)
            if verdict is not None:
                refused[node] = verdict
        accepted = [n for n in graph.nodes if n in views and n not in refused]
        self._views = views
        accepted = self._drop_observable(graph, accepted, refused)
        copies = {node: node.target for node in accepted}
        layouts = {node: _layout_of(node) for node in graph.nodes if _reads_layout(node)}
        for node in accepted:
            self._retarget(node, views[node])
        if accepted:
            # Downstream strides can change too (a pointwise op keeps its input's layout): refresh everything,
            # then check each layout-dependent view again on the layout its base now has.
            _refresh(graph_module, accepted)
            accepted = self._recheck_layouts(graph_module, accepted, refused, copies, layouts)

        for node in graph.nodes:
            if node in refused:
                reason, detail = refused[node]
                self.report.refusals.append(
                    Refusal(node.name, str(copies.get(node, node.target)), reason, detail)
                )
        if not accepted:
            return PassResult(graph_module, False)
        for node in accepted:
            self.report.rewrites.append(Rewrite(node.name, str(copies[node]), str(node.target)))
        graph.lint()
        graph_module.recompile()
        return PassResult(graph_module, True)

    # -- rule 7 again, after the rewrites: a view's base may have taken another view's layout

    @staticmethod
    def _recheck_layouts(
        graph_module: GraphModule,
        accepted: list[Node],
        refused: dict[Node, _Verdict],
        copies: dict[Node, Any],
        layouts: dict[Node, Any],
    ) -> list[Node]:
        """Put back (and refuse) every layout-dependent view that no longer fits its base's new layout (a
        ``view`` of ``mul(transpose(x))`` once the transpose is a view), every rewrite upstream of a ``view``
        the graph already had that no longer fits, and every rewrite upstream of an ``as_strided`` whose
        input's layout it changed (``layouts``: those inputs' layouts before), until none is left."""
        while True:
            broken: dict[Node, _Verdict] = {}
            for reader, before in layouts.items():
                if _layout_of(reader) == before:
                    continue
                detail = (
                    f"as a view it changes the memory layout of what {reader.name} ({reader.target}) reads "
                    "through absolute strides: it would read other elements"
                )
                broken.update((n, (Reason.NOT_VIEWABLE, detail)) for n in _ancestors(reader) if n in accepted)
            for node in graph_module.graph.nodes:
                if node.op != "call_function" or node.target not in _LAYOUT_DEPENDENT_VIEWS:
                    continue
                try:
                    args, kwargs = fake_arguments(node)
                    node.target(*args, **kwargs)
                    _view_on_meta(node.target, args, kwargs)
                except Exception as error:  # no fake value, or the view's own error on the new layout
                    why = f"fails on the layout its base takes once the other copies are views: {error}"
                    why = why.splitlines()[0]
                    if node in accepted:
                        broken[node] = (Reason.NOT_VIEWABLE, f"{node.target} {why}")
                    else:  # a view the graph already had: the rewrites upstream of it go back
                        detail = f"as a view it makes {node.name} ({node.target}) fail: it {why}"
                        broken.update(
                            (n, (Reason.NOT_VIEWABLE, detail)) for n in _ancestors(node) if n in accepted
                        )
            if not broken:
                return accepted
            for node in broken:
                node.target = copies[node]
            refused.update(broken)
            accepted = [n for n in accepted if n not in broken]
            _refresh(graph_module, accepted)

    # -- rules 1, 2, 3, 6: what each user does with the value

    def _local_verdict(self, node: Node) -> _Verdict | None:
        if not isinstance(node.args[0], Node):
            return Reason.OPAQUE_CONTAINER, "its base is not a graph value the pass can track"
        verdicts = [v for value, user in _uses(node) if (v := _user_verdict(value, user)) is not None]
        return min(verdicts, key=lambda v: _RANK[v[0]], default=None)

    # -- rule 7: the view must exist for the base's layout; its fake value gives truthful strides

    @staticmethod
    def _view_value(node: Node) -> tuple[_Verdict | None, Any]:
        view = COPY_TO_VIEW[node.target]  # type: ignore[index]
        try:
            args, kwargs = fake_arguments(node)
        except LookupError:
            if view in _LAYOUT_DEPENDENT_VIEWS:
                return (
                    Reason.NOT_VIEWABLE,
                    f"no fake value proves {view} is legal for the base's strides",
                ), None
            return None, None
        try:
            value = view(*args, **kwargs)
            if view in _LAYOUT_DEPENDENT_VIEWS:
                _view_on_meta(view, args, kwargs)
        except Exception as error:  # the view op's own error names the layout problem
            return (
                Reason.NOT_VIEWABLE,
                f"{view} fails on the base's layout: {str(error).splitlines()[0]}",
            ), None
        return None, value

    # -- rules 4 and 5: can anyone observe the value changing?

    def _drop_observable(
        self, graph: torch.fx.Graph, accepted: list[Node], refused: dict[Node, _Verdict]
    ) -> list[Node]:
        # Judging each node with every candidate already a view over-approximates aliasing; refusing some only
        # removes aliasing, so iterating to a fixed point leaves a set that is safe together.
        while accepted:
            aliases = AliasGraph(graph, set(accepted))
            verdicts = {
                n: v for n in accepted if (v := self._observable_verdict(n, aliases, graph)) is not None
            }
            if not verdicts:
                break
            refused.update(verdicts)
            accepted = [n for n in accepted if n not in verdicts]
        return accepted

    def _observable_verdict(self, node: Node, aliases: AliasGraph, graph: torch.fx.Graph) -> _Verdict | None:
        roots = aliases.roots_of(node)
        base = node.args[0].name  # type: ignore[union-attr]
        written_back = sorted(
            n.name for n in roots if n.op == "placeholder" and n.name in self._mutations.placeholders
        )
        if written_back:
            source = base if written_back[0] == base else f"{base} (an alias of {written_back[0]})"
            return Reason.SOURCE_MUTATED, (
                f"its base {source} is written back by the program after the graph; "
                "a view would show the new values"
            )
        position = aliases.order[node]
        for index, writer, written in aliases.writes:
            if index > position and written & roots:
                return Reason.SOURCE_MUTATED, (
                    f"{writer.name} ({writer.target}) writes to {base} or an alias of it later in the graph; "
                    "the copy's snapshot would become a live view"
                )
        return self._output_verdict(node, roots, aliases, graph)

    def _output_verdict(
        self, node: Node, roots: frozenset[Node], aliases: AliasGraph, graph: torch.fx.Graph
    ) -> _Verdict | None:
        outputs = [n for n in nodes_in(output_node(graph).args) if isinstance(n, Node)]
        for out in outputs:
            if out.name in self._mutations.outputs and aliases.roots_of(out) & roots:
                return (
                    Reason.ALIASES_OUTPUT,
                    f"it shares memory with {out.name}, which is written back to the program",
                )
        mine = [o for o in outputs if o is node or (is_getitem(o) and o.args[0] is node)]
        if not mine:
            return None
        views = self._views.get(node)
        for out in mine:  # the node itself, or a chunk of a list it makes (split, unbind) through getitem
            value = views if out is node else views[out.args[1]] if isinstance(views, (list, tuple)) else None
            if _may_overlap_itself(value, node):
                return (
                    Reason.ALIASES_OUTPUT,
                    f"{out.name} is returned, and as a view some of its elements would share memory "
                    "(stride 0 or overlapping windows): writing one would change others",
                )
        inputs = sorted(n.name for n in roots if n.op in ("placeholder", "get_attr"))
        if inputs:
            return (
                Reason.ALIASES_OUTPUT,
                f"it is returned, and as a view the output would alias input {inputs[0]}",
            )
        sharing = [o.name for o in outputs if aliases.roots_of(o) & roots]
        if len(sharing) > 1:
            return (
                Reason.ALIASES_OUTPUT,
                f"it is returned, and as a view outputs {', '.join(sharing)} would share memory",
            )
        return None

    @staticmethod
    def _retarget(node: Node, view_value: Any) -> None:
        node.target = COPY_TO_VIEW[node.target]  # type: ignore[index]
        if view_value is not None:
            node.meta["val"] = view_value
            for user in node.users:
                if is_getitem(user) and isinstance(view_value, (list, tuple)):
                    user.meta["val"] = view_value[user.args[1]]  # type: ignore[index]


# ``view`` needs strides compatible with the new shape; every other twin works on any layout.
_LAYOUT_DEPENDENT_VIEWS = {
    op
    for op in (
        torch.ops.aten.view.default,
        torch.ops.aten.view.dtype,
        getattr(torch.ops.aten, "_reshape_alias", None),
    )
    if op is not None
}


#: Views that can place two elements at one address (``expand``'s stride 0, overlapping windows).
_MAY_OVERLAP = {
    torch.ops.aten.expand.default,
    torch.ops.aten.as_strided.default,
    torch.ops.aten.unfold.default,
}


def _may_overlap_itself(value: Any, node: Node) -> bool:
    """The view of ``node`` may hold two elements at one memory address. Exact from concrete strides: taken
    from the smallest, each stride must step past every address the smaller ones reach. Without a fake
    value, or with symbolic sizes, only the ops that make such layouts are suspected."""
    layout = (*value.shape, *value.stride()) if isinstance(value, torch.Tensor) else (None,)
    if not all(isinstance(n, int) for n in layout):
        return COPY_TO_VIEW.get(node.target) in _MAY_OVERLAP  # type: ignore[call-overload]
    reach = 0  # the highest offset the smaller strides reach
    for stride, size in sorted((st, n) for n, st in zip(value.shape, value.stride(), strict=True) if n > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


#: Ops whose values depend on how their input is laid out in memory, not only on its values: ``as_strided``
#: addresses the input's storage with absolute strides, so a copy upstream turned view changes what it reads.
_LAYOUT_READERS = {torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default}


def _reads_layout(node: Node) -> bool:
    return node.op == "call_function" and node.target in _LAYOUT_READERS and isinstance(node.args[0], Node)


def _layout_of(reader: Node) -> Any:
    """(shape, strides, storage offset) of what layout reader ``reader`` reads, from its fake value."""
    value = reader.args[0].meta.get("val")  # type: ignore[union-attr]
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(value.shape), value.stride(), value.storage_offset()


def _ancestors(node: Node) -> set[Node]:
    found: set[Node] = set()
    todo = list(node.all_input_nodes)
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(current.all_input_nodes)
    return found


def _refresh(graph_module: GraphModule, accepted: list[Node]) -> None:
    """Fresh fake values for the whole graph; if propagation fails, at least for every node downstream of a
    rewrite, one op at a time in graph order (a pointwise op on a transposed view is transposed too)."""
    downstream: set[Node] = set()
    todo = list(accepted)
    while todo:
        node = todo.pop()
        if node not in downstream:
            downstream.add(node)
            todo.extend(node.users)
    refresh_fake_meta(graph_module, fallback_nodes=[n for n in graph_module.graph.nodes if n in downstream])


def _view_on_meta(view: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Run ``view`` on a meta tensor laid out as the fake base (raises where eager would). Fake tensors'
    ``view`` (torch 2.13) accepts a size-1 dimension between two that cannot merge, e.g. ``[2, 1, 2]``
    with strides ``(4, 2, 1)`` viewed as ``[-1]``, which eager and the meta kernel reject: trusting it alone
    gives a graph that fails at run time. Symbolic sizes are left to the fake check."""
    base = args[0]
    if not isinstance(base, torch.Tensor) or not all(
        isinstance(n, int) for n in (*base.shape, *base.stride())
    ):
        return
    probe = torch.empty_strided(base.shape, base.stride(), dtype=base.dtype, device="meta")
    view(probe, *args[1:], **kwargs)


def _uses(node: Node) -> Iterator[tuple[Node, Node]]:
    """(value, user) pairs; a list-returning op's own ``getitem`` results are seen through, one level only."""
    for user in node.users:
        if returns_list(node) and is_getitem(user) and user.args[0] is node:
            for grand_user in user.users:
                yield user, grand_user
        else:
            yield node, user


def _user_verdict(value: Node, user: Node) -> _Verdict | None:
    if user.op == "output":
        return None  # rule 5, decided with the alias analysis
    if user.op == "call_method":
        return Reason.CALL_METHOD_USER, f"user {user.name} is a call_method ({user.target})"
    if user.op != "call_function" or is_getitem(user) or not isinstance(user.target, OpOverload):
        what = (
            "a getitem chain"
            if is_getitem(user)
            else f"{user.op} {getattr(user.target, '__name__', user.target)}"
        )
        return Reason.OPAQUE_CONTAINER, f"user {user.name} is {what}, which the pass cannot see through"
    if is_aliasing_op(user.target):
        return Reason.VIEW_USER, f"user {user.name} ({user.target}) is a view or view-copy op"
    seen = 0
    for argument, bound in bound_arguments(user):
        if bound is value:
            seen += 1
            if is_write(argument):
                return (
                    Reason.WRITTEN_BY_USER,
                    f"user {user.name} ({user.target}) writes its argument {argument.name}",
                )
            continue
        inside = nodes_in(bound)
        if value not in inside:
            continue
        seen += 1
        nested = isinstance(bound, (list, tuple)) and value not in bound
        if nested or is_write(argument):
            return Reason.OPAQUE_CONTAINER, (
                f"user {user.name} ({user.target}) receives it inside list argument {argument.name}, "
                "which may be written" + (" and is nested" if nested else "")
            )
    if seen == 0:
        return (
            Reason.OPAQUE_CONTAINER,
            f"user {user.name} receives it in an argument its schema does not name",
        )
    return None


def run_view_copy_pass(
    program: torch.export.ExportedProgram | GraphModule,
) -> tuple[torch.export.ExportedProgram | GraphModule, ViewPassReport]:
    """Run the pass on a copy of ``program`` (using its graph signature); return the copy and the report."""
    if isinstance(program, GraphModule):
        module = copy.deepcopy(program)
        view_pass = ReplaceViewCopyWithViewPass()
        view_pass(module)
        return module, view_pass.report
    with quiet_pytree_deprecation():
        result = copy.deepcopy(program)
    _rename_signature_to_graph(result)
    view_pass = ReplaceViewCopyWithViewPass(result.graph_signature)
    view_pass(result.graph_module)
    return result, view_pass.report


def _rename_signature_to_graph(program: torch.export.ExportedProgram) -> None:
    """Make the signature name the copied graph's nodes again.

    Copying a graph renames nodes whose names shadow Python builtins (``nn.Linear``'s placeholder ``input``
    becomes ``input_1``) while the signature keeps the old names; specs and nodes correspond by position.
    """
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(program.graph_signature.input_specs, placeholders, strict=True):
        if getattr(spec.arg, "name", node.name) != node.name:
            spec.arg.name = node.name
    output = next(n for n in program.graph.nodes if n.op == "output")
    returned = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    for spec, value in zip(program.graph_signature.output_specs, returned, strict=True):
        name = getattr(value, "name", None)
        if name is not None and getattr(spec.arg, "name", name) != name:
            spec.arg.name = name
