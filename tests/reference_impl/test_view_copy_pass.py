"""Edge-like graphs and the reference ``ReplaceViewCopyWithViewPass``.

Every graph of the catalogue (``conformance/lowering/view_pass_cases.py``: for each rule, one to rewrite and
one where a rewrite is a hazard) is run through the reference pass, which rewrites exactly the safe copies the
catalogue asks for and refuses every other (hazard, policy, and the free ones: it refuses by node order)
with the rule's reason id and unchanged behaviour. The tests below it cover what only the reference has: its
report, its use of an ExportedProgram's graph signature, graphs without fake values, edge conversion.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Collection, Sequence
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from conformance.common.edge_form import view_twin
from conformance.common.view_pass_checks import differences, observe
from conformance.lowering.view_pass_cases import (
    CASES,
    CASES_BY_ID,
    RULES,
    CaseUnavailable,
    MutatesBuffer,
    MutatesInput,
    ReturnsSliceOfWrittenBack,
    ViewPassCase,
)
from conformance.models import ZOO
from reference_impl.lowering import (
    COPY_TO_VIEW,
    VIEW_TO_COPY,
    Reason,
    ReplaceViewCopyWithViewPass,
    run_view_copy_pass,
    to_edge_graph,
)

aten = torch.ops.aten
Body = Callable[[Graph, list[Node]], Any]


# --- helpers


def build(body: Body, inputs: Sequence[torch.Tensor]) -> GraphModule:
    """A hand-built graph: one placeholder per input, fake values on every node (as export leaves them)."""
    graph = Graph()
    placeholders = [graph.placeholder(f"x{i}") for i in range(len(inputs))]
    graph.output(body(graph, placeholders))
    module = GraphModule(nn.Module(), graph)
    FakeTensorProp(module).propagate(*inputs)
    return module


def run(module: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs followed by the inputs' final values, so writes into inputs are compared too."""
    fresh = [t.clone() for t in inputs]
    outputs = module(*fresh)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    return [o.clone() for o in outputs] + fresh


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def node(module: GraphModule, name: str) -> Node:
    return next(n for n in module.graph.nodes if n.name == name)


def check(
    module: GraphModule,
    inputs: Sequence[torch.Tensor],
    *,
    rewritten: Collection[str] = (),
    refused: dict[str, Reason] | None = None,
) -> GraphModule:
    """Run the pass; assert exactly which nodes it rewrote and refused (and why), and unchanged behaviour."""
    result, report = run_view_copy_pass(module)
    assert isinstance(result, GraphModule)
    assert {r.node for r in report.rewrites} == set(rewritten), report
    assert {r.node: r.reason for r in report.refusals} == (refused or {}), report
    assert all(r.detail for r in report.refusals)
    assert differences(observe(module, tuple(inputs)), observe(result, tuple(inputs))) == []
    for name in rewritten:
        assert node(result, name).target in VIEW_TO_COPY
    return result


def build_case(case: ViewPassCase) -> tuple[GraphModule, tuple[torch.Tensor, ...]]:
    try:
        return case.build()
    except CaseUnavailable as exc:
        pytest.skip(str(exc))


X = torch.arange(1.0, 25.0).reshape(4, 6)


def doubled(g: Graph, x: Node) -> Node:
    """A fresh intermediate, so that a base is neither an input nor (unless returned) an output."""
    return g.call_function(aten.mul.Tensor, (x, 2.0))


# --- the catalogue: every rule, both directions


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_gives_the_catalogue_verdicts_with_the_rule_as_reason(case: ViewPassCase) -> None:
    module, inputs = build_case(case)
    refused = {name: Reason(case.rule) for name in case.hazard | case.policy | case.free}
    check(module, inputs, rewritten=case.rewrite, refused=refused)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_catalogue_case_is_well_formed(case: ViewPassCase) -> None:
    """Names every copy of its graph exactly once; has non-trivial inputs; the id starts with the rule."""
    module, inputs = build_case(case)
    assert case.rule in RULES
    assert case.id.startswith(f"{case.rule}/")
    sets = (case.rewrite, case.hazard, case.policy, case.free)
    assert sum(len(s) for s in sets) == len(case.copies), "a copy is in two sets"
    copies = {n.name for n in module.graph.nodes if n.op == "call_function" and view_twin(n.target)}
    assert copies == case.copies
    assert all("val" in n.meta for n in module.graph.nodes if n.op == "placeholder" or n.name in copies)
    assert inputs
    assert all(bool(t.ne(0).all()) for t in inputs)


def test_catalogue_covers_every_rule_both_ways() -> None:
    by_rule: dict[str, list[ViewPassCase]] = {rule: [] for rule in RULES}
    for case in CASES:
        by_rule[case.rule].append(case)
    for rule, cases in by_rule.items():
        assert any(c.rewrite for c in cases) or rule == "not-viewable", rule
        assert any(c.hazard for c in cases) or rule == "every-view-twin", rule
    assert CASES_BY_ID["every-view-twin/view_copy"].rewrite  # not-viewable's rewriting twin
    ops = {c.id.removeprefix("every-view-twin/") for c in by_rule["every-view-twin"]}
    assert {"select_copy", "permute_copy", "transpose_copy", "view_copy", "unsqueeze_copy"} <= ops
    assert {"expand_copy", "t_copy", "squeeze_copy", "alias_copy"} <= ops
    assert {c.id for c in by_rule["source-mutated"] if c.free} >= {"source-mutated/read-before-write"}
    # The view-user rule is exercised on slice_copy, an op every pass maps, so no coverage gap hides it.
    for case in by_rule["view-user"]:
        module, _ = build_case(case)
        targets = {n.name: n.target for n in module.graph.nodes}
        assert {targets[name] for name in case.copies} == {aten.slice_copy.Tensor}, case.id
    writes = {c.id for c in by_rule["source-mutated"] if c.hazard}
    assert {
        f"source-mutated/{w}" for w in ("add_", "copy_", "index_put_", "out=", "slice_scatter+copy_")
    } <= writes


# --- what the catalogue cannot hold: reference-only choices and inputs


def test_view_copy_user_blocks_like_a_view_user() -> None:
    """Stricter than upstream (which looks at ``is_view`` only): a view-copy user may become a view too.
    The spec asks this for view users only, so the catalogue (a view user) leaves it to the reference."""

    def body(g: Graph, xs: list[Node]) -> Node:
        s = g.call_function(aten.slice_copy.Tensor, (doubled(g, xs[0]), 0, 0, 2), name="s")
        flat = g.call_function(aten.view_copy.default, (s, [-1]), name="flat")
        return g.call_function(aten.add.Tensor, (flat, 1.0))

    # ``flat`` itself has a plain reader and a fresh base: that one is rewritten.
    check(build(body, [X]), [X], rewritten={"flat"}, refused={"s": Reason.VIEW_USER})


def _check_exported(
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    *,
    reasons: frozenset[Reason] = frozenset(),
    rewrites: bool = False,
) -> None:
    """Export to an edge program (with its graph signature), run the pass, and compare with eager: outputs,
    inputs and buffers, twice."""
    edge = to_edge_graph(copy.deepcopy(module), inputs)
    result, report = run_view_copy_pass(edge)
    assert {r.reason for r in report.refusals} == reasons, report
    assert bool(report.rewrites) == rewrites, report
    eager, lowered = copy.deepcopy(module), result.module()
    for _ in range(2):  # the second call starts from the first call's written-back state
        assert same(run(lowered, inputs), run(eager, inputs))
        lowered_buffers, eager_buffers = dict(lowered.named_buffers()), dict(eager.named_buffers())
        assert lowered_buffers.keys() == eager_buffers.keys()
        assert all(torch.equal(lowered_buffers[k], eager_buffers[k]) for k in eager_buffers)


def test_program_buffer_written_back_blocks() -> None:
    _check_exported(
        MutatesBuffer(mutate=True), (torch.ones(4, 3),), reasons=frozenset({Reason.SOURCE_MUTATED})
    )


def test_program_buffer_not_written_back_allows() -> None:
    _check_exported(MutatesBuffer(mutate=False), (torch.ones(4, 3),), rewrites=True)


def test_program_user_input_written_back_blocks() -> None:
    # The slice of ``x`` (written back) is refused; the slice of ``y`` (only read) is still rewritten.
    inputs = (torch.ones(4, 3), X[:, :3].clone())
    _check_exported(MutatesInput(), inputs, reasons=frozenset({Reason.SOURCE_MUTATED}), rewrites=True)


class _ReturnsInputSlice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :2]


def test_program_returned_slice_of_an_input_blocks() -> None:
    _check_exported(_ReturnsInputSlice(), (X.clone(),), reasons=frozenset({Reason.ALIASES_OUTPUT}))


def test_program_slice_of_a_written_back_output_blocks() -> None:
    """With the signature, a written-back output may share the buffer's memory at run time: refuse."""
    reasons = frozenset({Reason.ALIASES_OUTPUT})
    _check_exported(ReturnsSliceOfWrittenBack(), (torch.ones(4, 3),), reasons=reasons)


def test_without_fake_values_only_layout_free_views_are_rewritten() -> None:
    def body(g: Graph, xs: list[Node]) -> Node:
        base = doubled(g, xs[0])
        s = g.call_function(aten.slice_copy.Tensor, (base, 0, 0, 2), name="s")
        flat = g.call_function(aten.view_copy.default, (base, [-1]), name="flat")
        return g.call_function(aten.add.Tensor, (s, g.call_function(aten.sum.default, (flat,))))

    module = build(body, [X])
    for n in module.graph.nodes:
        n.meta.clear()
    check(module, [X], rewritten={"s"}, refused={"flat": Reason.NOT_VIEWABLE})


# --- metadata, no-op runs, the report


class _StrideCheck(torch.fx.Interpreter):
    """Runs a graph, recording every node whose real strides or storage offset differ from ``meta["val"]``."""

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.mismatches: list[str] = []

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        fake = n.meta.get("val")
        tensors = isinstance(result, torch.Tensor) and isinstance(fake, torch.Tensor)
        if tensors and (fake.stride(), fake.storage_offset()) != (result.stride(), result.storage_offset()):
            self.mismatches.append(f"{n.name}: meta {fake.stride()} real {result.stride()}")
        return result


def test_rewritten_meta_has_the_real_view_strides() -> None:
    def body(g: Graph, xs: list[Node]) -> Node:
        s = g.call_function(aten.slice_copy.Tensor, (doubled(g, xs[0]), 1, 1, 4), name="s")
        return g.call_function(aten.mul.Tensor, (s, 3.0), name="scaled")

    result = check(build(body, [X]), [X], rewritten={"s"})
    meta = node(result, "s").meta["val"]
    assert (meta.stride(), meta.storage_offset()) == ((6, 1), 1)
    checker = _StrideCheck(result)
    checker.run(X.clone())
    assert checker.mismatches == []


def test_nothing_rewritable_leaves_the_graph_untouched() -> None:
    def only_refusals(g: Graph, xs: list[Node]) -> Node:
        s = g.call_function(aten.slice_copy.Tensor, (xs[0], 0, 0, 2), name="s")
        g.call_function(aten.add_.Tensor, (s, 1.0))
        return g.call_function(aten.add.Tensor, (xs[0], 1.0))

    def no_copies(g: Graph, xs: list[Node]) -> Node:
        return g.call_function(aten.add.Tensor, (xs[0], 1.0))

    for body in (only_refusals, no_copies):
        module = build(body, [X])
        code, targets = module.code, [n.target for n in module.graph.nodes]
        view_pass = ReplaceViewCopyWithViewPass()
        with mock.patch.object(module, "recompile") as recompile:
            result = view_pass(module)
        assert result.modified is False
        assert result.graph_module is module
        recompile.assert_not_called()
        assert module.code == code
        assert [n.target for n in module.graph.nodes] == targets
        assert view_pass.report.rewrites == []


def test_report_summary_counts_reasons() -> None:
    module, _ = CASES_BY_ID["written-by-user/in-place"].build()
    _, report = run_view_copy_pass(module)
    assert report.summary() == "0 rewritten, 1 refused (written-by-user=1)"
    assert report.reason_for("s") is Reason.WRITTEN_BY_USER


# --- edge graphs


def test_view_and_copy_tables_are_inverse_twins_with_the_same_arguments() -> None:
    assert {v: c for c, v in COPY_TO_VIEW.items()} == dict(VIEW_TO_COPY)
    for view, copy_op in VIEW_TO_COPY.items():
        assert copy_op._schema.name == view._schema.name + "_copy"
        names = [a.name for a in view._schema.arguments]
        assert [a.name for a in copy_op._schema.arguments] == names
    expected = {"slice", "select", "view", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze"}
    expected |= {"alias", "unfold", "diagonal", "as_strided", "split", "split_with_sizes", "unbind"}
    assert expected <= {v._schema.name.removeprefix("aten::") for v in VIEW_TO_COPY}


@pytest.fixture(scope="module")
def slicing_edge() -> tuple[torch.export.ExportedProgram, nn.Module, tuple[torch.Tensor, ...]]:
    module, inputs = ZOO["slicing_block"].build(torch.float32, "cpu")["forward"]
    return to_edge_graph(module, inputs), module, inputs


def test_edge_graph_has_copies_only_and_matches_eager(slicing_edge: Any) -> None:
    edge, module, inputs = slicing_edge
    targets = [n.target for n in edge.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if t in VIEW_TO_COPY or t is aten._unsafe_view.default]
    assert sum(t in COPY_TO_VIEW for t in targets) >= 30
    edge.validate()
    with torch.no_grad():
        for got, want in zip(edge.module()(*inputs), module(*inputs), strict=True):
            torch.testing.assert_close(got, want)
    checker = _StrideCheck(edge.graph_module)
    checker.run(*_flat_program_inputs(edge, inputs))
    assert checker.mismatches == []


def test_slicing_block_many_rewrites_match_eager_with_truthful_strides(slicing_edge: Any) -> None:
    edge, module, inputs = slicing_edge
    result, report = run_view_copy_pass(edge)
    assert len(report.rewrites) >= 20, report.summary()
    assert {r.reason for r in report.refusals} <= {Reason.VIEW_USER}, report.summary()
    assert any(n.target in VIEW_TO_COPY for n in result.graph.nodes)
    assert not any(n.target in VIEW_TO_COPY for n in edge.graph.nodes), "the input program is left alone"
    result.validate()
    with torch.no_grad():
        for got, want in zip(result.module()(*inputs), module(*inputs), strict=True):
            torch.testing.assert_close(got, want)
    checker = _StrideCheck(result.graph_module)
    checker.run(*_flat_program_inputs(result, inputs))
    assert checker.mismatches == []


def _flat_program_inputs(
    program: torch.export.ExportedProgram, inputs: tuple[torch.Tensor, ...]
) -> list[Any]:
    """Placeholders in graph order: lifted parameters/buffers from the state dict, then the user inputs."""
    signature, user = program.graph_signature, iter(inputs)
    lifted = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    return [
        program.state_dict[lifted[n.name]] if n.name in lifted else next(user)
        for n in program.graph.nodes
        if n.op == "placeholder"
    ]


def test_a_returned_chunk_of_an_expanded_tensor_stays_a_copy() -> None:
    """A chunk that ``split_copy`` cuts from an ``expand`` (stride 0) and the graph returns: as a view its
    elements would share memory, so the caller writing one element would change others (found by the
    differential chapter's generated graphs with ``--hypothesis-seed=2``; the returned-node check missed
    chunks reached through ``getitem``). A chunk that is only read is still rewritten."""

    def body(g: Graph, xs: list[Node]) -> list[Node]:
        wide = g.call_function(aten.expand.default, (doubled(g, xs[0]), [3, 4, 6]), name="wide")
        parts = g.call_function(aten.split_copy.Tensor, (wide, 2, 1), name="parts")  # [3, 2, 6], stride 0
        read = g.call_function(aten.split_copy.Tensor, (wide, 3, 1), name="read")
        chunk = g.call_function(operator.getitem, (parts, 1), name="chunk")
        first = g.call_function(operator.getitem, (read, 0), name="first")
        return [chunk, g.call_function(aten.sum.default, (first,), name="total")]

    check(build(body, [X]), [X], rewritten={"read"}, refused={"parts": Reason.ALIASES_OUTPUT})
