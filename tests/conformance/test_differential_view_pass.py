"""The view-pass section of the differential chapter, proven on our own passes, in process and in seconds:

* the generator draws what it claims: valid edge graphs with truthful ``meta["val"]``, never-zero inputs in
  every layout, every ``*_copy`` op, write and output form; a repro line rebuilds the same graph;
* passes that are correct but not the reference (narrower, more conservative, or second-guessing a
  *should* policy in ways that keep the numbers) pass every generated case: the section judges no policy
  and no missed rewrite;
* the broken passes of ``tests/`` that break a *must* rule (or misreport) are caught by the generated cases
  alone, each by the rule its slip breaks: the catch list.

The chapter's own runs (``tests/conformance/test_broken_chapter_backends.py``) prove the four passes built for
these rules; here the chapter's check functions run directly on one shared list of graphs, drawn without
shrinking (what a failure shrinks to is Hypothesis's business; the repro it carries is checked below).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

import conformance.differential.graph_strategies as gs
import conformance.differential.test_differential as chapter
from conformance.common import generation
from conformance.common.checks import CheckFailure
from conformance.common.edge_form import view_twin
from conformance.common.rules import rule_of
from conformance.common.view_pass_checks import meta_mismatches, observe
from conformance.differential import differential_view_pass as checks
from conformance.differential.graph_specs import DTYPES, LAYOUTS, InputSpec, V, make_input, resolve
from conformance.differential.test_differential import VIEW_PASS_EXAMPLES
from reference_impl import BACKEND as REFERENCE
from reference_impl.lowering import COPY_TO_VIEW
from tests.broken.basic import (
    IGNORES_SOURCE_MUTATION,
    MAPS_NOTHING,
    REFUSES_EVERYTHING,
    REWRITES_ONLY_SLICES,
    REWRITES_READS_BEFORE_WRITE,
    UPSTREAM_LIKE,
)
from tests.broken.option import (
    REPORTS_REFUSED_AS_REWRITTEN,
    RETURNS_PASS_RESULT,
    SKIPS_PER_NODE_CHECKS,
)
from tests.broken.view_pass import (
    CLAMPS_NEGATIVE_INDICES,
    DROPS_THE_SLICE_STEP,
    RANGE_CHECKS_SOURCE_WRITES,
    REFRESHES_REWRITTEN_META_ONLY,
    REFUSES_STRIDED_VIEWS,
    WRITES_THROUGH_DEAD_BASES,
    WRITES_TO_THE_END_AS_MINUS_ONE,
)

#: Graphs drawn once for every test here; the correct passes run on the first ``JUDGED``.
DRAWN, JUDGED = 300, 25
FOREACH = resolve("aten._foreach_add_.Scalar")
CHECKS: dict[str, Callable[..., None]] = {
    "behaviour": checks.check_behaviour,
    "meta": checks.check_meta,
    "recompiled": checks.check_recompiled,
    "report": checks.check_report,
}


@functools.cache
def drawn() -> tuple[gs.GeneratedGraph, ...]:
    """The first ``DRAWN`` graphs of the strategy under the suite's deterministic settings (no shrinking)."""
    found: list[gs.GeneratedGraph] = []

    @settings(
        max_examples=DRAWN,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(gs.graphs())
    def collect(graph: gs.GeneratedGraph) -> None:
        found.append(graph)

    collect()
    return tuple(found)


# ============================================================================================ the generator


def _storage(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())


@pytest.mark.proof
def test_generated_graphs_are_valid_edge_graphs_with_truthful_meta() -> None:
    """Each runs, every node but the output has ``meta["val"]`` and it is truthful (so any lie the
    section reports is the pass's), every input is laid out as its spec says and has no zero anywhere in
    its storage, and the repro line rebuilds the same graph and the same inputs."""
    for graph in drawn()[:JUDGED]:
        module, spec = graph.module, graph.spec
        assert observe(module, graph.inputs).error is None, graph.repro()
        names = {n.name for n in module.graph.nodes if n.op != "output"}
        # Every node whose value holds a tensor (an in-place _foreach op returns none) has one.
        assert all("val" in n.meta for n in module.graph.nodes if n.name in names and n.target != FOREACH)
        assert meta_mismatches(module, graph.inputs, names) == [], graph.repro()
        for t, input_spec in zip(graph.inputs, spec.inputs, strict=True):
            assert tuple(t.shape) == input_spec.shape
            assert str(t.dtype) == f"torch.{input_spec.dtype}"
            assert bool((_storage(t) != 0).all()), graph.repro()
        repro = graph.repro().splitlines()[-1].removeprefix("repro: ")
        rebuilt: dict[str, object] = {}
        exec(repro, rebuilt)  # the repro line, as a user pastes it into a fresh interpreter
        assert rebuilt["module"].code == module.code  # type: ignore[attr-defined]
        assert all(
            torch.equal(a, b) and a.stride() == b.stride()
            for a, b in zip(rebuilt["inputs"], graph.inputs, strict=True)  # type: ignore[call-overload]
        )
        assert f"build({spec!r})" in graph.repro()


def test_layouts_are_what_they_say() -> None:
    shape = (2, 3, 4, 2)
    made = {layout: make_input(InputSpec(shape, "float32", layout, 7)) for layout in LAYOUTS}
    assert made["contiguous"].is_contiguous()
    assert made["transposed"].stride() == (24, 8, 1, 4)
    assert made["sliced"].stride() == (48, 8, 2, 1)
    assert made["sliced"].storage_offset() == 24
    assert made["offset"].is_contiguous()
    assert made["offset"].storage_offset() == 2
    assert made["expanded"].stride()[0] == 0
    assert made["channels_last"].is_contiguous(memory_format=torch.channels_last)
    assert not made["channels_last"].is_contiguous()
    assert torch.equal(make_input(InputSpec(shape, "bfloat16", "sliced", 7)), made["sliced"].bfloat16())


def test_the_generator_reaches_every_copy_op_layout_write_and_output_form() -> None:
    """Over the drawn graphs: every ``*_copy`` op with a view twin that the reference maps (bar
    ``_reshape_alias``, which no exporter emits), every layout and dtype, every kind of write, the
    slice spellings exporters use, and each way of returning."""
    graphs = drawn()
    targets = {call.target for g in graphs for call in g.spec.calls}
    copies = {t for t in targets if t.startswith("aten.") and view_twin(resolve(t)) is not None}
    mapped = {f"aten.{op._opname}.{op._overloadname}" for op in COPY_TO_VIEW} - {
        "aten._reshape_alias_copy.default"
    }
    assert copies >= mapped, sorted(mapped - copies)
    writes = {"aten.add_.Tensor", "aten.mul_.Tensor", "aten.copy_.default", "aten.index_put_.default"}
    writes |= {"aten.fill_.Scalar", "aten.add.out", "method:add_", "aten._foreach_add_.Scalar"}
    assert targets >= writes | {"method:add", "torch.sin", "getitem"}, sorted(writes - targets)
    assert {s.layout for g in graphs for s in g.spec.inputs} == set(LAYOUTS)
    assert {s.dtype for g in graphs for s in g.spec.inputs} == set(DTYPES)
    slices = [c.args for g in graphs for c in g.spec.calls if c.target == "aten.slice_copy.Tensor"]
    assert any(len(a) > 3 and a[3] == gs.TO_THE_END for a in slices)
    assert any(len(a) > 4 and a[4] > 1 for a in slices)
    assert any(len(a) > 2 and isinstance(a[2], int) and a[2] < 0 for a in slices)
    forms = {type(g.spec.outputs) for g in graphs}
    assert forms == {V, tuple, list}


# ============================================================================================ the section


#: Correct by what a caller and a compiler see, whatever their verdicts: narrower than the reference, more
#: conservative, or overriding a *should* policy only where the numbers stay right.
CORRECT = [
    REFERENCE,
    REFUSES_EVERYTHING,
    MAPS_NOTHING,
    REWRITES_READS_BEFORE_WRITE,
    REWRITES_ONLY_SLICES,
    RANGE_CHECKS_SOURCE_WRITES,
    WRITES_THROUGH_DEAD_BASES,
    REFUSES_STRIDED_VIEWS,
]


@pytest.mark.parametrize("backend", CORRECT, ids=[b.name for b in CORRECT])
def test_correct_passes_pass_every_generated_case(backend: object) -> None:
    for graph in drawn()[:JUDGED]:
        for check in CHECKS.values():
            check(backend, graph)


#: Check name -> the chapter's case that runs it.
CASES = {
    "behaviour": chapter.test_view_pass_generated_keeps_behaviour,
    "meta": chapter.test_view_pass_generated_meta_is_truthful,
    "recompiled": chapter.test_view_pass_generated_code_is_the_graphs,
    "report": chapter.test_view_pass_generated_report_describes_the_result,
}


def chapter_rule(name: str, backend: object) -> str | None:
    """The rule the chapter's case ``name`` fails ``backend`` with (None: it passes), on the very graphs CI
    draws: the case's own test body and example count under the suite's profile, without shrinking (the
    derandomized examples follow from the test body, so they are the chapter's)."""
    inner = CASES[name].hypothesis.inner_test  # type: ignore[attr-defined]
    profile = settings(
        settings.get_profile(generation.NO_SHRINK_PROFILE), max_examples=VIEW_PASS_EXAMPLES[name]
    )
    try:
        profile(given(graph=gs.graphs())(inner))(view_pass=backend)
    except CheckFailure as failure:
        return rule_of(str(failure))
    return None


BEHAVIOUR = "differential/view-pass-behaviour"
META = "differential/view-pass-meta"
#: The catch list: broken passes of tests/ that break a *must* rule (or misreport), and the rule each case
#: of the section that can catch them fails them with. Not in it, by design: the *should*-only ones
#: (policy overrides, missed rewrites), which keep every number right and are among the correct passes.
CAUGHT = {
    IGNORES_SOURCE_MUTATION: {"behaviour": BEHAVIOUR},
    UPSTREAM_LIKE: {"behaviour": BEHAVIOUR, "meta": META},
    SKIPS_PER_NODE_CHECKS: {"behaviour": BEHAVIOUR},
    DROPS_THE_SLICE_STEP: {"behaviour": BEHAVIOUR, "meta": META},
    WRITES_TO_THE_END_AS_MINUS_ONE: {"behaviour": BEHAVIOUR, "meta": META},
    RETURNS_PASS_RESULT: {name: "lowering/outcome" for name in CHECKS},
    REPORTS_REFUSED_AS_REWRITTEN: {"report": "differential/view-pass-report"},
    # Built for the section (their chapter runs prove them too,
    # tests/conformance/test_broken_chapter_backends.py): wrong beside the catalogue, which passes them.
    CLAMPS_NEGATIVE_INDICES: {"behaviour": BEHAVIOUR, "meta": META},
    REFRESHES_REWRITTEN_META_ONLY: {"meta": META},
}


@pytest.mark.parametrize("backend", list(CAUGHT), ids=[b.name for b in CAUGHT])
@pytest.mark.proof
def test_generated_cases_alone_catch_the_broken_pass(backend: object) -> None:
    """The section fails the pass, as CI runs it: the first of its cases that can catch the slip and does
    names the slip's rule (cases tried in turn, so the proof does not hang on one case's examples)."""
    expected = CAUGHT[backend]  # type: ignore[index]
    caught = next(((name, rule) for name in expected if (rule := chapter_rule(name, backend))), None)
    assert caught is not None, f"no case of {sorted(expected)} fails {backend.name}"  # type: ignore[attr-defined]
    name, rule = caught
    assert rule == expected[name]
