"""The catalogue of edge-like graphs for ``ReplaceViewCopyWithViewPass`` (SPEC §1a), one case per situation.

For every rule of the pass there is a graph where it should rewrite and one where a rewrite is a hazard: it
changes what a caller observes, which the suite proves for itself (:class:`ViewPassCase` says how each copy's
verdict is held: only a hazard's makes a wrong result). Each case is an ATen ``GraphModule`` in the edge form
a backend's pass receives (``conformance/common/edge_form.py``): views already functionalized into their
``*_copy`` twins, ``meta["val"]`` on every node (as ``torch.export`` leaves it). Graphs are built by hand with
``torch.fx`` where the hazard is a mutation *inside* the graph (export output is functional, so it never has
one; a few hand-built graphs keep a live view on purpose, as the alias that is written or as the view user),
and by exporting small modules where the program writes a buffer or an input back; those are put in edge
form by ``edge_graph``, which makes each write-back an explicit ``aten.copy_``.

Case definitions only. How a run is observed and compared, and the checks built on that, are in
``conformance/common/view_pass_checks.py``; the slicing-heavy graph is
``conformance/lowering/slicing_heavy.py``. No backend is imported here.
"""

from __future__ import annotations

import copy
import functools
import operator
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._ops import OpOverload
from torch.fx import Graph, GraphModule, Node

from conformance.catalogue.rule_table import VIEW_PASS_KINDS
from conformance.common.edge_form import edge_graph, with_fake_values
from conformance.common.rules import family_ids, rule_id

__all__ = [
    "BEHAVIOUR_RULES",
    "CASES",
    "CASES_BY_ID",
    "MISSED_REWRITE_RULES",
    "POLICY_RULES",
    "RULES",
    "CaseUnavailable",
    "ViewPassCase",
]

aten = torch.ops.aten
Inputs = tuple[torch.Tensor, ...]
Body = Callable[[Graph, list[Node]], Any]

#: Kind of situation (``lowering/<kind>``) → why the pass must refuse (or make) the view, as failure
#: messages quote it: the clauses of the rule table (``conformance/catalogue/rule_table.py``), their owner.
RULES: dict[str, str] = VIEW_PASS_KINDS


class CaseUnavailable(Exception):
    """``build()`` cannot make this graph with the installed torch (the message says why): skip, not fail."""


@dataclass(frozen=True)
class ViewPassCase:
    """One situation. ``build()`` returns a fresh graph and its inputs (deterministic, never all zeros).

    Every ``*_copy`` node of the graph is in exactly one of four sets, by what a rewrite of it would do:

    * ``hazard``: turning this copy alone into its view changes what a caller observes (values, the inputs'
      final values, or sharing); the suite proves that for itself, without a backend. A pass that rewrites
      it *and* changes the behaviour breaks the rule (a *must*).
    * ``policy``: SPEC §1a refuses it conservatively (no schema, a view user, a container the pass cannot
      see through), but in this graph the rewrite is not observable: rewriting it is a *should* miss.
    * ``rewrite``: safe, and a view is what the rule asks for. Keeping the copy is never wrong: it is a
      coverage gap when the backend does not map the op, a *should* miss when it maps it and refused.
    * ``free``: either verdict is right, e.g. every use of the copy runs before the write to its source.
    """

    id: str
    rule: str
    build: Callable[[], tuple[GraphModule, Inputs]]
    rewrite: frozenset[str] = frozenset()
    hazard: frozenset[str] = frozenset()
    policy: frozenset[str] = frozenset()
    free: frozenset[str] = frozenset()

    @property
    def copies(self) -> frozenset[str]:
        return self.rewrite | self.hazard | self.policy | self.free

    def __str__(self) -> str:
        return self.id


# ------------------------------------------------------------------------------------------ graph helpers


def _inputs(seed: int, shapes: Sequence[tuple[int, ...]]) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=gen) for shape in shapes)


def _hand_built(body: Body, shapes: Sequence[tuple[int, ...]], seed: int) -> tuple[GraphModule, Inputs]:
    """One placeholder ``x<i>`` per input, fake values on every node (as export leaves them)."""
    inputs = _inputs(seed, shapes)
    graph = Graph()
    placeholders = [graph.placeholder(f"x{i}") for i in range(len(inputs))]
    graph.output(body(graph, placeholders))
    return with_fake_values(GraphModule(nn.Module(), graph), inputs), inputs


# ------------------------------------------------------------------------------------------ the cases

X, Y = (4, 6), (2, 6)
_CASES: list[ViewPassCase] = []


Names = Sequence[str]


def _add(
    case_id: str,
    build: Callable[[], tuple[GraphModule, Inputs]],
    *,
    rewrite: Names = (),
    hazard: Names = (),
    policy: Names = (),
    free: Names = (),
) -> None:
    rule = case_id.split("/")[0]  # every id reads <rule>/<situation>
    sets = (frozenset(rewrite), frozenset(hazard), frozenset(policy), frozenset(free))
    _CASES.append(ViewPassCase(case_id, rule, build, *sets))


def _case(
    case_id: str,
    body: Body,
    shapes: Sequence[tuple[int, ...]] = (X,),
    *,
    rewrite: Names = (),
    hazard: Names = (),
    policy: Names = (),
    free: Names = (),
) -> None:
    """A hand-built case; its inputs are seeded from its id."""
    build = functools.partial(_hand_built, body, tuple(shapes), zlib.crc32(case_id.encode()))
    _add(case_id, build, rewrite=rewrite, hazard=hazard, policy=policy, free=free)


def _exported(
    case_id: str,
    make: Callable[[], tuple[nn.Module, Inputs]],
    *,
    rewrite: Names = (),
    hazard: Names = (),
    free: Names = (),
) -> None:
    """A case exported from a module and put in edge form by :func:`edge_graph` (once per process)."""
    built = functools.cache(lambda: edge_graph(*make()))
    _add(case_id, functools.partial(_fresh_copy, built), rewrite=rewrite, hazard=hazard, free=free)


def _fresh_copy(built: Callable[[], tuple[GraphModule, Inputs]]) -> tuple[GraphModule, Inputs]:
    # Exporting costs ~0.5 s a graph; a deep copy of the first build is just as fresh for the caller.
    module, inputs = built()
    return copy.deepcopy(module), tuple(t.clone() for t in inputs)


def _doubled(g: Graph, x: Node) -> Node:
    """A fresh intermediate: a base that is neither an input nor (unless returned) an output."""
    return g.call_function(aten.mul.Tensor, (x, 2.0))


def _slice(g: Graph, base: Node, dim: int = 0, start: int = 0, end: int = 2) -> Node:
    return g.call_function(aten.slice_copy.Tensor, (base, dim, start, end), name="s")


# --- call-method-user


def _call_method_reads(g: Graph, xs: list[Node]) -> Node:
    return g.call_method("add", (_slice(g, _doubled(g, xs[0])), 1.0))


def _call_method_writes(g: Graph, xs: list[Node]) -> Node:
    base = _doubled(g, xs[0])
    s = _slice(g, base)
    g.call_method("add_", (s, 100.0))
    return g.call_function(aten.cat.default, ([base, s],))


def _call_function_reads(g: Graph, xs: list[Node]) -> Node:
    return g.call_function(aten.add.Tensor, (_slice(g, _doubled(g, xs[0])), 1.0))


# A call_method that only reads: the spec refuses it (nothing says what the method does), but a view reads
# the same numbers, so rewriting it is a policy miss, not a wrong result.
_case("call-method-user/reads", _call_method_reads, policy=["s"])
_case("call-method-user/writes", _call_method_writes, hazard=["s"])
_case("call-method-user/call-function-instead", _call_function_reads, rewrite=["s"])


# --- written-by-user


def _written_by(kind: str) -> Body:
    def body(g: Graph, xs: list[Node]) -> Node:
        base = _doubled(g, xs[0])
        s = _slice(g, base)
        if kind == "in-place":
            g.call_function(aten.add_.Tensor, (s, 100.0))
        elif kind == "out=":
            g.call_function(aten.add.out, (xs[1], xs[1]), {"out": s})
        else:
            s = g.call_function(aten.add.Tensor, (s, 100.0))
        return g.call_function(aten.cat.default, ([base, s],))

    return body


def _written_with_dead_base(g: Graph, xs: list[Node]) -> Node:
    s = _slice(g, _doubled(g, xs[0]))  # nothing reads the base after the copy
    g.call_function(aten.add_.Tensor, (s, 100.0))
    return g.call_function(aten.mul.Tensor, (s, 2.0))


for _kind in ("in-place", "out="):
    _case(f"written-by-user/{_kind}", _written_by(_kind), (X, Y), hazard=["s"])
_case("written-by-user/reading-user", _written_by("reads"), (X, Y), rewrite=["s"])
# The write reaches the base through a view, but nothing reads the base afterwards: the numbers a caller
# sees are the same, and the rule still refuses (a written user blocks the rewrite, whatever is live).
_case("written-by-user/dead-base", _written_with_dead_base, policy=["s"])


# --- view-user


def _view_user(g: Graph, xs: list[Node]) -> Node:
    flat = g.call_function(aten.view.default, (_slice(g, _doubled(g, xs[0])), [-1]))
    return g.call_function(aten.add.Tensor, (flat, 1.0))


def _written_through_view(g: Graph, xs: list[Node]) -> Node:
    base = _doubled(g, xs[0])
    s = _slice(g, base)
    g.call_function(aten.add_.Tensor, (g.call_function(aten.view.default, (s, [-1])), 100.0))
    return g.call_function(aten.cat.default, ([base, s],))


def _non_view_user(g: Graph, xs: list[Node]) -> Node:
    return g.call_function(aten.mm.default, (_slice(g, _doubled(g, xs[0])), xs[1]))


# Reading through a view is not observable (policy); writing through one is (hazard); a slice whose only
# user is an ordinary op (a GEMM operand) is what the rule lets through.
_case("view-user/reads-through-view", _view_user, policy=["s"])
_case("view-user/written-through-view", _written_through_view, hazard=["s"])
_case("view-user/non-view-user", _non_view_user, (X, (6, 3)), rewrite=["s"])


# --- source-mutated: the base is written after the copy (the upstream gap)


def _source_written(how: str) -> Body:
    def body(g: Graph, xs: list[Node]) -> Node:
        x, y = xs
        alias = g.call_function(aten.slice.Tensor, (x, 0, 1, 3))  # a live alias of rows 1..2 of x
        if how == "before":
            g.call_function(aten.add_.Tensor, (x, 100.0))
        s = _slice(g, x)
        if how == "read-before":  # the copy's only reader runs before the write: a view reads the same
            doubled = g.call_function(aten.mul.Tensor, (s, 2.0))
            g.call_function(aten.add_.Tensor, (x, 100.0))
            return doubled
        if how == "add_":
            g.call_function(aten.add_.Tensor, (x, 100.0))
        elif how == "alias-add_":
            g.call_function(aten.add_.Tensor, (alias, 100.0))
        elif how == "disjoint-add_":  # rows 2..3 only: the copy's rows 0..1 never change
            g.call_function(aten.add_.Tensor, (g.call_function(aten.slice.Tensor, (x, 0, 2, 4)), 100.0))
        elif how == "copy_":
            g.call_function(aten.copy_.default, (x, g.call_function(aten.neg.default, (x,))))
        elif how == "index_put_":
            index = g.call_function(aten.arange.default, (2,), {"dtype": torch.int64})
            g.call_function(aten.index_put_.default, (x, [index], y))
        elif how == "slice_scatter+copy_":
            scattered = g.call_function(aten.slice_scatter.default, (x, y, 0, 0, 2))
            g.call_function(aten.copy_.default, (x, scattered))
        elif how == "out=":
            g.call_function(aten.add.out, (x, x), {"out": x})
        return g.call_function(aten.mul.Tensor, (s, 2.0))

    return body


for _how in ("add_", "alias-add_", "copy_", "index_put_", "slice_scatter+copy_", "out="):
    _case(f"source-mutated/{_how}", _source_written(_how), (X, Y), hazard=["s"])
_case("source-mutated/only-before", _source_written("before"), (X, Y), rewrite=["s"])
_case("source-mutated/read-before-write", _source_written("read-before"), (X, Y), free=["s"])
# The write misses the copy's rows, so a view reads the same numbers; SPEC §1a still refuses whenever the
# source is written later (no range analysis): rewriting it is a policy miss.
_case("source-mutated/disjoint-write", _source_written("disjoint-add_"), (X, Y), policy=["s"])


# Every *_copy op: (op, arguments after the base, shape of the input). The copy is named "c".
_EVERY_COPY: dict[str, tuple[OpOverload, tuple[Any, ...], tuple[int, ...]]] = {
    "slice_copy": (aten.slice_copy.Tensor, (1, 1, 5, 2), X),
    "select_copy": (aten.select_copy.int, (0, 2), X),
    "permute_copy": (aten.permute_copy.default, ([1, 0],), X),
    "transpose_copy": (aten.transpose_copy.int, (0, 1), X),
    "t_copy": (aten.t_copy.default, (), X),
    "view_copy": (aten.view_copy.default, ([3, 8],), X),
    "unsqueeze_copy": (aten.unsqueeze_copy.default, (1,), X),
    "squeeze_copy": (aten.squeeze_copy.dim, (1,), (4, 1, 6)),
    "expand_copy": (aten.expand_copy.default, ([3, 4, 6],), X),
    "alias_copy": (aten.alias_copy.default, (), X),
    "diagonal_copy": (aten.diagonal_copy.default, (0, 1, 0), X),
    "unfold_copy": (aten.unfold_copy.default, (1, 3, 2), X),
}


def _one_copy(name: str, *, mutate_base: bool) -> Body:
    op, args, _ = _EVERY_COPY[name]

    def body(g: Graph, xs: list[Node]) -> Node:
        base = _doubled(g, xs[0])
        c = g.call_function(op, (base, *args), name="c")
        if mutate_base:
            g.call_function(aten.add_.Tensor, (base, 100.0))
        return g.call_function(aten.mul.Tensor, (c, 3.0))

    return body


for _name in ("select_copy", "permute_copy", "view_copy", "expand_copy", "alias_copy"):
    _body, _shape = _one_copy(_name, mutate_base=True), _EVERY_COPY[_name][2]
    _case(f"source-mutated/{_name}", _body, (_shape,), hazard=["c"])


class MutatesBuffer(nn.Module):
    """Reads a slice of a buffer, then (if ``mutate``) adds the input to the buffer in place."""

    def __init__(self, mutate: bool) -> None:
        super().__init__()
        self.mutate = mutate
        self.register_buffer("buf", torch.arange(1.0, 13.0).reshape(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.buf[:2] * 2
        if self.mutate:
            self.buf.add_(x)
        return y


class MutatesInput(nn.Module):
    """Reads slices of both inputs, then writes ``x`` in place (a user-input mutation)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = x[:2] * y[:2]
        x.add_(1.0)
        return out


def _buffer_module(mutate: bool) -> tuple[nn.Module, Inputs]:
    return MutatesBuffer(mutate), _inputs(11, [(4, 3)])


def _input_module() -> tuple[nn.Module, Inputs]:
    return MutatesInput(), _inputs(12, [(4, 3), (4, 3)])


# The slice is read before the write-back (which the edge form puts last), so a view reads the same
# numbers: refusing (by node order, as the reference does) and rewriting are both right.
_exported(
    "source-mutated/buffer-written-back",
    functools.partial(_buffer_module, True),
    free=["slice_copy"],
)
_exported(
    "source-mutated/buffer-only-read",
    functools.partial(_buffer_module, False),
    rewrite=["slice_copy"],
)
_exported(
    "source-mutated/user-input-written-back",
    _input_module,
    rewrite=["slice_copy_1"],
    free=["slice_copy"],
)


# --- aliases-output


def _returned_slice_of_input(g: Graph, xs: list[Node]) -> Node:
    return _slice(g, xs[0], 1, 0, 2)


def _returned_slice_of_written_input(g: Graph, xs: list[Node]) -> Node:
    g.call_function(aten.copy_.default, (xs[0], g.call_function(aten.mul.Tensor, (xs[0], 3.0))))
    return _slice(g, xs[0], 1, 0, 2)


def _returned_with_its_base(g: Graph, xs: list[Node]) -> tuple[Node, Node]:
    base = _doubled(g, xs[0])
    return base, _slice(g, base, 1, 0, 2)


def _returned_slice_of_private(g: Graph, xs: list[Node]) -> Node:
    return _slice(g, _doubled(g, xs[0]), 1, 0, 2)


class ReturnsSliceOfWrittenBack(nn.Module):
    """Writes a fresh value back into a buffer and returns a function of a slice of that value."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.arange(1.0, 13.0).reshape(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        new = self.buf * 2 + x
        self.buf.copy_(new)
        return new[:2] + 1


_case("aliases-output/returned-slice-of-input", _returned_slice_of_input, hazard=["s"])
_case("aliases-output/returned-slice-of-written-back-input", _returned_slice_of_written_input, hazard=["s"])
_case("aliases-output/returned-with-its-base", _returned_with_its_base, hazard=["s"])
_case("aliases-output/returned-slice-of-private-value", _returned_slice_of_private, rewrite=["s"])
_exported(
    "aliases-output/read-slice-of-written-back-value",
    lambda: (ReturnsSliceOfWrittenBack(), _inputs(13, [(4, 3)])),
    rewrite=["slice_copy"],
)


# --- opaque-container


def _in_written_list(g: Graph, xs: list[Node]) -> Node:
    base = _doubled(g, xs[0])
    s = _slice(g, base)
    g.call_function(aten._foreach_add_.Scalar, ([s], 100.0))
    return g.call_function(aten.cat.default, ([base, s],))


def _in_written_out_list(g: Graph, xs: list[Node]) -> Node:
    base = _doubled(g, xs[0])
    first, third = _slice(g, base, 0, 0, 1), _slice(g, base, 0, 2, 3)
    g.call_function(aten.split_copy.Tensor_out, (xs[1], 1, 0), {"out": [first, third]})
    return g.call_function(aten.cat.default, ([base, first, third],))


def _getitem_chain(g: Graph, xs: list[Node]) -> Node:
    rows = g.call_function(aten.unbind_copy.int, (_doubled(g, xs[0]), 0), name="rows")
    first = g.call_function(operator.getitem, (rows, 0))
    element = g.call_function(operator.getitem, (first, 1))  # Python indexing of a tensor: another view
    return g.call_function(aten.add.Tensor, (element, 1.0))


def _user_without_schema(g: Graph, xs: list[Node]) -> Node:
    return g.call_function(torch.sin, (_slice(g, _doubled(g, xs[0])),))


def _read_only_lists(g: Graph, xs: list[Node]) -> Node:
    base = _doubled(g, xs[0])
    s = _slice(g, base, 1, 0, 3)
    halves = g.call_function(aten.split_copy.Tensor, (base, 3, 1), name="halves")
    left = g.call_function(operator.getitem, (halves, 0))
    right = g.call_function(operator.getitem, (halves, 1))
    mixed = g.call_function(aten.sub.Tensor, (left, right))
    return g.call_function(aten.cat.default, ([s, mixed],))


_case("opaque-container/in-written-list", _in_written_list, hazard=["s"])
_case("opaque-container/in-written-out-list", _in_written_out_list, (X, Y), hazard=["s", "s_1"])
# Only read, so a view gives the same numbers: the spec refuses what it cannot see through (policy).
_case("opaque-container/getitem-chain", _getitem_chain, policy=["rows"])
_case("opaque-container/user-without-schema", _user_without_schema, policy=["s"])
_case("opaque-container/read-only-lists", _read_only_lists, rewrite=["s", "halves"])


# --- not-viewable


def _view_of_transposed(g: Graph, xs: list[Node]) -> Node:
    transposed = g.call_function(aten.permute.default, (_doubled(g, xs[0]), [1, 0]))
    flat = g.call_function(aten.view_copy.default, (transposed, [-1]), name="flat")
    return g.call_function(aten.add.Tensor, (flat, 1.0))


def _not_viewable_build() -> tuple[GraphModule, Inputs]:
    try:
        return _hand_built(_view_of_transposed, (X,), zlib.crc32(b"not-viewable/view-of-transposed"))
    except ValueError as exc:  # torch 2.11 rejects view_copy of a non-viewable input outright
        raise CaseUnavailable(
            f"torch {torch.__version__} rejects view_copy of a non-viewable input, so this graph cannot "
            f"arise: {str(exc).splitlines()[0]}"
        ) from exc


def _viewable_of_transposed(g: Graph, xs: list[Node]) -> Node:
    transposed = g.call_function(aten.permute.default, (_doubled(g, xs[0]), [1, 0]))
    split = g.call_function(aten.view_copy.default, (transposed, [2, 3, 4]), name="split")
    return g.call_function(aten.add.Tensor, (split, 1.0))


_add("not-viewable/view-of-transposed", _not_viewable_build, hazard=["flat"])
# A non-contiguous base does not make every view fail: splitting its first dimension keeps the strides
# compatible, so the view exists and is safe (the rule refuses only a view the layout forbids).
_case("not-viewable/viewable-of-transposed", _viewable_of_transposed, rewrite=["split"])


# --- every-view-twin: each *_copy op with a view twin is rewritten when nothing can observe it

for _name, (_op, _args, _shape) in _EVERY_COPY.items():
    _case(f"every-view-twin/{_name}", _one_copy(_name, mutate_base=False), (_shape,), rewrite=["c"])


def _transposed_gemm_operand(g: Graph, xs: list[Node]) -> Node:
    c = g.call_function(aten.permute_copy.default, (_doubled(g, xs[0]), [1, 0]), name="c")
    return g.call_function(aten.mm.default, (c, xs[0]))


# A permute_copy feeding a GEMM: the transposed-operand layout every attention block has.
_case("every-view-twin/permute_copy-into-mm", _transposed_gemm_operand, rewrite=["c"])


CASES: tuple[ViewPassCase, ...] = tuple(_CASES)
CASES_BY_ID: dict[str, ViewPassCase] = {case.id: case for case in CASES}
#: The rule ids a case's checks name, by the case's kind: ``lowering/<kind>`` (a hazard made a view, the
#: behaviour changed), ``<kind>/policy`` (a policy copy made a view) and ``<kind>/missed-rewrite`` (a safe
#: copy refused), for the kinds whose cases have such copies. Looked up in the rule table here, so a case
#: of a kind the table lacks stops the import.
BEHAVIOUR_RULES: dict[str, str] = {
    kind: rule_id(f"lowering/{kind}") for kind in sorted({c.rule for c in CASES})
}
POLICY_RULES = family_ids("lowering/{kind}/policy", sorted({c.rule for c in CASES if c.policy}))
MISSED_REWRITE_RULES = family_ids(
    "lowering/{kind}/missed-rewrite", sorted({c.rule for c in CASES if c.rewrite})
)
