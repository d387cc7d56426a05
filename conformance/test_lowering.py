"""Chapter lowering — the passes and the lowering of SPEC §1a.

Sections, each its own protocol part (a backend lacking one is skipped there, never failed):

* **view pass** (part ``view_pass``): ``ReplaceViewCopyWithViewPass`` on every graph of the catalogue in
  ``conformance/view_pass_cases.py`` — the verdicts, the observable behaviour of the result, truthful
  ``meta["val"]`` — and on a slicing-heavy KV-cache attention graph. Rules read ``view-pass/<rule>``.
* **whole models** (parts ``lowering`` + ``runtime``): every zoo model × dtype lowers (CPU everywhere, CUDA on
  a GPU), runs, and matches eager float64.

The protocol is in ``conformance/protocol.py``; this module reaches the backend only through it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
import torch
from torch.fx import GraphModule, Interpreter, Node

from conformance.checks import assert_model_output_close, fail
from conformance.conftest import require_part
from conformance.models import ZOO
from conformance.programs import handles, lowered, record
from conformance.protocol import Backend
from conformance.tolerances import DTYPES_BY_NAME
from conformance.view_pass_cases import (
    CASES,
    RULES,
    CaseUnavailable,
    ViewPassCase,
    differences,
    force_view_twins,
    is_view_op,
    kv_cache_attention,
    observe,
    view_twin,
    written_back_copies,
)

# ================================================================================================ view pass

Inputs = tuple[torch.Tensor, ...]

#: A slicing-heavy graph must get at least this many of its copies turned into views (the KV-cache graph
#: has 55 copies; the reference backend rewrites 23, the others have a view user or a later write).
KV_CACHE_MIN_REWRITES = 20
#: A view can change which GEMM kernel runs (a transposed operand) and so its summation order: a few ulp.
KV_CACHE_TOLERANCE = 1e-5


class ViewPassOutcome(Protocol):
    """What ``view_copy_pass`` returns (protocol part ``view_pass``)."""

    graph_module: GraphModule
    rewritten: Sequence[str]
    refused: Mapping[str, str]


class ViewPassBackend(Backend, Protocol):
    def view_copy_pass(self, graph_module: GraphModule, /) -> ViewPassOutcome: ...


@pytest.fixture
def view_pass(backend: ViewPassBackend) -> ViewPassBackend:
    require_part(backend, "view_pass")
    return backend


@dataclass(frozen=True)
class PassRun:
    original: GraphModule
    inputs: Inputs
    outcome: ViewPassOutcome


# One pass run per (backend, case), shared by the checks of that case. The backend gets a deep copy, so the
# original graph stays what the catalogue built, whatever the backend does to its argument.
_RUNS: dict[tuple[int, str], PassRun] = {}


def _call(case_id: str) -> str:
    return f"view_copy_pass({case_id})"


def run_pass(
    backend: ViewPassBackend, case_id: str, rule: str, original: GraphModule, inputs: Inputs
) -> PassRun:
    key = (id(backend), case_id)
    if key in _RUNS:
        return _RUNS[key]
    try:
        outcome = backend.view_copy_pass(copy.deepcopy(original))
    except Exception as exc:  # a valid edge graph must never make the pass fail
        fail(rule, _call(case_id), f"raised {type(exc).__name__}: {exc}")
    graph_module = getattr(outcome, "graph_module", None)
    if not isinstance(graph_module, GraphModule):
        fail("view-pass/outcome", _call(case_id), f"graph_module must be a GraphModule, got {graph_module!r}")
    rewritten, refused = getattr(outcome, "rewritten", None), getattr(outcome, "refused", None)
    if isinstance(rewritten, str) or not isinstance(rewritten, Sequence) or not isinstance(refused, Mapping):
        fail(
            "view-pass/outcome",
            _call(case_id),
            f"rewritten must be a list of node names and refused a mapping of reasons, got {rewritten!r} "
            f"and {refused!r}",
        )
    _RUNS[key] = PassRun(original, inputs, outcome)
    return _RUNS[key]


def build(case: ViewPassCase) -> tuple[GraphModule, Inputs]:
    try:
        return case.build()
    except CaseUnavailable as exc:
        pytest.skip(str(exc))


def _run_case(backend: ViewPassBackend, case: ViewPassCase) -> PassRun:
    key = (id(backend), case.id)
    if key in _RUNS:
        return _RUNS[key]
    return run_pass(backend, case.id, f"view-pass/{case.rule}", *build(case))


def _nodes(module: GraphModule) -> dict[str, Node]:
    return {n.name: n for n in module.graph.nodes}


def _flat(value: Any) -> list[Any]:
    return [v for item in value for v in _flat(item)] if isinstance(value, (list, tuple)) else [value]


class _Recorder(Interpreter):
    """Runs a graph on real tensors and keeps the values of the named nodes."""

    def __init__(self, module: GraphModule, names: set[str]) -> None:
        super().__init__(module)
        self.names = names
        self.values: dict[str, Any] = {}

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if n.name in self.names:
            self.values[n.name] = result
        return result


def meta_mismatches(module: GraphModule, inputs: Inputs, names: set[str]) -> list[str]:
    """Named nodes whose ``meta["val"]`` disagrees with a real run on shape, strides or storage offset."""
    recorder = _Recorder(module, names)
    recorder.run(*[t.clone() for t in inputs])
    found = []
    for name in sorted(names):
        node = _nodes(module)[name]
        fake = node.meta.get("val")
        if fake is None:
            found.append(f"{name} has no meta['val']")
            continue
        for fake_t, real_t in zip(_flat(fake), _flat(recorder.values[name]), strict=False):
            meta = (tuple(fake_t.shape), fake_t.stride(), fake_t.storage_offset())
            real = (tuple(real_t.shape), real_t.stride(), real_t.storage_offset())
            if meta != real:
                found.append(f"{name}: meta (shape, strides, offset) {meta}, real run {real}")
    return found


def _rewritten_in_result(run: PassRun) -> set[str]:
    """Copies of the original graph that are view ops in the result (whatever the backend reports)."""
    result = _nodes(run.outcome.graph_module)
    return {
        name
        for name, n in _nodes(run.original).items()
        if view_twin(n.target) is not None and name in result and is_view_op(result[name].target)
    }


def _ids(cases: Sequence[ViewPassCase]) -> list[str]:
    return [case.id for case in cases]


REWRITING = [case for case in CASES if case.must_rewrite]
NAIVE_IS_WRONG = [case for case in CASES if case.naive_rewrite_is_wrong]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_view_pass_verdicts(view_pass: ViewPassBackend, case: ViewPassCase) -> None:
    """view-pass/<rule>: each copy the case must rewrite is a view op in the result (by schema, not by
    name) and listed in ``rewritten``; each it must refuse is still its copy op and has a reason."""
    run = _run_case(view_pass, case)
    rule, call, why = f"view-pass/{case.rule}", _call(case.id), RULES[case.rule]
    before, after = _nodes(run.original), _nodes(run.outcome.graph_module)
    refused = run.outcome.refused
    for name in sorted(case.must_rewrite):
        op = before[name].target
        if name not in after:
            fail(rule, call, f"node {name} ({op}) is missing from the result graph; it must become a view")
        if not is_view_op(after[name].target):
            said = f" (refused: {refused[name]!r})" if name in refused else ""
            now = after[name].target
            fail(rule, call, f"{name} ({op}) must be rewritten to its view ({why}), but is {now}{said}")
        if name not in run.outcome.rewritten:
            fail(rule, call, f"{name} became {after[name].target} but is not listed in rewritten")
    for name in sorted(case.must_refuse):
        op = before[name].target
        now = after[name].target if name in after else "missing"
        if now != op:
            fail(rule, call, f"{name} ({op}) must stay a copy ({why}), but the result has {now}")
        reason = refused.get(name)
        if not isinstance(reason, str) or not reason.strip():
            fail(rule, call, f"{name} was left a copy, but refused gives no reason for it (got {reason!r})")
    for name in run.outcome.rewritten:
        if name not in after or not is_view_op(after[name].target):
            now = after[name].target if name in after else "missing"
            fail("view-pass/report", call, f"rewritten lists {name}, but the result has {now}, not a view")


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_view_pass_keeps_observable_behaviour(view_pass: ViewPassBackend, case: ViewPassCase) -> None:
    """view-pass/<rule>: on fresh clones of the inputs the result gives bit for bit the original's outputs
    and final input values, and no output shares memory with an input or another output that did not."""
    run = _run_case(view_pass, case)
    found = differences(observe(run.original, run.inputs), observe(run.outcome.graph_module, run.inputs))
    if found:
        fail(f"view-pass/{case.rule}", _call(case.id), "the result behaves differently: " + "; ".join(found))


@pytest.mark.parametrize("case", REWRITING, ids=_ids(REWRITING))
def test_view_pass_meta_is_truthful(view_pass: ViewPassBackend, case: ViewPassCase) -> None:
    """view-pass/truthful-strides: every rewritten node's ``meta["val"]`` has the shape, strides and storage
    offset that the view has in a real run (later passes and the compiler trust them)."""
    run = _run_case(view_pass, case)
    names = _rewritten_in_result(run)
    found = meta_mismatches(run.outcome.graph_module, run.inputs, names)
    if found:
        fail("view-pass/truthful-strides", _call(case.id), "; ".join(found))


@pytest.mark.parametrize("case", NAIVE_IS_WRONG, ids=_ids(NAIVE_IS_WRONG))
def test_suite_self_check_naive_rewrite_is_observable(case: ViewPassCase) -> None:
    """suite/self-check (no backend involved): turning every copy of the case into its view changes what a
    caller observes, so the case really catches a pass that ignores its rule."""
    original, inputs = build(case)
    if not differences(observe(original, inputs), observe(force_view_twins(original), inputs)):
        fail(
            "suite/self-check",
            f"force_view_twins({case.id})",
            "the naive rewrite behaves exactly like the original: this case cannot catch the rule it names",
        )


def test_view_pass_slicing_heavy_kv_cache(view_pass: ViewPassBackend, request: pytest.FixtureRequest) -> None:
    """view-pass/slicing-heavy: one KV-cache attention step (55 copies: slices, selects, permutes, views,
    expands) keeps its behaviour; copies of a cache written back later stay copies; many become views."""
    original, inputs = kv_cache_attention()
    call = _call("kv-cache-attention")
    run = run_pass(view_pass, "kv-cache-attention", "view-pass/slicing-heavy", original, inputs)
    rewritten = _rewritten_in_result(run)
    copies = [n for n in original.graph.nodes if view_twin(n.target) is not None]
    record(request, rewrites=len(rewritten), copies=len(copies))
    stale = sorted(written_back_copies(original) & rewritten)
    if stale:
        fail(
            "view-pass/source-mutated",
            call,
            f"{', '.join(stale)} read a cache that the graph writes back later, but became views",
        )
    found = differences(
        observe(original, inputs), observe(run.outcome.graph_module, inputs), tolerance=KV_CACHE_TOLERANCE
    )
    if found:
        fail("view-pass/slicing-heavy", call, "the result behaves differently: " + "; ".join(found))
    found = meta_mismatches(run.outcome.graph_module, inputs, rewritten)
    if found:
        fail("view-pass/truthful-strides", call, "; ".join(found))
    if len(rewritten) < KV_CACHE_MIN_REWRITES:
        fail(
            "view-pass/every-view-twin",
            call,
            f"only {len(rewritten)} of {len(copies)} copies became views; at least {KV_CACHE_MIN_REWRITES} "
            "can be rewritten safely",
        )


# ============================================================================================= whole models
# Protocol parts ``lowering`` and ``runtime``: every zoo model × dtype is lowered for the CPU (everywhere) and
# for CUDA (on a GPU), every method run once on its example inputs, and each output compared with eager
# PyTorch in float64 on the same weights and inputs.

MODEL_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def eager_float64(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The oracle: the same module and inputs, upcast to float64, run eagerly on the CPU."""
    reference = copy.deepcopy(module).cpu().double()
    upcast = [t.detach().cpu().double() if t.is_floating_point() else t.detach().cpu() for t in inputs]
    with torch.no_grad():
        outputs = reference(*upcast)
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


@pytest.mark.slow
@pytest.mark.parametrize("device", MODEL_DEVICES)
@pytest.mark.parametrize("model", list(ZOO))
@pytest.mark.parametrize("dtype", list(DTYPES_BY_NAME))
def test_zoo_model_lowers_runs_and_matches_eager(
    runtime: Backend, dtype: str, model: str, device: str, request: pytest.FixtureRequest
) -> None:
    """lowering/zoo: the model lowers for the device, every method runs, outputs match eager float64."""
    program = lowered(runtime, model, DTYPES_BY_NAME[dtype], device)
    record(request, program_bytes=len(program.program))
    for method, (module, inputs) in program.eager.items():
        call = f"lower({model}, {dtype}, device={device}) then execute({method!r})"
        with handles(runtime, program.program, method) as (handle,):
            outputs = runtime.execute(handle, [t.cpu() for t in inputs])  # type: ignore[attr-defined]
        expected = eager_float64(module, inputs)
        if len(outputs) != len(expected):
            fail("lowering/zoo", call, f"{len(outputs)} outputs, eager gives {len(expected)}")
        for index, (got, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert_model_output_close("lowering/zoo", f"{call} output {index}", got, ref)
