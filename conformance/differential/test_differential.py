"""Chapter differential — generated calls, judged by oracles instead of hand-picked examples (SPEC §1-§2).

Every other chapter checks one hand-picked shape of each rule. This one draws its inputs with Hypothesis
(``conformance/common/generation.py`` keeps a CI run deterministic and bounded) and judges every observable
the spec determines by an oracle: float64 eager PyTorch for values, the reference backend (run in a process of
its own, through the same protocol) for which calls are errors, and the spec itself for what a call may
change. A failing example is shrunk to the shortest sequence of calls that shows it.

Sections, each its own protocol part (a backend lacking one is skipped there, never failed):

* **view pass** (part ``view_pass``): generated edge graphs of ``*_copy`` ops, writes and outputs.
* **runtime** (parts ``lowering`` + ``runtime``): a state machine drives sequences of protocol calls.
* **mm_out** (part ``mm_out``): generated sizes, dtypes and operand layouts against the oracle's kernel.

Rules read ``differential/<rule>``; the differences the spec allows are listed once, in
``conformance/common/oracle.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test
from hypothesis.strategies import SearchStrategy

from conformance.common import crash_journal
from conformance.common.checks import CheckFailure, assert_matmul_close, bits, fail
from conformance.common.contract_surface import tensor_variants
from conformance.common.generation import budget, replay_note, replayed
from conformance.common.oracle import JUDGED, ORACLE_KEY, ORACLE_SPEC_KEY, call, judge
from conformance.common.parts import LoweringRuntimeBackend, OptionsRuntimeBackend, part_fixture, require_part
from conformance.common.programs import SKIP_COPY_OPTION, require_lowering_device
from conformance.common.protocol_checks import OPTION_READ_BACK, busy_caller_stream, compare_option_call
from conformance.common.protocol_machine import RULES as MACHINE_RULES
from conformance.common.protocol_machine import ProtocolMachine, machine_for
from conformance.common.protocol_plans import BAD_INPUTS, OUTPUT_KINDS, VARIANT, InputsPlan, OutputsPlan
from conformance.common.protocol_strategies import (
    EXECUTE_FOCUSES,
    PLACEMENT_FOCUSES,
    every_odd_argument,
    execute_calls,
    option_calls,
    placement_rounds,
)
from conformance.common.rules import rule_id
from conformance.common.strategies import MmOutPlan, mm_out_plans
from conformance.differential import differential_view_pass as view_pass_checks
from conformance.differential.graph_strategies import GeneratedGraph, graphs
from conformance.protocol import Backend, MmOutBackend, ViewPassBackend, implements, missing_attributes
from harness.backend_loader import backend_path, backend_spec

TARGETS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]

# The rules this module checks (conformance/catalogue/rule_table.py).
VALUES = rule_id("differential/values")
INPUTS_UNTOUCHED = rule_id("differential/inputs-untouched")
OUTPUTS_UNTOUCHED = rule_id("differential/outputs-untouched")


@pytest.fixture(scope="session")
def oracle(request: pytest.FixtureRequest) -> Backend:
    """The oracle backend (``--oracle``, default the reference with options of its own)."""
    return request.config.stash[ORACLE_KEY]


def _shrunk(exc: BaseException, spec: str) -> str:
    """The failure's message, then the shrunk steps Hypothesis found, as code that replays them."""
    notes = [replay_note(n) for n in getattr(exc, "__notes__", []) if n.strip()]
    steps = "\n".join(notes)
    oracle = f" (oracle {spec})" if spec else ""
    return f"{exc}\nshrunk repro{oracle}:\n{steps}" if steps else str(exc)


def run_machine(machine: type, examples: int, steps: int, spec: str) -> None:
    """Run a state machine to its budget; a failure is re-raised with its shrunk steps in the message."""
    try:
        run_state_machine_as_test(replayed(machine), settings=budget(examples, steps))
    except CheckFailure as exc:
        raise CheckFailure(_shrunk(exc, spec)) from None
    except Flaky as exc:  # a failure that does not replay: a race, reported with what was seen
        raise CheckFailure(
            f"[differential/threads] {machine.__name__}: a failure that did not replay (a race?): {exc}"
        ) from None


# ================================================================================================ view pass
# Generated edge graphs through the backend's view_copy_pass
# (conformance/differential/differential_view_pass.py says what each rule holds and why). Examples per case: a
# slip in behaviour or meta shows only in graphs with a particular op, argument and reader, so those two get
# the most (tests/conformance/test_differential_view_pass.py holds the catch list to them); the report and the
# recompile show on any graph the pass rewrites.

VIEW_PASS_EXAMPLES = {"behaviour": 100, "meta": 80, "recompiled": 20, "report": 30}


# Cases annotate the gates with their parts' protocols: ``ViewPassBackend``, ``MmOutBackend`` and, for
# ``runtime_with_options``, ``OptionsRuntimeBackend`` (the ``runtime`` fixture's parts, then the option's).
view_pass = part_fixture("view_pass", doc="The backend, for the view pass's generated cases.")
runtime_with_options = part_fixture(
    "lowering", "runtime", "runtime_options", doc="The backend, for the generated option calls."
)
mm = part_fixture("mm_out", doc="The backend, for the generated mm_out calls.")


@pytest.mark.rules(view_pass_checks.OUTCOME, view_pass_checks.BEHAVIOUR)
@budget(VIEW_PASS_EXAMPLES["behaviour"])
@given(graph=graphs())
def test_view_pass_generated_keeps_behaviour(view_pass: ViewPassBackend, graph: GeneratedGraph) -> None:
    """differential/view-pass-behaviour: on fresh inputs laid out as generated, the result gives bit for bit
    the graph's outputs and the inputs' final values, and no output shares memory it did not share."""
    view_pass_checks.check_behaviour(view_pass, graph)


@pytest.mark.rules(view_pass_checks.OUTCOME, view_pass_checks.META)
@budget(VIEW_PASS_EXAMPLES["meta"])
@given(graph=graphs())
def test_view_pass_generated_meta_is_truthful(view_pass: ViewPassBackend, graph: GeneratedGraph) -> None:
    """differential/view-pass-meta: every node that became a view, and every node downstream of one, has
    the dtype, shape, strides and storage offset in ``meta["val"]`` that a real run gives it."""
    view_pass_checks.check_meta(view_pass, graph)


@pytest.mark.rules(view_pass_checks.OUTCOME, view_pass_checks.RECOMPILED)
@budget(VIEW_PASS_EXAMPLES["recompiled"])
@given(graph=graphs())
def test_view_pass_generated_code_is_the_graphs(view_pass: ViewPassBackend, graph: GeneratedGraph) -> None:
    """differential/view-pass-recompiled: the returned module runs the code of its own graph."""
    view_pass_checks.check_recompiled(view_pass, graph)


@pytest.mark.rules(view_pass_checks.OUTCOME, view_pass_checks.REPORT_CONTRADICTIONS, view_pass_checks.REPORT)
@budget(VIEW_PASS_EXAMPLES["report"])
@given(graph=graphs())
def test_view_pass_generated_report_describes_the_result(
    view_pass: ViewPassBackend, graph: GeneratedGraph
) -> None:
    """differential/view-pass-report, lowering/report (*should*): no node both rewritten and refused, only
    nodes the result has, and ``rewritten`` is exactly the copies that are views in the result."""
    view_pass_checks.check_report(view_pass, graph)


# ============================================================================================== runtime


#: The state machine's examples per target, drawn in shards that are cases of their own: on a GPU that a
#: dozen workers share, the CUDA target's examples (many small synchronous calls) took 25-44 s warm in one
#: case, the longest of a run and its end; shards run side by side. Each shard draws its own examples.
PROTOCOL_EXAMPLES = 30
PROTOCOL_SHARDS = 2
SHARDS = [pytest.param(k, id=f"shard{k + 1}") for k in range(PROTOCOL_SHARDS)]


@pytest.mark.rules(*MACHINE_RULES)
@pytest.mark.slow
@pytest.mark.parametrize("shard", SHARDS)
@pytest.mark.parametrize("device", TARGETS)
def test_protocol_calls_agree_with_the_oracle(
    runtime: LoweringRuntimeBackend, oracle: Backend, device: str, shard: int, request: pytest.FixtureRequest
) -> None:
    """Sequences of lower / init / set_option / execute / execute_stats / destroy calls, generated, on the
    backend and the oracle side by side: the same calls are errors (of the same kind, naming the same
    argument), values match float64 eager, inputs are never written, provided outputs hold the result on
    success and are untouched on error, outputs land where the oracle puts them, counters and option
    read-backs agree, threads get their own results. Rules ``differential/*``."""
    machine = _machine(runtime, oracle, device, request, shard)
    examples = PROTOCOL_EXAMPLES // PROTOCOL_SHARDS
    run_machine(machine, examples=examples, steps=20, spec=request.config.stash[ORACLE_SPEC_KEY])


def _machine(
    runtime: LoweringRuntimeBackend,
    oracle: Backend,
    device: str,
    request: pytest.FixtureRequest,
    shard: int = 0,
) -> type[ProtocolMachine]:
    """The machine class for this backend, target and shard, or a skip saying which part or device is
    missing (the ``runtime`` fixture has already required the backend's own parts). Its steps are
    journaled: should one kill the process, the crash is found again and shrunk in fresh processes
    (``conformance/suite/crash_replay.py``)."""
    for part in ("lowering", "runtime"):
        if missing_attributes(oracle, part):
            pytest.skip(f"the oracle {oracle.name!r} lacks protocol part {part!r}")
    require_lowering_device(runtime, device)
    require_lowering_device(oracle, device)
    run_seed = request.config.getoption("--hypothesis-seed", None)
    journal = _journal(request, device=device, shard=shard, run_seed=run_seed)
    return machine_for(runtime, oracle, device, shard=shard, run_seed=run_seed, journal=journal)


def _journal(request: pytest.FixtureRequest, **made: Any) -> crash_journal.CallJournal:
    """The case's journal (``conformance/common/crash_journal.py``): what its replay needs to make the backend
    and the oracle again (``made``: the machine's arguments, or ``kind="calls"`` for steps that are
    functions)."""
    config = request.config
    made = {
        "backend": backend_spec(config.getoption("--backend")),
        "backend_path": backend_path(config.getoption("--backend-path")),
        "oracle": config.stash[ORACLE_SPEC_KEY],
        **made,
    }
    journal = crash_journal.for_case(config, request.node.nodeid, made)
    request.addfinalizer(journal.close)
    return journal


# ============================================================================================== options


@pytest.mark.rules(*JUDGED, OPTION_READ_BACK)
def test_option_calls_agree_with_the_oracle(
    runtime_with_options: OptionsRuntimeBackend, oracle: Backend, request: pytest.FixtureRequest
) -> None:
    """``set_option`` on generated keys and values (lists spaced every way, names in other forms, limits,
    forbidden characters, values that are not strings), each call then ``get_option``: the same calls are
    errors, of the same kind, naming the same argument; what is read back is what the oracle reads back.
    No program is needed, so this case tries many more values than the state machine can (rules
    ``differential/*``); the option is restored afterwards."""
    runtime = runtime_with_options
    if not implements(oracle, "runtime_options"):
        pytest.skip(f"the oracle {oracle.name!r} lacks protocol part 'runtime_options'")
    saved = (runtime.get_option(SKIP_COPY_OPTION), oracle.get_option(SKIP_COPY_OPTION))
    journal = _journal(request, kind="calls")
    backend_side, oracle_side = crash_journal.watched(journal, runtime, oracle)

    @given(key_value=option_calls())
    @budget(examples=200)
    def check(key_value: tuple[object, object]) -> None:
        key, value = key_value
        journal.truncate(0)  # the option is all the state there is: one call, one example
        with journal.step(crash_journal.function_name(compare_option_call), {"key": key, "value": value}):
            compare_option_call(backend_side, oracle_side, key, value)

    try:
        run_generated(check)
    finally:
        runtime.set_option(SKIP_COPY_OPTION, saved[0])
        oracle.set_option(SKIP_COPY_OPTION, saved[1])


# ========================================================================================= focused calls
# The state machine spends most of its steps making programs and handles, so any one kind of call comes a
# few times a run. A slip hides just beside the examples (a dtype converted, an empty or oversized input, a
# placement whose unknown names carry False, a conflict met only at init): these cases draw many calls of
# one kind on the machine's own steps and judge them the same way.


#: Examples per focus (each way of breaking an execute; each aim of a placement round: the lowers cost).
EXECUTE_EXAMPLES = 10
PLACEMENT_EXAMPLES = 15


def focused(
    focuses: Sequence[str],
    strategy: Callable[[str], SearchStrategy[tuple[Any, ...]]],
    examples: int,
    step: Callable[..., None],
    machine: ProtocolMachine,
) -> None:
    """``step(*arguments)`` on ``examples`` draws of ``strategy(focus)`` for each focus in turn: every kind
    of call gets its share of the budget, not what a draw happens to give. Each example's journal is the
    machine's set-up steps and its own call."""
    journal = machine.journal
    mark = journal.mark() if journal is not None else 0
    for focus in focuses:

        @given(arguments=strategy(focus))
        @budget(examples=examples)
        def check(arguments: tuple[Any, ...]) -> None:
            if journal is not None:
                journal.truncate(mark)
            step(*arguments)

        run_generated(check)


@pytest.mark.rules(*MACHINE_RULES)
@pytest.mark.parametrize("device", TARGETS)
def test_execute_calls_agree_with_the_oracle(
    runtime: LoweringRuntimeBackend, oracle: Backend, device: str, request: pytest.FixtureRequest
) -> None:
    """Executes on a handle of every method of the menu's models, broken one way (a dtype, a rank, a size
    past a ``Dim``'s bound or empty, an element, ``outputs=``) or valid in any layout and size, with the
    skip-copy option naming the method or not: the same calls are errors as for the oracle, and every other
    observable is judged as in the state machine (rules ``differential/*``)."""
    with every_method_open(runtime, oracle, device, request) as (machine, handles):
        strategy = lambda f: execute_calls(handles, f)  # noqa: E731
        focused(EXECUTE_FOCUSES, strategy, EXECUTE_EXAMPLES, machine.execute_call, machine)


@contextlib.contextmanager
def every_method_open(
    runtime: LoweringRuntimeBackend, oracle: Backend, device: str, request: pytest.FixtureRequest
) -> Iterator[tuple[ProtocolMachine, int]]:
    """A machine with a handle of every method of the menu's models (and how many), torn down after; a
    skip where no menu model lowers on both sides."""
    machine = _machine(runtime, oracle, device, request)()
    machine.remember_options()
    try:
        machine.open_every_method()
        if not machine.live:
            pytest.skip("no menu model that both the backend and the oracle lower (coverage)")
        yield machine, len(machine.live)
    finally:
        machine.teardown()


@pytest.mark.rules(*MACHINE_RULES)
@pytest.mark.parametrize("device", TARGETS)
def test_every_argument_agrees_with_the_oracle(
    runtime: LoweringRuntimeBackend, oracle: Backend, device: str, request: pytest.FixtureRequest
) -> None:
    """Every argument a caller can pass, each once (``conformance/common/contract_surface.py``): at an input
    of a handle of every menu method, and as a provided output, a tensor of every dtype this torch has, on
    every device here (``meta`` too), of rank 0 and one more or fewer, of size 0, 1 or far past any bound, in
    every layout, requiring grad, a Parameter, an inference tensor, or a value of every other Python type;
    then every parameter of every runtime call left out, ``None``, of every other Python type, and option
    strings at and past their limits counted in characters, bytes, UTF-16 units and graphemes. The same calls
    are errors as for the oracle, and what succeeds returns what the oracle returns, in its structure, with
    the same counters and option after (rules ``differential/*``)."""
    with every_method_open(runtime, oracle, device, request) as (machine, handles):
        for n, variant in enumerate(tensor_variants()):
            for k in range(handles):
                broken = InputsPlan(seed=n, bad=VARIANT + variant, bad_index=n + k, on_device=bool(k % 2))
                machine.execute_call(k, False, broken, OutputsPlan())
            machine.execute_call(n % handles, False, InputsPlan(seed=n), OutputsPlan(VARIANT + variant))
        for n, bad in enumerate(BAD_INPUTS):  # and the named mistakes, each once on every handle
            for k in range(handles):
                machine.execute_call(k, False, InputsPlan(seed=n, bad=bad, bad_index=n + k), OutputsPlan())
        for n, kind in enumerate(OUTPUT_KINDS):
            machine.execute_call(n % handles, False, InputsPlan(seed=n), OutputsPlan(kind))
        for n, odd in enumerate(every_odd_argument()):
            machine.odd_call(n, odd)


# One case per aim: each draws the same examples as in one loop, and xdist spreads them (in one case they
# were a run's last 40 s, one worker busy while the others had finished).
@pytest.mark.rules(*MACHINE_RULES)
@pytest.mark.parametrize("focus", PLACEMENT_FOCUSES)
@pytest.mark.parametrize("device", TARGETS)
def test_placement_calls_agree_with_the_oracle(
    runtime: LoweringRuntimeBackend, oracle: Backend, device: str, focus: str, request: pytest.FixtureRequest
) -> None:
    """Rounds of ``lower`` → ``init`` → one execute, aimed at one thing (``focus``, one of
    ``PLACEMENT_FOCUSES``): methods renamed at ``lower`` and misspelt at ``init``; placement values written
    every way (falsy values, mappings whose unknown, misspelt or spaced names carry ``False``); a valid
    placement against the runtime skip-copy option set before the ``lower`` or after it. The same calls are
    errors as for the oracle (a conflict is one at ``lower`` and at ``init``), naming the same argument
    (rules ``differential/*``)."""
    require_part(runtime, "device_placement")
    machine = _machine(runtime, oracle, device, request)()
    if not machine.placement_keys:
        pytest.skip(f"the oracle {oracle.name!r} lacks protocol part 'device_placement'")
    machine.remember_options()

    try:
        focused((focus,), placement_rounds, PLACEMENT_EXAMPLES, machine.lower_under_option, machine)
    finally:
        machine.teardown()


# =============================================================================================== mm_out


@pytest.mark.rules(*JUDGED, VALUES, INPUTS_UNTOUCHED, OUTPUTS_UNTOUCHED)
@pytest.mark.parametrize("device", TARGETS)
def test_mm_out_agrees_with_the_oracle(
    mm: MmOutBackend, oracle: Backend, device: str, request: pytest.FixtureRequest
) -> None:
    """``mm_out`` on generated sizes (0, 1, primes, powers of two and one past), dtypes and operand layouts
    (transposed, step-sliced, offset, expanded), ``out`` right or broken one way: the same calls are errors
    as for the oracle (on a machine without CUDA every call is one: the operands are host tensors); values
    match float64 within the dtype's tolerance; ``out`` is untouched on error and operands never."""
    if not implements(oracle, "mm_out"):
        pytest.skip(f"the oracle {oracle.name!r} lacks protocol part 'mm_out'")
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("host operands are checked on machines without CUDA; here the cuda case runs")

    journal = _journal(request, kind="calls")
    backend_side, oracle_side = crash_journal.watched(journal, mm, oracle)

    @given(plan=mm_out_plans())
    @budget(examples=60)
    def check(plan: MmOutPlan) -> None:
        journal.truncate(0)
        with journal.step(crash_journal.function_name(mm_out_call), {"device": device, "plan": plan}):
            mm_out_call(backend_side, oracle_side, device, plan)

    run_generated(check)


def mm_out_call(backend: MmOutBackend, oracle: MmOutBackend, device: str, plan: MmOutPlan) -> None:
    """One generated ``mm_out`` on both sides, judged (the oracle first: a journal notes its answer)."""
    out, a, b = plan.build(device)
    out_o, a_o, b_o = plan.build(device)
    before = [bits(t).clone() for t in (out, a, b)]
    text = f"mm_out({plan!r})"
    want = call(oracle.mm_out, out_o, a_o, b_o)
    with written_on_a_busy_stream(a, b):  # CUDA: the operands' values land just before the call
        got = call(backend.mm_out, out, a, b)
    if device == "cuda":
        torch.cuda.synchronize()
    judge("mm_out", text, got, want)
    for name, old, new in (("self", before[1], a), ("mat2", before[2], b)):
        if not torch.equal(old, bits(new)):
            fail(INPUTS_UNTOUCHED, text, f"{name} changed; mm_out never writes its operands")
    if not got.ok:
        if not torch.equal(before[0], bits(out)):
            fail(OUTPUTS_UNTOUCHED, text, "out changed, yet the call was rejected")
        return
    if want.ok:
        assert_matmul_close(VALUES, text, out.cpu(), a.cpu(), b.cpu())


@contextlib.contextmanager
def written_on_a_busy_stream(*operands: object) -> Iterator[None]:
    """For CUDA operands: the call is made on a non-default stream that is busy, and the operands get their
    values on that stream just before the call (NaN until then): a backend that reads them on any other
    stream, or before the caller's earlier work, reads NaN. Elsewhere: nothing."""
    tensors = [
        t
        for t in operands
        if isinstance(t, torch.Tensor)
        and t.is_cuda
        and t.is_floating_point()
        and all(step != 0 or n <= 1 for n, step in zip(t.shape, t.stride(), strict=True))  # not expanded
    ]
    if not tensors:
        yield
        return
    values = [t.clone() for t in tensors]
    for t in tensors:
        t.fill_(float("nan"))
    with busy_caller_stream("cuda", seed=1):  # the machine's busy, non-default caller stream
        for t, v in zip(tensors, values, strict=True):
            t.copy_(v)
        yield


def run_generated(test: Callable[[], None]) -> None:
    """Run a ``@given`` test; a failure is re-raised with the shrunk example in its message."""
    try:
        replayed(test)()
    except CheckFailure as exc:
        raise CheckFailure(_shrunk(exc, "")) from None
