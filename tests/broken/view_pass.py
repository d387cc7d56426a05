"""Broken view passes that second-guess the reference's refusals the way a "smarter" pass does: each takes
the reference's verdicts, then overrides one rule with a cleverer-looking test of its own. Where that test
is right for the graph at hand the result still behaves the same, so only a *should* rule fires (a
``<rule>/policy`` miss: SPEC §1a refuses these conservatively, or a ``<rule>/missed-rewrite``: a proxy test
refuses a safe view). All run on the CPU; ``tests/conformance/test_broken_chapter_backends.py`` runs each
through the lowering chapter with its one case selected. The next two keep the reference's verdicts and slip
in how they write a view call instead: a *must* (``every-view-twin``, ``slicing-heavy``).

The last five keep the reference's verdicts too, and slip where only the generated graphs of the
differential chapter (``conformance/differential/differential_view_pass.py``) look: indices and ends from the
back clamped to the front (*must*), a report that contradicts itself or lists copies as views (*should*), a
graph edited without ``recompile()`` and ``meta["val"]`` refreshed on the rewritten nodes only (*must*).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.fx import GraphModule, Node

from reference_impl import BACKEND as REFERENCE
from reference_impl.lowering import COPY_TO_VIEW, VIEW_TO_COPY
from tests.broken.basic import (
    NaiveViewPassOutcome,
    _aliases,
    _fake,
    _nodes_of,
    _repropagate,
    _retarget_with_truthful_meta,
)
from tests.broken.chapter import LOWERING, Forwarding
from tests.rule_coverage import Breaks

DIFFERENTIAL = "conformance/differential/test_differential.py"

aten = torch.ops.aten


class _SecondGuesses(Forwarding):
    """The reference's pass; then every node :meth:`overrule` picks has its verdict flipped."""

    def overrule(self, module: GraphModule, node: Node, reason: str | None) -> bool:
        """Flip ``node``'s verdict? ``reason``: why the reference refused it (None: it was rewritten)."""
        raise NotImplementedError

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(graph_module)
        module = reference.graph_module
        outcome = NaiveViewPassOutcome(module, list(reference.rewritten), dict(reference.refused))
        changed = False
        for node in list(module.graph.nodes):
            if node.name in outcome.refused and self.overrule(module, node, outcome.refused[node.name]):
                view = COPY_TO_VIEW[node.target]
                node.target, node.meta["val"] = view, view(*_fake(node.args), **_fake(node.kwargs))
                outcome.rewritten.append(node.name)
                del outcome.refused[node.name]
                changed = True
            elif node.name in outcome.rewritten and self.overrule(module, node, None):
                copy_op = VIEW_TO_COPY[node.target]
                node.target, node.meta["val"] = copy_op, copy_op(*_fake(node.args), **_fake(node.kwargs))
                outcome.rewritten.remove(node.name)
                outcome.refused[node.name] = "not-viewable"
                changed = True
        if changed:
            module.graph.lint()
            module.recompile()
            _repropagate(module)
        return outcome


def _returned(module: GraphModule) -> set[Node]:
    output = next(n for n in module.graph.nodes if n.op == "output")
    return set(_nodes_of(output.args))


def _written(user: Node) -> list[Node] | None:
    """The graph values ``user``'s schema marks as written (None: no schema says)."""
    schema = getattr(user.target, "_schema", None)
    if user.op != "call_function" or schema is None:
        return None
    by_name = {a.name: a for a in schema.arguments}
    bound: list[tuple[Any, Any]] = [
        *zip(schema.arguments, user.args, strict=False),
        *((by_name.get(k), v) for k, v in user.kwargs.items()),
    ]
    return [
        n
        for argument, value in bound
        if argument is not None and argument.alias_info is not None and argument.alias_info.is_write
        for n in _nodes_of(value)
    ]


def _rows(node: Node, shape: torch.Size) -> tuple[int, int, int, int] | None:
    """(dim, start, end, step) of a slice node, dim and bounds normalised to ``shape`` (None: not a plain
    positional slice)."""
    given = list(node.args[1:])
    if node.target not in (aten.slice.Tensor, aten.slice_copy.Tensor) or node.kwargs or len(given) > 4:
        return None
    dim, start, end, step = given + [0, None, None, 1][len(given) :]
    dim %= len(shape)
    size = shape[dim]
    bounds = [(size if v is None else v + size if v < 0 else v) for v in (start or 0, end)]
    start, end = (max(0, min(v, size)) for v in bounds)
    return dim, start, end, step


class RangeChecksSourceWrites(_SecondGuesses):
    """Replaces "the source is written later: refuse" with a range check: a ``slice_copy`` whose base is
    written later only through slices of other rows (same dimension, disjoint ranges) becomes a view, since
    the write cannot reach the copied rows. Right for the graph (the numbers match), but SPEC §1a refuses
    *whenever* the source is mutated later: no alias analysis of ranges to get wrong (breaks
    ``lowering/source-mutated/policy``)."""

    def overrule(self, module: GraphModule, node: Node, reason: str | None) -> bool:
        if reason != "source-mutated" or node.target != aten.slice_copy.Tensor or node in _returned(module):
            return False
        base = node.args[0]
        if not isinstance(base, Node) or not isinstance(base.meta.get("val"), torch.Tensor):
            return False
        shape = base.meta["val"].shape
        mine = _rows(node, shape)
        if mine is None or mine[3] != 1:
            return False
        order = {n: i for i, n in enumerate(module.graph.nodes)}
        aliases = _aliases(base)
        for later in (n for n in module.graph.nodes if order[n] > order[node]):
            written = _written(later)
            if written is None:
                if any(v in aliases for v in later.all_input_nodes):
                    return False  # no schema: it may write anything it gets
                continue
            for target in (w for w in written if w in aliases):
                theirs = _rows(target, shape) if target.args[:1] == (base,) else None
                if theirs is None or theirs[0] != mine[0] or theirs[3] != 1:
                    return False  # the base itself, or rows it cannot bound
                if not (mine[2] <= theirs[1] or theirs[2] <= mine[1]):
                    return False  # the write reaches the copied rows
        return True


class WritesThroughDeadBases(_SecondGuesses):
    """Lets a user write through the view when nothing reads the base afterwards: a copy refused only for
    its in-place (or ``out=``) user becomes a view when its base is a fresh value used by that copy alone
    (liveness, as a re-inplacing pass reasons). The numbers match, but SPEC §1a refuses any user that writes
    the argument, whatever is live (breaks ``lowering/written-by-user/policy``)."""

    def overrule(self, module: GraphModule, node: Node, reason: str | None) -> bool:
        if reason != "written-by-user":
            return False
        base = node.args[0]
        return (
            isinstance(base, Node)
            and base.op == "call_function"
            and not getattr(base.target, "is_view", False)
            and set(base.users) == {node}
            and base not in _returned(module)
        )


class RefusesStridedViews(_SecondGuesses):
    """Decides viewability with ``is_contiguous()`` instead of trying the view: a ``view_copy`` whose base
    is not contiguous stays a copy, refused as not viewable. Never wrong, but a view that only splits the
    transposed base's first dimension exists and is safe (breaks ``lowering/not-viewable/missed-rewrite``:
    the rule refuses only a view the layout forbids)."""

    def overrule(self, module: GraphModule, node: Node, reason: str | None) -> bool:
        if reason is not None or node.target != aten.view.default or not isinstance(node.args[0], Node):
            return False
        base = node.args[0].meta.get("val")
        return isinstance(base, torch.Tensor) and not base.is_contiguous()


class _RebuildsViews(Forwarding):
    """The reference's verdicts; each view it built then goes through :meth:`rebuild` (a slip in how the
    view call is written, not in what is rewritten: the result reads other numbers, a *must*)."""

    def rebuild(self, node: Node) -> None:
        raise NotImplementedError

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        outcome = REFERENCE.view_copy_pass(copy.deepcopy(graph_module))
        module = outcome.graph_module
        nodes = {n.name: n for n in module.graph.nodes}
        for name in outcome.rewritten:
            self.rebuild(nodes[name])
        module.recompile()
        return NaiveViewPassOutcome(module, list(outcome.rewritten), dict(outcome.refused))


class DropsTheSliceStep(_RebuildsViews):
    """Builds each view from the op's leading positional arguments and forgets ``slice``'s optional
    ``step``: ``slice_copy(x, 1, 1, 5, 2)`` becomes ``slice(x, 1, 1, 5)``, every element instead of every
    other (breaks ``lowering/every-view-twin``: the view twin must read what the copy read)."""

    def rebuild(self, node: Node) -> None:
        if node.target == aten.slice.Tensor and len(node.args) > 4:
            node.args = node.args[:4]


class WritesToTheEndAsMinusOne(_RebuildsViews):
    """Writes a slice's "to the end" bound (``end = 2**63 - 1``, what export records for ``x[..., 2:]``) as
    ``-1``, the way a hand-written serializer spells "the last one": the view stops one element short.
    Invisible in the single-copy case (a bounded slice), wrong in the KV-cache graph, which splits the
    rotary halves with open-ended slices (breaks ``lowering/slicing-heavy``)."""

    def rebuild(self, node: Node) -> None:
        if node.target == aten.slice.Tensor and len(node.args) > 3 and node.args[3] == 2**63 - 1:
            node.args = (*node.args[:3], -1, *node.args[4:])


class ClampsNegativeIndices(_RebuildsViews):
    """Normalises each view's index and end itself, the way its kernels take them (non-negative), and clamps
    instead of wrapping: ``select(x, 1, -1)`` becomes ``select(x, 1, 0)`` (the first row, not the last) and
    ``slice(x, 1, 0, -1)`` becomes ``slice(x, 1, 0, 0)`` (nothing, not all but the last). The catalogue's
    selects all count from the front and its slices end at a positive bound or at the end, so the lowering
    chapter passes it; generated graphs write ``x[:, -1]`` and ``x[:, :-1]`` as exporters do (breaks
    ``differential/view-pass-behaviour``)."""

    def rebuild(self, node: Node) -> None:
        if node.target == aten.select.int and node.args[2] < 0:
            node.args = (*node.args[:2], 0)
        ends = node.args[3] if node.target == aten.slice.Tensor and len(node.args) > 3 else None
        if isinstance(ends, int) and ends < 0:
            node.args = (*node.args[:3], 0, *node.args[4:])


class KeepsFirstRoundRefusals(Forwarding):
    """Decides in two rounds, the way a pass grows: a conservative first round refuses every copy ("not
    yet analysed"), a second rewrites the safe ones, and the first round's refusals are never taken back.
    The graph is the reference's; the report lists every rewritten node as refused too (breaks
    ``differential/view-pass-report``: no node is both)."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(graph_module)
        refused = {name: "not yet analysed" for name in reference.rewritten} | dict(reference.refused)
        return NaiveViewPassOutcome(reference.graph_module, list(reference.rewritten), refused)


#: The reference's refusals that come from its graph-wide analysis, after each copy passed its own checks.
_GRAPH_WIDE = ("source-mutated", "aliases-output")


class ReportsItsCandidates(Forwarding):
    """Builds ``rewritten`` from the candidates that passed the per-node checks, before the graph-wide
    analysis (later writes, outputs) sent some back: those stay copies in the graph but are listed as
    rewritten, and their refusal is dropped (breaks ``lowering/report``: ``rewritten`` must be the views
    the result has)."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(graph_module)
        late = [name for name, why in reference.refused.items() if why in _GRAPH_WIDE]
        refused = {name: why for name, why in reference.refused.items() if name not in late}
        return NaiveViewPassOutcome(reference.graph_module, [*reference.rewritten, *late], refused)


class _AppliesReferenceVerdicts(Forwarding):
    """The reference's verdicts, applied by this pass itself to a copy of the graph (``apply``)."""

    def apply(self, module: GraphModule, names: list[str], reference: GraphModule) -> None:
        raise NotImplementedError

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(copy.deepcopy(graph_module))
        module = copy.deepcopy(graph_module)
        self.apply(module, list(reference.rewritten), reference.graph_module)
        return NaiveViewPassOutcome(module, list(reference.rewritten), dict(reference.refused))


class ForgetsToRecompile(_AppliesReferenceVerdicts):
    """Retargets the nodes and takes every node's ``meta["val"]`` from a fresh propagation, lints the graph,
    and never calls ``recompile()``: the graph (what a compiler lowers) has the views, while ``module(...)``
    still runs the old code with the copies, so a check that runs the module sees nothing wrong (breaks
    ``differential/view-pass-recompiled``)."""

    def apply(self, module: GraphModule, names: list[str], reference: GraphModule) -> None:
        fresh = {n.name: n.meta.get("val") for n in reference.graph.nodes}
        for node in module.graph.nodes:
            if node.name in names:
                node.target = COPY_TO_VIEW[node.target]
            if fresh.get(node.name) is not None:
                node.meta["val"] = fresh[node.name]
        module.graph.lint()


class RefreshesRewrittenMetaOnly(_AppliesReferenceVerdicts):
    """Gives each node it retargets the view's own ``meta["val"]`` (and its ``getitem`` items), recompiles,
    and leaves every other node's value as the copies made it: a pointwise op reading a transposed view is
    transposed too, an in-place op on a view returns that view, yet their meta still says contiguous. The
    lowering chapter, which checks the rewritten nodes only, passes it (breaks
    ``differential/view-pass-meta``: every node downstream of a rewrite)."""

    def apply(self, module: GraphModule, names: list[str], reference: GraphModule) -> None:
        for node in module.graph.nodes:
            if node.name in names:
                _retarget_with_truthful_meta(node, COPY_TO_VIEW[node.target])
        module.graph.lint()
        module.recompile()


RANGE_CHECKS_SOURCE_WRITES = RangeChecksSourceWrites(
    "range-checks-source-writes",
    Breaks(
        ("lowering/source-mutated/policy",),
        LOWERING,
        ("-k", "view_pass_verdicts and source-mutated/disjoint-write"),
        strict_should=True,
    ),
)
WRITES_THROUGH_DEAD_BASES = WritesThroughDeadBases(
    "writes-through-dead-bases",
    Breaks(
        ("lowering/written-by-user/policy",),
        LOWERING,
        ("-k", "view_pass_verdicts and written-by-user/dead-base"),
        strict_should=True,
    ),
)
REFUSES_STRIDED_VIEWS = RefusesStridedViews(
    "refuses-strided-views",
    Breaks(
        ("lowering/not-viewable/missed-rewrite",),
        LOWERING,
        ("-k", "view_pass_verdicts and viewable-of-transposed"),
        strict_should=True,
    ),
)
DROPS_THE_SLICE_STEP = DropsTheSliceStep(
    "drops-the-slice-step",
    Breaks(
        ("lowering/every-view-twin",),
        LOWERING,
        ("-k", "view_pass_keeps_observable_behaviour and every-view-twin/slice_copy"),
    ),
)
WRITES_TO_THE_END_AS_MINUS_ONE = WritesToTheEndAsMinusOne(
    "writes-to-the-end-as-minus-one",
    Breaks(("lowering/slicing-heavy",), LOWERING, ("-k", "view_pass_slicing_heavy_kv_cache")),
)
KEEPS_FIRST_ROUND_REFUSALS = KeepsFirstRoundRefusals(
    "keeps-first-round-refusals",
    Breaks(
        ("differential/view-pass-report",),
        DIFFERENTIAL,
        ("-k", "view_pass_generated_report"),
        strict_should=True,
    ),
)
REPORTS_ITS_CANDIDATES = ReportsItsCandidates(
    "reports-its-candidates",
    Breaks(("lowering/report",), DIFFERENTIAL, ("-k", "view_pass_generated_report"), strict_should=True),
)
FORGETS_TO_RECOMPILE = ForgetsToRecompile(
    "forgets-to-recompile",
    Breaks(("differential/view-pass-recompiled",), DIFFERENTIAL, ("-k", "view_pass_generated_code")),
)
REFRESHES_REWRITTEN_META_ONLY = RefreshesRewrittenMetaOnly(
    "refreshes-rewritten-meta-only",
    Breaks(("differential/view-pass-meta",), DIFFERENTIAL, ("-k", "view_pass_generated_meta")),
)
CLAMPS_NEGATIVE_INDICES = ClampsNegativeIndices(
    "clamps-negative-indices",
    Breaks(("differential/view-pass-behaviour",), DIFFERENTIAL, ("-k", "view_pass_generated_keeps")),
)
