"""Every helper of ``conformance.common.view_pass_checks``: what a caller can observe of a graph's run, and
the checks on it, pass just inside their rule and fail just past it (one ulp, one shared element, one storage
offset), with failures in the ``[rule] call: ...`` format."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from conformance.common import view_pass_checks as vpc
from conformance.common.checks import CheckFailure
from conformance.common.view_pass_checks import Observation
from tests.meta.boundary import neighbour, straddle
from tests.meta.registry import covers

RULE, CALL = "meta/view", "view_copy_pass(g)"
PREFIX = re.escape(f"[{RULE}] {CALL}: ")
aten = torch.ops.aten


def graph(body: Callable[[Graph, list[Node]], Any], *inputs: torch.Tensor) -> GraphModule:
    """A hand-built graph with fake values on every node, as export leaves them."""
    g = Graph()
    g.output(body(g, [g.placeholder(f"x{i}") for i in range(len(inputs))]))
    module = GraphModule(nn.Module(), g)
    FakeTensorProp(module).propagate(*inputs)
    return module


def sliced(start: int, *, write_base: bool = False) -> Callable[[Graph, list[Node]], Node]:
    """``base = x * 2; s = base[start:start + 2]`` (a copy, named ``s``); optionally ``base += 100`` after."""

    def body(g: Graph, xs: list[Node]) -> Node:
        base = g.call_function(aten.mul.Tensor, (xs[0], 2.0))
        s = g.call_function(aten.slice_copy.Tensor, (base, 0, start, start + 2), name="s")
        if write_base:
            g.call_function(aten.add_.Tensor, (base, 100.0))
        return g.call_function(aten.mul.Tensor, (s, 3.0))

    return body


def returned_slice(g: Graph, xs: list[Node]) -> Node:
    """Returns the copy itself: as a view it would alias the fresh ``base`` only (nobody else sees it)."""
    base = g.call_function(aten.mul.Tensor, (xs[0], 2.0))
    return g.call_function(aten.slice_copy.Tensor, (base, 0, 1, 3), name="s")


X = torch.arange(24.0).reshape(4, 6)


def observation(*values: torch.Tensor, shared: frozenset[tuple[str, str]] = frozenset()) -> Observation:
    return Observation(tuple(f"output {i}" for i in range(len(values))), values, shared)


# ============================================================================================= observe


@covers(vpc.observe, vpc.Observation)
def test_observe_records_outputs_then_the_inputs_final_values_on_clones() -> None:
    x = torch.tensor([1.0, 2.0])

    def writes_its_input(t: torch.Tensor) -> torch.Tensor:
        t.add_(1.0)
        return t * 2

    seen = vpc.observe(writes_its_input, (x,))
    assert seen.labels == ("output 0", "input 0")
    assert [v.tolist() for v in seen.values] == [[4.0, 6.0], [2.0, 3.0]]
    assert seen.shared == frozenset()
    assert seen.error is None
    assert x.tolist() == [1.0, 2.0]  # the caller's tensors are never run on


@covers(vpc.observe)
@pytest.mark.parametrize(
    ("fn", "shared"),
    [
        (lambda t: t[-1:].clone(), set()),  # inside: a copy of the last element shares nothing
        (lambda t: t[-1:], {("output 0", "input 0")}),  # past: a view of that one element
        (lambda t: (t * 2, t * 3), set()),
        (lambda t: ((y := t * 2), y[:1]), {("output 0", "output 1"), ("output 1", "output 0")}),
        (lambda t: t[:1].expand(3), {("output 0", "output 0")}),  # cannot be written: one location, 3 uses
    ],
    ids=["copy-of-one-element", "view-of-one-element", "fresh", "output-views-output", "expanded"],
)
def test_observe_sees_sharing_down_to_one_element(fn: Callable[..., Any], shared: set) -> None:
    assert vpc.observe(fn, (torch.tensor([1.0, 2.0, 3.0]),)).shared == shared


@covers(vpc.observe)
def test_observe_records_an_error_as_an_observation() -> None:
    def raises(t: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom\nsecond line")

    assert vpc.observe(raises, (X,)) == Observation((), (), frozenset(), "ValueError: boom")


# ============================================================================================= differences


@covers(vpc.differences)
def test_differences_is_bitwise_by_default() -> None:
    want = torch.tensor([1.0, 2.0, -0.0, float("nan")])
    assert vpc.differences(observation(want), observation(want.clone())) == []
    one_ulp = want.clone()
    one_ulp[1] = neighbour(one_ulp[1], 1)
    assert vpc.differences(observation(want), observation(one_ulp)) == [
        "output 0: 1 of 4 elements differ; first at (1,): got 2.000000238418579, expected 2.0"
    ]
    signed_zero = want.clone()
    signed_zero[2] = 0.0
    assert vpc.differences(observation(want), observation(signed_zero))  # -0.0 is not 0.0 to a caller
    other_nan = want.clone()
    other_nan.view(torch.int32)[3] += 1  # another NaN payload
    assert vpc.differences(observation(want), observation(other_nan))


@covers(vpc.differences)
@pytest.mark.parametrize("ref", [0.0, 1.0, 300.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_differences_with_a_tolerance_holds_exactly_at_its_bound(ref: float, dtype: torch.dtype) -> None:
    tolerance = 1e-3
    inside, past = straddle(ref, tolerance * (1 + ref), dtype)  # the documented bound, in float64
    want = observation(torch.tensor([ref], dtype=dtype))
    assert vpc.differences(want, observation(inside.reshape(1)), tolerance=tolerance) == []
    assert vpc.differences(want, observation(past.reshape(1)), tolerance=tolerance) == [
        f"output 0: 1 of 1 elements differ; first at (0,): got {past.item()!r}, expected {ref!r}"
    ]
    assert vpc.differences(want, observation(inside.reshape(1)))  # and without one, a difference


@covers(vpc.differences)
def test_differences_with_a_tolerance_matches_nan_and_infinities_with_themselves() -> None:
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    assert vpc.differences(observation(special), observation(special.clone()), tolerance=1e-5) == []
    assert vpc.differences(observation(special), observation(special.flip(0)), tolerance=1e-5)


@covers(vpc.differences)
@pytest.mark.parametrize(
    ("expected", "got", "found"),
    [
        (
            observation(torch.zeros(2)),
            observation(torch.zeros(3)),
            ["output 0: torch.float32[3], expected torch.float32[2]"],
        ),
        (
            observation(torch.zeros(2)),
            observation(torch.zeros(2, dtype=torch.float64)),
            ["output 0: torch.float64[2], expected torch.float32[2]"],
        ),
        (
            observation(torch.zeros(2)),
            observation(torch.zeros(2), torch.zeros(2)),
            ["returned 2 values (outputs and inputs), expected 1"],
        ),
        (
            observation(torch.zeros(1)),
            observation(torch.zeros(1), shared=frozenset({("output 0", "input 0")})),
            ["writing output 0 after the call changes input 0: they now share memory"],
        ),
        (
            observation(torch.zeros(1), shared=frozenset({("output 0", "input 0")})),
            observation(torch.zeros(1)),
            ["writing output 0 after the call no longer changes input 0"],
        ),
        (
            Observation((), (), frozenset(), "ValueError: a"),
            Observation((), (), frozenset(), "ValueError: a"),
            [],
        ),
        (
            observation(torch.zeros(1)),
            Observation((), (), frozenset(), "ValueError: a"),
            ["run raised 'ValueError: a' (expected None)"],
        ),
    ],
    ids=["shape", "dtype", "count", "new-sharing", "lost-sharing", "same-error", "new-error"],
)
def test_differences_names_every_other_kind_of_difference(
    expected: Observation, got: Observation, found: list[str]
) -> None:
    assert vpc.differences(expected, got) == found


# ============================================================================================= forcing views


@covers(vpc.force_view_twins, vpc.forcing_differences)
def test_forcing_a_view_changes_behaviour_only_where_the_base_is_written_after() -> None:
    safe, hazard = graph(sliced(1), X), graph(sliced(1, write_base=True), X)
    forced = vpc.force_view_twins(hazard, {"s"})
    assert {n.name: n.target for n in forced.graph.nodes}["s"] == aten.slice.Tensor
    assert {n.name: n.target for n in hazard.graph.nodes}["s"] == aten.slice_copy.Tensor  # a copy is made
    assert vpc.forcing_differences(safe, (X,), {"s"}) == []
    assert vpc.forcing_differences(hazard, (X,), set()) == []  # nothing forced, nothing changes
    found = vpc.forcing_differences(hazard, (X,), {"s"})
    assert found
    assert found[0].startswith("output 0: 12 of 12 elements differ")


@covers(vpc.force_view_twins)
def test_force_view_twins_without_a_list_rewrites_every_copy_with_a_twin() -> None:
    def body(g: Graph, xs: list[Node]) -> Node:
        t = g.call_function(aten.permute_copy.default, (xs[0], [1, 0]), name="t")
        return g.call_function(aten.slice_copy.Tensor, (t, 0, 0, 2), name="s")

    forced = vpc.force_view_twins(graph(body, X))
    assert {n.name: n.target for n in forced.graph.nodes if n.op == "call_function"} == {
        "t": aten.permute.default,
        "s": aten.slice.Tensor,
    }


@covers(vpc.views_in_result)
def test_views_in_result_are_the_copies_that_became_views_by_name() -> None:
    original = graph(sliced(1), X)
    assert vpc.views_in_result(original, original) == set()
    assert vpc.views_in_result(original, vpc.force_view_twins(original, {"s"})) == {"s"}
    renamed = vpc.force_view_twins(original, {"s"})
    next(n for n in renamed.graph.nodes if n.name == "s").name = "s_renamed"
    assert vpc.views_in_result(original, renamed) == set()  # a node not in the result is not a view of it


# ============================================================================================= meta


@covers(vpc.meta_mismatches)
def test_meta_mismatches_holds_at_one_storage_offset() -> None:
    """A copy's meta (contiguous, offset 0) left on its view: still true for rows 0..1 of a contiguous base,
    false one row further down (offset 6), and false for columns (strides)."""
    at_start = vpc.force_view_twins(graph(sliced(0), X), {"s"})
    assert vpc.meta_mismatches(at_start, (X,), {"s"}) == []
    one_row_down = vpc.force_view_twins(graph(sliced(1), X), {"s"})
    assert vpc.meta_mismatches(one_row_down, (X,), {"s"}) == [
        "s: meta (shape, strides, offset) ((2, 6), (6, 1), 0), real run ((2, 6), (6, 1), 6)"
    ]


def transposed(rows: int) -> Callable[[Graph, list[Node]], Node]:
    """``t = (x * 2)[:rows].permute(1, 0)`` as a copy named ``t``: contiguous as a copy, not as a view."""

    def body(g: Graph, xs: list[Node]) -> Node:
        base = g.call_function(
            aten.slice_copy.Tensor, (g.call_function(aten.mul.Tensor, (xs[0], 2.0)), 0, 0, rows)
        )
        return g.call_function(aten.permute_copy.default, (base, [1, 0]), name="t")

    return body


@covers(vpc.meta_mismatches)
def test_meta_mismatches_ignores_the_stride_of_a_size_one_dimension_only() -> None:
    """Inside: ``[6, 1]`` with strides ``(1, 1)`` (meta) or ``(1, 6)`` (run) place every element alike.
    Past: ``[6, 2]``, where the second stride addresses a real element."""
    one_row = vpc.force_view_twins(graph(transposed(1), X), {"t"})
    assert vpc.meta_mismatches(one_row, (X,), {"t"}) == []
    two_rows = vpc.force_view_twins(graph(transposed(2), X), {"t"})
    assert vpc.meta_mismatches(two_rows, (X,), {"t"}) == [
        "t: meta (shape, strides, offset) ((6, 2), (2, 1), 0), real run ((6, 2), (1, 6), 0)"
    ]


@covers(vpc.meta_mismatches)
def test_meta_mismatches_reports_a_node_without_meta() -> None:
    module = graph(sliced(0), X)
    del next(n for n in module.graph.nodes if n.name == "s").meta["val"]
    assert vpc.meta_mismatches(module, (X,), {"s"}) == ["s has no meta['val']"]


# ============================================================================================= assertions


@covers(vpc.assert_same_behaviour)
def test_assert_same_behaviour_fails_with_what_differs() -> None:
    hazard = graph(sliced(1, write_base=True), X)
    vpc.assert_same_behaviour(RULE, CALL, hazard, vpc.force_view_twins(hazard, set()), (X,))
    with pytest.raises(CheckFailure, match=PREFIX + "the result behaves differently: output 0: 12 of 12"):
        vpc.assert_same_behaviour(RULE, CALL, hazard, vpc.force_view_twins(hazard, {"s"}), (X,))
    aliasing = graph(returned_slice, X)  # a returned view of a fresh base: same values, no new sharing
    vpc.assert_same_behaviour(RULE, CALL, aliasing, vpc.force_view_twins(aliasing), (X,))


@covers(vpc.assert_same_behaviour)
def test_assert_same_behaviour_applies_its_tolerance() -> None:
    x = (torch.tensor([1.0]),)
    inside, past = straddle(1.0, 1e-5 * 2, torch.float32)  # tolerance × (1 + |1.0|)
    exact = torch.fx.symbolic_trace(lambda t: t * 1.0)
    near = torch.fx.symbolic_trace(lambda t: t * inside.item())
    far = torch.fx.symbolic_trace(lambda t: t * past.item())
    vpc.assert_same_behaviour(RULE, CALL, exact, near, x, tolerance=1e-5)
    with pytest.raises(CheckFailure, match=PREFIX + "the result behaves differently: output 0: 1 of 1"):
        vpc.assert_same_behaviour(RULE, CALL, exact, far, x, tolerance=1e-5)
    with pytest.raises(CheckFailure):
        vpc.assert_same_behaviour(RULE, CALL, exact, near, x)  # bitwise without a tolerance


@covers(vpc.assert_truthful_meta)
def test_assert_truthful_meta_fails_one_offset_past() -> None:
    vpc.assert_truthful_meta(RULE, CALL, vpc.force_view_twins(graph(sliced(0), X), {"s"}), (X,), {"s"})
    with pytest.raises(CheckFailure, match=PREFIX + re.escape("s: meta (shape, strides, offset)")):
        vpc.assert_truthful_meta(RULE, CALL, vpc.force_view_twins(graph(sliced(1), X), {"s"}), (X,), {"s"})


# ============================================================================================= layouts


@covers(vpc.as_laid_out)
def test_as_laid_out_keeps_strides_offset_and_the_storage_around_the_view() -> None:
    storage = torch.arange(1.0, 13.0)
    x = storage[2:10].view(2, 4)[:, 1::2].t()  # offset 3, strides (2, 4): transposed and stepped
    fresh = vpc.as_laid_out(x)
    assert (fresh.shape, fresh.stride(), fresh.storage_offset()) == (x.shape, x.stride(), x.storage_offset())
    assert torch.equal(fresh, x)
    assert fresh.untyped_storage().nbytes() == x.untyped_storage().nbytes()
    fresh.add_(100.0)  # a copy: the caller's tensor and its storage are untouched
    assert torch.equal(storage, torch.arange(1.0, 13.0))
    assert x.clone().storage_offset() == 0  # what Tensor.clone would have given instead


@covers(vpc.observe, vpc.meta_mismatches)
def test_runs_see_each_input_laid_out_as_given() -> None:
    """Inside: a slice of an input at storage offset 2 has offset 2 + 6 in meta and in the run. Past: the
    same graph given a contiguous input (offset 0) disagrees by exactly those 2 elements."""
    at_offset = torch.arange(30.0)[2:26].view(4, 6)

    def view_of_input(g: Graph, xs: list[Node]) -> Node:
        return g.call_function(aten.slice.Tensor, (xs[0], 0, 1, 3), name="s")

    module = graph(view_of_input, at_offset)
    assert vpc.meta_mismatches(module, (at_offset,), {"s"}) == []
    assert vpc.meta_mismatches(module, (at_offset.clone(),), {"s"}) == [
        "s: meta (shape, strides, offset) ((2, 6), (6, 1), 8), real run ((2, 6), (6, 1), 6)"
    ]
    assert vpc.observe(lambda t: t.storage_offset() * torch.ones(1), (at_offset,)).values[0].item() == 2


@covers(vpc.meta_mismatches)
def test_meta_mismatches_holds_the_dtype_and_skips_values_without_tensors() -> None:
    def reinterpreted(g: Graph, xs: list[Node]) -> Node:
        g.call_function(aten._foreach_add_.Scalar, ([xs[0]], 1.0), name="w")  # returns no tensor
        return g.call_function(aten.view.dtype, (xs[0], torch.int32), name="bits")

    module = graph(reinterpreted, X.clone())
    assert vpc.meta_mismatches(module, (X,), {"bits", "w"}) == []
    next(n for n in module.graph.nodes if n.name == "bits").meta["val"] = module.graph.find_nodes(
        op="placeholder"
    )[0].meta["val"]  # same layout, float32: one dtype off
    assert vpc.meta_mismatches(module, (X,), {"bits"}) == [
        "bits: meta dtype torch.float32, real run torch.int32"
    ]


def _contiguous_when_fake(t: torch.Tensor) -> torch.Tensor:
    """A function whose fake run lays its result out otherwise than its real run (as a fake kernel that
    disagrees with its eager one would)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return t.t().contiguous() if isinstance(t, FakeTensor) else t.t()


@covers(vpc.unknowable_meta)
def test_unknowable_meta_is_where_torch_own_fake_propagation_disagrees_with_a_run() -> None:
    def body(g: Graph, xs: list[Node]) -> Node:
        g.call_function(_contiguous_when_fake, (xs[0],), name="odd")
        return g.call_function(aten.mul.Tensor, (xs[0], 2.0), name="plain")

    module = graph(body, X)
    assert vpc.unknowable_meta(module, (X,), {"odd", "plain"}) == {"odd"}
    assert vpc.meta_mismatches(module, (X,), {"odd"})  # so a pass could never make it truthful
    assert "val" in next(n for n in module.graph.nodes if n.name == "odd").meta  # the module is untouched


@covers(vpc.downstream)
def test_downstream_follows_users_to_the_end_but_not_the_output() -> None:
    def body(g: Graph, xs: list[Node]) -> tuple[Node, Node]:
        s = g.call_function(aten.slice_copy.Tensor, (xs[0], 0, 0, 2), name="s")
        m = g.call_function(aten.mul.Tensor, (s, 2.0), name="m")
        a = g.call_function(aten.add.Tensor, (m, m), name="a")
        other = g.call_function(aten.neg.default, (xs[0],), name="other")
        return a, other

    module = graph(body, X)
    assert vpc.downstream(module, {"s"}) == {"s", "m", "a"}
    assert vpc.downstream(module, {"a"}) == {"a"}
    assert vpc.downstream(module, {"x0"}) == {"x0", "s", "m", "a", "other"}
    assert vpc.downstream(module, {"not-a-node"}) == set()


# ============================================================================================= the report


@dataclass
class Outcome:
    graph_module: Any
    rewritten: Any = ()
    refused: Any = field(default_factory=dict)
    unmapped: Any = None


@covers(vpc.outcome_problem)
@pytest.mark.parametrize(
    ("outcome", "problem"),
    [
        (Outcome(None), "graph_module must be a GraphModule, got None"),
        (Outcome(..., "s"), "rewritten must be a list of node names and refused a mapping"),
        (Outcome(..., ["s"], [("s", "why")]), "rewritten must be a list of node names and refused a mapping"),
        (Outcome(..., [1]), "rewritten must hold node names (str), got [1]"),
        (Outcome(..., [], {"s": 3}), "refused must map node names (str) to reasons (str), got {'s': 3}"),
    ],
    ids=["graph-module", "rewritten-str", "refused-list", "rewritten-not-names", "reason-not-str"],
)
def test_outcome_problem_names_what_breaks_the_protocol(outcome: Outcome, problem: str) -> None:
    module = graph(sliced(0), X)
    good = Outcome(module, ["s"], {"t": "source-mutated"})
    assert vpc.outcome_problem(good) is None
    assert vpc.outcome_problem(Outcome(module, ("s",), {})) is None  # any sequence of names will do
    bad = Outcome(
        module if outcome.graph_module is ... else outcome.graph_module, outcome.rewritten, outcome.refused
    )
    found = vpc.outcome_problem(bad)
    assert found is not None
    assert found.startswith(problem)


@covers(vpc.report_mismatches)
def test_report_mismatches_hold_rewritten_to_the_views_of_the_result() -> None:
    original = graph(sliced(1), X)
    result = vpc.force_view_twins(original, {"s"})
    assert vpc.report_mismatches(original, result, ["s"]) == []
    assert vpc.report_mismatches(original, result, []) == [
        "s became aten.slice.Tensor but is not listed in rewritten"
    ]
    assert vpc.report_mismatches(original, original, ["s"]) == [
        "rewritten lists s, but the result has aten.slice_copy.Tensor, not a view"
    ]
    assert vpc.report_mismatches(original, result, ["s", "gone"]) == [
        "rewritten lists gone, but the result has missing, not a view"
    ]


@covers(vpc.report_contradictions)
def test_report_contradictions_are_names_in_two_lists_or_in_no_graph() -> None:
    result = vpc.force_view_twins(graph(sliced(1), X), {"s"})
    assert vpc.report_contradictions(Outcome(result, ["s"], {})) == []
    doubled = next(n.name for n in result.graph.nodes if n.target == aten.mul.Tensor)
    assert vpc.report_contradictions(Outcome(result, [], {"s": "view-user"}, {doubled: "aten.mul"})) == []
    assert vpc.report_contradictions(Outcome(result, ["s"], {"s": "not yet analysed"})) == [
        "s listed both as rewritten and as refused"
    ]
    assert vpc.report_contradictions(Outcome(result, ["s"], {}, {"s": "aten.slice_copy.Tensor"})) == [
        "s listed both as rewritten and as unmapped"
    ]
    assert vpc.report_contradictions(Outcome(result, ["s"], {"slice_copy": "view-user"})) == [
        "refused names slice_copy, which the result graph does not have"
    ]


@covers(vpc.stale_code)
def test_stale_code_is_a_graph_edited_without_recompile() -> None:
    module = graph(sliced(1), X)
    assert vpc.stale_code(module) is None
    next(n for n in module.graph.nodes if n.name == "s").target = aten.slice.Tensor
    stale = vpc.stale_code(module)
    assert stale is not None
    assert "- s = torch.ops.aten.slice_copy.Tensor(mul_tensor, 0, 1, 3)" in stale
    assert "+ s = torch.ops.aten.slice.Tensor(mul_tensor, 0, 1, 3)" in stale
    module.recompile()
    assert vpc.stale_code(module) is None
