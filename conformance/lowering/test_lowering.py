"""Chapter lowering — the passes and the lowering of SPEC §1a.

Sections, each its own protocol part (a backend lacking one is skipped there, never failed):

* **view pass** (part ``view_pass``): ``ReplaceViewCopyWithViewPass`` on every graph of the catalogue in
  ``conformance/lowering/view_pass_cases.py`` — the verdicts, the observable behaviour of the result, truthful
  ``meta["val"]`` — on a slicing-heavy KV-cache attention graph, and on every method of the Hugging Face
  zoo models (with ``transformers``; the number of copies that became views is recorded). How a graph's
  run is observed and compared is ``conformance/common/view_pass_checks.py``. Rules read ``view-pass/<rule>``:
  a *must* failure there is always a wrong result (values, the inputs' final values, aliasing) or lying
  strides. A conservative refusal the spec asks for, where this graph's rewrite happens to be harmless, is
  ``lowering/<rule>/policy``; a safe rewrite the backend refused is ``lowering/<rule>/missed-rewrite`` (both
  *should*); a safe rewrite of an op the backend does not map (absent from ``rewritten`` and ``refused``) is
  a coverage gap, never a failure.
* **whole models** (parts ``lowering`` + ``runtime``): every zoo model × dtype lowers (CPU everywhere, CUDA on
  a GPU), runs, and matches eager float64.
* **unsupported kernels** (part ``lowering``): a method calling an op that has no kernel is refused with a
  ``ValueError`` naming what is missing, and the next ``lower`` of a good model is unaffected.

The protocol is in ``conformance/protocol.py``; this module reaches the backend only through it.
"""

from __future__ import annotations

import copy
import functools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
from torch.fx import GraphModule, Node

from conformance.common.checks import CheckFailure, assert_model_output_close, coverage_gap, fail
from conformance.common.edge_form import edge_graph, view_twin
from conformance.common.parts import LoweringRuntimeBackend, part_fixture
from conformance.common.programs import handles, lowered, record, require_lowering_device
from conformance.common.rules import Level, level_of, rule_id
from conformance.common.tolerances import DTYPES_BY_NAME
from conformance.common.view_pass_checks import (
    assert_same_behaviour,
    assert_truthful_meta,
    differences,
    forcing_differences,
    observe,
    outcome_problem,
    report_mismatches,
    views_in_result,
)
from conformance.lowering.slicing_heavy import kv_cache_attention
from conformance.lowering.view_pass_cases import (
    BEHAVIOUR_RULES,
    CASES,
    MISSED_REWRITE_RULES,
    POLICY_RULES,
    RULES,
    CaseUnavailable,
    ViewPassCase,
)
from conformance.models import HF_MODELS, HF_UNAVAILABLE, ZOO, get_model
from conformance.models.opaque import OPAQUE_OP, CallsOpaqueOp, opaque_inputs
from conformance.protocol import LoweringBackend, ViewPassBackend, ViewPassOutcome, implements

# ================================================================================================ view pass

Inputs = tuple[torch.Tensor, ...]

# The rules this chapter checks (conformance/catalogue/rule_table.py); a view-pass case's: *_RULES.
OUTCOME = rule_id("lowering/outcome")
REPORT = rule_id("lowering/report")
TRUTHFUL_STRIDES = rule_id("lowering/truthful-strides")
SLICING_HEAVY_MISSED_REWRITE = rule_id("lowering/slicing-heavy/missed-rewrite")
SLICING_HEAVY = rule_id("lowering/slicing-heavy")
SELF_CHECK = rule_id("suite/self-check")
ZOO_LOWERS = rule_id("lowering/zoo-lowers")
UNSUPPORTED_IS_VALUEERROR = rule_id("lowering/unsupported-is-valueerror")
ZOO_MATCHES_EAGER = rule_id("lowering/zoo")
UNSUPPORTED_KERNELS = rule_id("lowering/unsupported-kernels")
FAILURE_NOT_STICKY = rule_id("lowering/failure-not-sticky")


#: A slicing-heavy graph must get at least this many of its copies turned into views (the KV-cache graph
#: has 55 copies; the reference backend rewrites 23, the others have a view user or a later write).
KV_CACHE_MIN_REWRITES = 20
#: A view can change which GEMM kernel runs (a transposed operand) and so its summation order: a few ulp.
KV_CACHE_TOLERANCE = 1e-5


# Cases annotate them with the parts' protocols: ``ViewPassBackend``, ``LoweringBackend``.
view_pass = part_fixture("view_pass", doc="The backend, for cases of part ``view_pass``.")
lowering = part_fixture("lowering", doc="The backend, for cases of part ``lowering`` alone.")


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
    problem = outcome_problem(outcome)
    if problem is not None:
        fail(OUTCOME, _call(case_id), problem)
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
    return run_pass(backend, case.id, BEHAVIOUR_RULES[case.rule], *build(case))


def _nodes(module: GraphModule) -> dict[str, Node]:
    return {n.name: n for n in module.graph.nodes}


def _rewritten_in_result(run: PassRun) -> set[str]:
    """Copies of the original graph that are view ops in the result (whatever the backend reports)."""
    return views_in_result(run.original, run.outcome.graph_module)


_BEHAVIOUR: dict[tuple[int, str], list[str]] = {}


def behaviour_differences(backend: ViewPassBackend, case: ViewPassCase) -> list[str]:
    """What a caller can tell apart between the case's graph and the backend's result (empty: nothing)."""
    key = (id(backend), case.id)
    if key not in _BEHAVIOUR:
        run = _run_case(backend, case)
        _BEHAVIOUR[key] = differences(
            observe(run.original, run.inputs), observe(run.outcome.graph_module, run.inputs)
        )
    return _BEHAVIOUR[key]


def _ids(cases: Sequence[ViewPassCase]) -> list[str]:
    return [case.id for case in cases]


def _declaring(cases: Sequence[ViewPassCase], rules: Callable[[ViewPassCase], list[str]]) -> list:
    """One ``pytest.param`` per case, declaring the rules its kind gives it (``rules(case)``)."""
    return [pytest.param(case, id=case.id, marks=pytest.mark.rules(*rules(case))) for case in cases]


def _kind_rule(case: ViewPassCase) -> list[str]:
    """``lowering/<kind>``: a result that behaves differently, or a pass that raised on the graph."""
    return [BEHAVIOUR_RULES[case.rule]]


def _verdict_rules(case: ViewPassCase) -> list[str]:
    """What :func:`check_verdicts` can fail ``case`` with: its kind's rule, ``<kind>/policy`` where it has a
    copy the SPEC refuses conservatively, ``<kind>/missed-rewrite`` where it has one that is safe."""
    return [
        *_kind_rule(case),
        *([POLICY_RULES[case.rule]] if case.policy else []),
        *([MISSED_REWRITE_RULES[case.rule]] if case.rewrite else []),
    ]


#: One finding of a check: (is a coverage gap, rule id, message).
Finding = tuple[bool, str, str]


def _raise_worst(call: str, findings: Sequence[Finding]) -> None:
    """Fail with the first *must* finding, else the first *should* one; else report the first coverage
    gap. The others are appended to the message, so one run shows them all."""
    if not findings:
        return
    ordered = sorted(findings, key=lambda f: (f[0], level_of(f[1]) is not Level.MUST))
    (is_coverage, rule, message), rest = ordered[0], ordered[1:]
    if rest:
        message += " | also: " + "; ".join(f"[{r}] {m}" for _, r, m in rest)
    if is_coverage:
        coverage_gap(rule, call, message)
    fail(rule, call, message)


def check_verdicts(backend: ViewPassBackend, case: ViewPassCase) -> None:
    """The verdicts of one case, each at the level of what it breaks (see :class:`ViewPassCase`):

    * a ``hazard`` copy that became a view while the result behaves differently: *must*, ``<rule>``;
    * a ``policy`` copy that became a view: *should*, ``<rule>/policy`` (*must* if the result differs);
    * a ``rewrite`` copy left a copy: *should*, ``<rule>/missed-rewrite``, when ``refused`` gives a reason
      (the backend maps the op and chose to refuse); a coverage gap when it does not (the op is unmapped);
    * ``rewritten`` that disagrees with the result graph: *should*, ``lowering/report``.
    """
    run = _run_case(backend, case)
    rule, call, why = BEHAVIOUR_RULES[case.rule], _call(case.id), RULES[case.rule]
    before, after = _nodes(run.original), _nodes(run.outcome.graph_module)
    views, refused, listed = _rewritten_in_result(run), run.outcome.refused, set(run.outcome.rewritten)
    found: list[Finding] = []
    for name in sorted((case.hazard | case.policy) & views):
        op, now = before[name].target, after[name].target
        behaves = behaviour_differences(backend, case)
        if behaves:
            message = f"{name} ({op}) must stay a copy ({why}), but became {now} and the result behaves "
            found.append((False, rule, message + "differently: " + "; ".join(behaves)))
        elif name in case.policy:
            message = f"{name} ({op}) became {now}: the result is right, but the rule refuses it ({why})"
            found.append((False, POLICY_RULES[case.rule], message))
    for name in sorted(case.rewrite - views):
        op = before[name].target
        if name not in after:
            message = f"{name} ({op}) is missing from the result; a view of it is safe here ({why})"
            found.append((False, MISSED_REWRITE_RULES[case.rule], message))
        elif name in refused:
            message = f"{name} ({op}) was refused ({refused[name]!r}), but a view is safe here ({why})"
            found.append((False, MISSED_REWRITE_RULES[case.rule], message))
        else:
            message = f"{op} is not mapped: {name} stayed a copy, though a view is safe here ({why})"
            found.append((True, rule, message))
    for message in report_mismatches(run.original, run.outcome.graph_module, listed):
        found.append((False, REPORT, message))
    _raise_worst(call, found)


def check_behaviour(backend: ViewPassBackend, case: ViewPassCase) -> None:
    """*must*, ``lowering/<rule>``: the result behaves like the case's graph (see :func:`differences`)."""
    found = behaviour_differences(backend, case)
    if found:
        views = sorted(_rewritten_in_result(_run_case(backend, case)))
        message = f"the result behaves differently (copies now views: {', '.join(views) or 'none'}): "
        fail(BEHAVIOUR_RULES[case.rule], _call(case.id), message + "; ".join(found))


def check_meta(backend: ViewPassBackend, case: ViewPassCase) -> None:
    """*must*, ``lowering/truthful-strides``: every rewritten node's ``meta["val"]`` matches a real run."""
    run = _run_case(backend, case)
    rewritten = _rewritten_in_result(run)
    assert_truthful_meta(TRUTHFUL_STRIDES, _call(case.id), run.outcome.graph_module, run.inputs, rewritten)


def check_self(case: ViewPassCase) -> None:
    """The suite's own proof (no backend) that each copy is in the set its observable effect says: a
    ``hazard`` copy made a view alone changes what a caller sees; any other alone, or all others together,
    do not."""
    original, inputs = build(case)
    call = f"force_view_twins({case.id})"
    for name in sorted(case.copies):
        observable = forcing_differences(original, inputs, {name})
        if name in case.hazard and not observable:
            fail(SELF_CHECK, call, f"{name} is a hazard, but making it a view changes nothing visible")
        if name not in case.hazard and observable:
            fail(SELF_CHECK, call, f"{name} is not a hazard, but its view differs: {observable[0]}")
    safe = case.copies - case.hazard
    observable = forcing_differences(original, inputs, safe) if safe else []
    if observable:
        fail(SELF_CHECK, call, f"{sorted(safe)} together as views differ: {observable[0]}")


def check_kv_cache(backend: ViewPassBackend) -> tuple[int, int]:
    """The slicing-heavy graph; returns (copies that became views, copies)."""
    original, inputs = kv_cache_attention()
    call = _call("kv-cache-attention")
    run = run_pass(backend, "kv-cache-attention", SLICING_HEAVY, original, inputs)
    rewritten = _rewritten_in_result(run)
    copies = [n for n in original.graph.nodes if view_twin(n.target) is not None]
    # A view of a cache read before the write-back (the edge form writes back last) reads the same
    # numbers, so the verdict on such a copy is free; what a caller sees is the check.
    result = run.outcome.graph_module
    assert_same_behaviour(SLICING_HEAVY, call, original, result, inputs, tolerance=KV_CACHE_TOLERANCE)
    assert_truthful_meta(TRUTHFUL_STRIDES, call, result, inputs, rewritten)
    if len(rewritten) < KV_CACHE_MIN_REWRITES:
        summary = f"only {len(rewritten)} of {len(copies)} copies became views"
        summary += f"; at least {KV_CACHE_MIN_REWRITES} can safely"
        unmapped = Counter(
            str(n.target) for n in copies if n.name not in rewritten and n.name not in run.outcome.refused
        )
        if unmapped:
            ops = ", ".join(f"{op} ×{count}" for op, count in sorted(unmapped.items()))
            coverage_gap(SLICING_HEAVY, call, f"{summary}; left unmapped: {ops}")
        fail(SLICING_HEAVY_MISSED_REWRITE, call, f"{summary}, and the rest were refused")
    return len(rewritten), len(copies)


REWRITING = [case for case in CASES if case.rewrite]


@pytest.mark.rules(OUTCOME, REPORT)
@pytest.mark.parametrize("case", _declaring(CASES, _verdict_rules))
def test_view_pass_verdicts(view_pass: ViewPassBackend, case: ViewPassCase) -> None:
    """lowering/<rule>: no hazard copy became a view that changes the behaviour (*must*); policy refusals
    kept and safe rewrites made (*should*, or coverage for an op the backend does not map)."""
    check_verdicts(view_pass, case)


@pytest.mark.rules(OUTCOME)
@pytest.mark.parametrize("case", _declaring(CASES, _kind_rule))
def test_view_pass_keeps_observable_behaviour(view_pass: ViewPassBackend, case: ViewPassCase) -> None:
    """lowering/<rule>: on fresh clones of the inputs the result gives bit for bit the original's outputs
    and final input values, and no output shares memory with an input or another output that did not."""
    check_behaviour(view_pass, case)


@pytest.mark.rules(OUTCOME, TRUTHFUL_STRIDES)
@pytest.mark.parametrize("case", _declaring(REWRITING, _kind_rule))
def test_view_pass_meta_is_truthful(view_pass: ViewPassBackend, case: ViewPassCase) -> None:
    """lowering/truthful-strides: every rewritten node's ``meta["val"]`` has the shape, strides and storage
    offset that the view has in a real run (later passes and the compiler trust them)."""
    check_meta(view_pass, case)


@pytest.mark.rules(SELF_CHECK)
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
@pytest.mark.suite_check
def test_suite_self_check_verdicts_match_what_is_observable(case: ViewPassCase) -> None:
    """suite/self-check (no backend involved): every hazard copy, made a view alone, changes what a caller
    observes (so the case catches a pass that ignores its rule); no other copy does, alone or together (so
    a pass that rewrites them is never failed for a wrong result it did not produce)."""
    check_self(case)


@pytest.mark.rules(OUTCOME, SLICING_HEAVY, SLICING_HEAVY_MISSED_REWRITE, TRUTHFUL_STRIDES)
def test_view_pass_slicing_heavy_kv_cache(view_pass: ViewPassBackend, request: pytest.FixtureRequest) -> None:
    """lowering/slicing-heavy: one KV-cache attention step (55 copies: slices, selects, permutes, views,
    expands) keeps its behaviour with truthful strides, and many copies become views (*should*, or
    coverage for the ops the backend does not map)."""
    rewrites, copies = check_kv_cache(view_pass)
    record(request, rewrites=rewrites, copies=copies)


# --- the Hugging Face architectures: real attention blocks, as a backend's pass meets them in production

#: A view can change which GEMM kernel runs and so its summation order, as in the KV-cache graph.
HF_GRAPH_TOLERANCE = KV_CACHE_TOLERANCE


def _hf_graph_params() -> list:
    """(model, method) per Hugging Face method; without transformers one skipped case per model, with why."""
    if HF_UNAVAILABLE is not None:
        skip = pytest.mark.skip(reason=HF_UNAVAILABLE)
        return [pytest.param(name, "all", id=f"{name}-all", marks=skip) for name in HF_MODELS]
    return [
        pytest.param(name, method, id=f"{name}-{method}")
        for name in HF_MODELS
        for method in ZOO[name].methods
    ]


HF_GRAPHS = _hf_graph_params()


@functools.cache
def hf_edge_graph(model: str, method: str) -> tuple[GraphModule, Inputs]:
    """The edge graph of one method of a Hugging Face zoo model (float32), built once per process: the
    pass gets a deep copy and every run fresh clones of the inputs, so sharing it changes nothing."""
    module, inputs = get_model(model).build(torch.float32, "cpu")[method]
    return edge_graph(module, tuple(inputs))


def check_hf_graph(backend: ViewPassBackend, model: str, method: str) -> tuple[int, int, int]:
    """The hazard checks of the catalogue on a real architecture: the result behaves like the graph
    (``lowering/slicing-heavy``, within :data:`HF_GRAPH_TOLERANCE`) and every rewritten node's
    ``meta["val"]`` is truthful (``lowering/truthful-strides``). Returns (copies that became views,
    copies, refusals): how much the pass does on it is recorded, not judged (no spec number exists)."""
    original, inputs = hf_edge_graph(model, method)
    case_id = f"{model}.{method}"
    call = _call(case_id)
    run = run_pass(backend, case_id, SLICING_HEAVY, original, inputs)
    result, rewritten = run.outcome.graph_module, _rewritten_in_result(run)
    assert_same_behaviour(SLICING_HEAVY, call, original, result, inputs, tolerance=HF_GRAPH_TOLERANCE)
    assert_truthful_meta(TRUTHFUL_STRIDES, call, result, inputs, rewritten)
    copies = sum(1 for n in original.graph.nodes if view_twin(n.target) is not None)
    return len(rewritten), copies, len(run.outcome.refused)


@pytest.mark.rules(OUTCOME, SLICING_HEAVY, TRUTHFUL_STRIDES)
@pytest.mark.parametrize(("model", "method"), HF_GRAPHS)
def test_view_pass_on_hugging_face_graphs(
    view_pass: ViewPassBackend, model: str, method: str, request: pytest.FixtureRequest
) -> None:
    """lowering/slicing-heavy, lowering/truthful-strides on each method of the Hugging Face zoo models
    (Whisper encoder/decoder, Qwen3 prefill/decode over a static cache): the pass's result gives the
    graph's outputs and final input values and no new aliasing, with truthful strides; the number of
    copies that became views is recorded. Skipped with the reason without transformers."""
    rewrites, copies, refused = check_hf_graph(view_pass, model, method)
    record(request, rewrites=rewrites, copies=copies, refused=refused)


# ============================================================================================= whole models
# Protocol parts ``lowering`` and ``runtime``: every zoo model × dtype is lowered for the CPU (everywhere) and
# for CUDA (on a GPU), every method run once on its example inputs, and each output compared with eager
# PyTorch in float64 on the same weights and inputs.

MODEL_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
#: Every zoo model; without transformers the Hugging Face ones are skipped cases with the reason, not absent.
ZOO_MODELS = [*ZOO] + (
    []
    if HF_UNAVAILABLE is None
    else [pytest.param(name, id=name, marks=pytest.mark.skip(reason=HF_UNAVAILABLE)) for name in HF_MODELS]
)


def eager_float64(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The oracle: the same module and inputs, upcast to float64, run eagerly on the CPU."""
    reference = copy.deepcopy(module).cpu().double()
    upcast = [t.detach().cpu().double() if t.is_floating_point() else t.detach().cpu() for t in inputs]
    with torch.no_grad():
        outputs = reference(*upcast)
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


@pytest.mark.rules(ZOO_LOWERS, UNSUPPORTED_IS_VALUEERROR)
@pytest.mark.slow
@pytest.mark.parametrize("device", MODEL_DEVICES)
@pytest.mark.parametrize("model", ZOO_MODELS)
@pytest.mark.parametrize("dtype", list(DTYPES_BY_NAME))
def test_zoo_model_lowers(
    lowering: LoweringBackend, dtype: str, model: str, device: str, request: pytest.FixtureRequest
) -> None:
    """lowering/zoo-lowers: the model lowers for the device into a non-empty program (part ``lowering``
    alone, so it also judges a backend whose programs the suite cannot run). A backend that says it cannot
    lower the model — the protocol's ``ValueError`` naming what and why — is reported as coverage; a
    ``RuntimeError`` saying so is the *should* rule ``lowering/unsupported-is-valueerror``; any other
    exception is a crash."""
    require_lowering_device(lowering, device)
    call = f"lower({model}, {dtype}, device={device!r})"
    start = time.perf_counter()
    try:
        program = lowered(lowering, model, DTYPES_BY_NAME[dtype], device)
    except ValueError as exc:
        coverage_gap(ZOO_LOWERS, call, f"the backend cannot lower this model: {exc}")
        raise AssertionError("unreachable") from exc
    except RuntimeError as exc:
        why = "the protocol's way to say 'cannot lower' is a ValueError naming what and why"
        fail(UNSUPPORTED_IS_VALUEERROR, call, f"{why}; got RuntimeError: {exc}")
        raise AssertionError("unreachable") from exc
    except Exception as exc:
        fail(ZOO_LOWERS, call, f"lowering crashed with {type(exc).__name__}: {exc}")
        raise AssertionError("unreachable") from exc
    if not isinstance(program.program, bytes) or not program.program:
        fail(ZOO_LOWERS, call, f"returned {type(program.program).__name__}, not program bytes")
    record(request, program_bytes=len(program.program), lower_seconds=round(time.perf_counter() - start, 3))


@pytest.mark.rules(ZOO_MATCHES_EAGER)
@pytest.mark.slow
@pytest.mark.parametrize("device", MODEL_DEVICES)
@pytest.mark.parametrize("model", ZOO_MODELS)
@pytest.mark.parametrize("dtype", list(DTYPES_BY_NAME))
def test_zoo_model_lowers_runs_and_matches_eager(
    runtime: LoweringRuntimeBackend, dtype: str, model: str, device: str, request: pytest.FixtureRequest
) -> None:
    """lowering/zoo: the model lowers for the device, every method runs, outputs match eager float64."""
    program = lowered(runtime, model, DTYPES_BY_NAME[dtype], device)
    record(request, program_bytes=len(program.program))
    for method, (module, inputs) in program.eager.items():
        call = f"lower({model}, {dtype}, device={device}) then execute({method!r})"
        with handles(runtime, program.program, method) as (handle,):
            outputs = runtime.execute(handle, [t.cpu() for t in inputs])
        expected = eager_float64(module, inputs)
        if len(outputs) != len(expected):
            fail(ZOO_MATCHES_EAGER, call, f"{len(outputs)} outputs, eager gives {len(expected)}")
        for index, (got, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert_model_output_close(ZOO_MATCHES_EAGER, f"{call} output {index}", got, ref)


# ====================================================================================== unsupported kernels
# SPEC §1a: preprocess fails with the kernels the backend does not provide, from a fresh set per call;
# upstream kept one module-level set, so one failing method poisoned every later lowering in the process.

#: What an error for an unlowerable method names: the op, or that a kernel is missing or unsupported.
UNSUPPORTED_WORDS = ("opaque_scale", "kernel", "unsupported", "not supported")


def lower_unsupported(backend: LoweringBackend, device: str) -> None:
    """``lower`` of a method calling :data:`OPAQUE_OP` fails as the protocol says, naming what is missing."""
    call = f"lower({{'forward': calls {OPAQUE_OP}}}, device={device!r})"
    methods = {"forward": (CallsOpaqueOp(), opaque_inputs(device))}
    try:
        program = backend.lower(methods, device=device)
    except ValueError as exc:
        if not any(word in str(exc).lower() for word in UNSUPPORTED_WORDS):
            fail(UNSUPPORTED_KERNELS, call, f"the error must name what is missing: {exc}")
        return
    except RuntimeError as exc:
        why = "the protocol's way to say 'cannot lower' is a ValueError naming what and why"
        fail(UNSUPPORTED_IS_VALUEERROR, call, f"{why}; got RuntimeError: {exc}")
    except Exception as exc:
        fail(UNSUPPORTED_KERNELS, call, f"lowering crashed with {type(exc).__name__}: {exc}")
    fail(
        UNSUPPORTED_KERNELS,
        call,
        f"returned a program ({type(program).__name__}) for a method calling an op with no kernel on any "
        "device; it cannot run, so lower must raise a ValueError naming what is missing",
    )


@pytest.mark.rules(UNSUPPORTED_KERNELS, UNSUPPORTED_IS_VALUEERROR, FAILURE_NOT_STICKY)
@pytest.mark.parametrize("device", MODEL_DEVICES)
def test_unsupported_kernels_fail_and_later_lowers_are_unaffected(
    lowering: LoweringBackend, device: str
) -> None:
    """lowering/unsupported-kernels: a method calling an op no backend has a kernel for is refused with a
    ValueError naming what is missing (lowering/unsupported-is-valueerror, *should*, for a RuntimeError).
    lowering/failure-not-sticky: right after, in the same process, a model the backend lowers fine still
    lowers (and runs to eager's result, for a backend with a runtime): nothing of the failure is kept."""
    require_lowering_device(lowering, device)
    refusal: CheckFailure | None = None
    try:
        lower_unsupported(lowering, device)
    except CheckFailure as exc:  # the later lowering is checked even when the refusal itself was wrong
        refusal = exc
    try:
        check_later_lower(lowering, device)
    except CheckFailure as later:
        if refusal is None:
            raise
        raise CheckFailure(f"{later} | also: {refusal}") from None  # both, the must one first
    if refusal is not None:
        raise refusal


def check_later_lower(backend: LoweringBackend, device: str) -> None:
    rule = FAILURE_NOT_STICKY
    # Built and lowered here, not through programs.lowered(): a program lowered earlier in this process
    # would come from the suite's cache and never ask the backend again.
    module, inputs = get_model("add").build(torch.float32, torch.device(device))["forward"]
    call = f"lower(add, float32, device={device!r}) right after a refused lower"
    try:
        program = backend.lower({"forward": (module, inputs)}, device=device)
    except Exception as exc:
        fail(
            rule,
            call,
            f"a model that lowers on its own failed after the refusal: {type(exc).__name__}: {exc}",
        )
    if not isinstance(program, bytes) or not program:
        fail(rule, call, f"returned {type(program).__name__}, not program bytes")
    if not implements(backend, "runtime"):
        return
    with handles(backend, program, "forward") as (handle,):
        outputs = backend.execute(handle, [t.cpu() for t in inputs])
    assert_model_output_close(rule, f"{call} then execute", outputs[0], eager_float64(module, inputs)[0])
