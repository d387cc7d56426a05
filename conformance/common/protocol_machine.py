"""A Hypothesis state machine that drives the runtime protocol with generated calls, side by side on the
backend under test and on the oracle (``conformance/common/oracle.py``).

Each step is one protocol call — ``lower`` (with placement options, renamed methods), ``init`` (with method
names a caller gets wrong, corrupted programs), ``set_option`` / ``get_option``, ``execute`` (inputs of
every layout and size, valid or broken one way, with and without ``outputs=``), ``execute_stats``,
``destroy``, and executes from several threads at once — made on both backends with the same arguments.
The oracle decides whether the call is an error; the backend's values are judged against float64 eager; the
spec decides what else the call may change (the caller's inputs never; provided outputs only on success).

Steps draw *plans* (``conformance/common/protocol_plans.py``: small frozen dataclasses whose ``repr`` is the
code that makes them, so a shrunk failure prints as a runnable sequence of calls) from the strategies of
``conformance/common/protocol_strategies.py``; the arguments a plan builds and eager's answer are in
``conformance/common/protocol_inputs.py``, and how a call's results are judged in
``conformance/common/protocol_checks.py``. This module makes the calls and keeps the state: programs, handles,
results the caller still holds.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from hypothesis import seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from conformance.common.checks import fail
from conformance.common.crash_journal import CallJournal, journaled, watched
from conformance.common.oracle import JUDGED, CallResult, call, describe_args, judge
from conformance.common.protocol_caller_steps import CallerSteps
from conformance.common.protocol_checks import RULES as CHECKED
from conformance.common.protocol_checks import (
    Held,
    busy_caller_stream,
    check_execute_results,
    check_held,
    check_read_at_once,
    check_structure,
    check_thread_results,
    compare_option_call,
    flat_tensors,
    read_at_once,
    snapshot,
    unchanged,
)
from conformance.common.protocol_inputs import build_inputs, build_outputs, method_spec
from conformance.common.protocol_plans import (
    DTYPE,
    MENU,
    OPAQUE,
    SKIP_COPY_OPTION,
    CorruptPlan,
    InputsPlan,
    LowerPlan,
    OutputsPlan,
)
from conformance.common.protocol_strategies import (
    INIT_NAMES,
    broken_calls,
    lower_plans,
    option_calls,
    valid_inputs_plans,
)
from conformance.common.rules import rule_id
from conformance.common.strategies import NameVariant
from conformance.models import get_model
from conformance.models.opaque import CallsOpaqueOp, opaque_inputs
from conformance.protocol import SKIP_D2H, SKIP_H2D, lower_options, missing_attributes

__all__ = ["RULES", "HandlePair", "ProgramPair", "ProtocolMachine", "as_shard", "machine_for"]

M = TypeVar("M", bound=type)

# The rules this module checks (conformance/catalogue/rule_table.py); the checks of a call's results
# name theirs in conformance/common/protocol_checks.py.
PROGRAM = rule_id("differential/program")
INPUTS_UNTOUCHED = rule_id("differential/inputs-untouched")
OUTPUTS_UNTOUCHED = rule_id("differential/outputs-untouched")
COUNTERS = rule_id("differential/counters")
ERROR_CLASS = rule_id("differential/error-class")
#: Every rule a run of the machine can fail with (its own, its checks', the oracle's): its cases declare them.
RULES = frozenset((PROGRAM, INPUTS_UNTOUCHED, OUTPUTS_UNTOUCHED, COUNTERS, ERROR_CLASS, *CHECKED, *JUDGED))


@dataclass
class ProgramPair:
    plan: LowerPlan
    backend: bytes
    oracle: bytes


@dataclass
class HandlePair:
    program: ProgramPair
    method: str
    zoo_method: str
    backend: object
    oracle: object
    destroyed: bool = False
    #: Whether the handle's byte counters are comparable now: its last execute succeeded on both sides with
    #: nothing the spec lets a backend count its own way (a strided host input); None: never executed.
    countable: bool | None = None


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class ProtocolMachine(CallerSteps, RuleBasedStateMachine):
    """Subclassed by :func:`machine_for` with the backend, the oracle and the target device."""

    backend: ClassVar[Any]
    oracle: ClassVar[Any]
    device: ClassVar[str]
    has_options: ClassVar[bool]
    placement_keys: ClassVar[tuple[str, ...]]
    #: ``lower`` results by (side, plan), across examples: a warm lower still costs an export.
    lowered: ClassVar[dict[tuple[str, str], CallResult]]
    #: The menu's models both backends lowered before the first example (the others are coverage gaps).
    lowerable: ClassVar[frozenset[str]]
    #: Where each step is noted before it runs, so that a step that kills the process can be replayed
    #: (``conformance/common/crash_journal.py``); None: not noted.
    journal: ClassVar[CallJournal | None] = None

    def __init__(self) -> None:
        super().__init__()
        #: Programs lowered and handles made in this example, in order; rules pick one by index (a list, not
        #: a Hypothesis bundle: every example starts with one of each, so calls on them happen from step 1).
        self.programs: list[ProgramPair] = []
        self.live: list[HandlePair] = []
        #: Results the caller still holds (a few of the latest): no later call may change them.
        self.held: list[Held] = []
        self.lower_failed = False  # the backend refused a lower: the next one asks it again
        self.saved_options: tuple[object, object] | None = None
        if self.journal is not None:  # a new example (a focused case's examples mark their own start)
            self.journal.truncate(0)

    # -- plumbing ------------------------------------------------------------------------------------

    @property
    def target(self) -> torch.device:
        if self.device == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _lower(self, side: str, who: Any, plan: LowerPlan) -> CallResult:
        # Keyed by the plan and the runtime option as this side holds it (a placement may conflict with
        # it, and lower must say so); reprs: option values may be unhashable (dicts, lists).
        key = (side, repr(plan), repr(self._runtime_option(who)))
        cached = self.lowered.get(key)
        probe = side == "backend" and self.lower_failed
        if cached is not None and not probe:
            return cached
        if probe:  # the first lower after a refused one asks the backend again: is the failure sticky?
            self.lower_failed = False
        outcome = call(who.lower, self._methods(plan), device=self.device, **self._options_kw(plan))
        if outcome.ok or cached is None:
            self.lowered[key] = outcome
        return outcome

    def _runtime_option(self, who: Any) -> object:
        """``who``'s skip-copy option now (None without the part): what a placement may conflict with."""
        return call(who.get_option, SKIP_COPY_OPTION).value if self.has_options else None

    def _methods(self, plan: LowerPlan) -> dict[str, tuple]:
        if plan.model == OPAQUE:
            return {plan.method_names()[0]: (CallsOpaqueOp(), opaque_inputs(self.device))}
        entry = get_model(plan.model)
        eager = entry.build(DTYPE, torch.device(self.device))
        return {
            name: (*eager[zoo], entry.dynamic_shapes_for(zoo))
            for name, zoo in zip(plan.method_names(), entry.methods, strict=True)
        }

    def _broken_alone(self, plan: LowerPlan) -> tuple[str, ...]:
        """The option keys of ``plan`` the oracle rejects on their own (a backend may report any of them)."""
        if len(plan.options) < 2:
            return ()
        alone = [LowerPlan(plan.model, plan.names, (pair,)) for pair in plan.options]
        return tuple(p.options[0][0] for p in alone if not self._lower("oracle", self.oracle, p).ok)

    @staticmethod
    def _options_kw(plan: LowerPlan) -> dict[str, Any]:
        return {"options": dict(plan.options)} if plan.options else {}

    # -- lower ---------------------------------------------------------------------------------------

    @initialize()
    @journaled
    def remember_options(self) -> None:
        if self.has_options:
            self.saved_options = (
                call(self.backend.get_option, SKIP_COPY_OPTION).value,
                call(self.oracle.get_option, SKIP_COPY_OPTION).value,
            )

    @initialize(model=st.sampled_from(MENU), which=st.integers(0, 1))
    @journaled
    def start(self, model: str, which: int) -> None:
        """Every example starts with a program of a menu model and a handle of one of its methods."""
        if model not in self.lowerable:
            return
        self.lower(LowerPlan(model))
        if self.programs:
            self.init(0, which, "exact", CorruptPlan())

    @rule(plan=st.deferred(lambda: lower_plans()))
    @journaled
    def lower(self, plan: LowerPlan) -> None:
        applicable = [k for k, _ in plan.options if k not in self.placement_keys]
        if applicable:  # options the backend does not list: never sent (the protocol says so)
            return
        if plan.model != OPAQUE and plan.model not in self.lowerable:
            return  # the backend cannot lower this model at all (coverage): nothing to compare
        text = f"lower({plan!r}, device={self.device!r})"
        want = self._lower("oracle", self.oracle, plan)
        got = self._lower("backend", self.backend, plan)
        if not got.ok:
            self.lower_failed = True
        judge("lower", text, got, want, self._broken_alone(plan) if not (got.ok or want.ok) else ())
        if not (got.ok and want.ok):
            return
        if not isinstance(got.value, (bytes, bytearray)) or not got.value:
            fail(PROGRAM, text, f"must return program bytes, got {type(got.value).__name__}")
        self.programs.append(ProgramPair(plan, bytes(got.value), bytes(want.value)))

    @rule(plan=st.deferred(lambda: lower_plans()), which=st.integers(0, 1))
    @journaled
    def lower_and_run(self, plan: LowerPlan, which: int) -> None:
        """``lower``, then at once ``init`` one of the program's methods by its exact name and execute it:
        what options and names a program was lowered with must show in how it runs (and lowers are the
        expensive calls, so each one is put to use)."""
        before = len(self.programs)
        self.lower(plan)
        if len(self.programs) == before:
            return
        live = len(self.live)
        self.init(len(self.programs) - 1, which, "exact", CorruptPlan())
        if len(self.live) > live:
            self._execute(self.live[-1], InputsPlan(seed=which), OutputsPlan())

    # -- init / destroy ------------------------------------------------------------------------------

    @precondition(lambda self: self.programs)
    @rule(
        index=st.integers(0, 7),
        which=st.integers(0, 1),
        name=st.deferred(lambda: INIT_NAMES),
        corrupt=st.one_of(
            st.just(CorruptPlan()),
            st.just(CorruptPlan()),
            st.builds(
                CorruptPlan,
                st.sampled_from(("truncated", "flipped", "trailing", "empty", "not-bytes")),
                st.sampled_from((0.0, 0.1, 0.5, 0.9, 0.999)),
            ),
        ),
    )
    @journaled
    def init(self, index: int, which: int, name: str, corrupt: CorruptPlan) -> None:
        program = self.programs[index % len(self.programs)]
        names = program.plan.method_names()
        real = names[which % len(names)]
        # One broken argument per call: a corrupt program goes with the right name.
        method = NameVariant(real, name if corrupt.kind == "intact" else "exact").apply()
        if isinstance(method, str) and method in names:  # a variant that names another method ("Step")
            real = method
        text = f"init(<program of {program.plan!r}> {corrupt!r}, {method!r})"
        # The oracle first, everywhere: the journal notes its answer beside the backend's call.
        want = call(self.oracle.init, corrupt.apply(program.oracle), method)
        got = call(self.backend.init, corrupt.apply(program.backend), method)
        if got.ok != want.ok:  # a handle only one side made: released before the verdict
            made, who = (got, self.backend) if got.ok else (want, self.oracle)
            call(who.destroy, made.value)
        judge("init", text, got, want)
        if not (got.ok and want.ok):
            return
        zoo = program.plan.zoo_methods()[names.index(real)]
        self.live.append(HandlePair(program, real, zoo, got.value, want.value))

    def _handle(self, index: int) -> HandlePair:
        return self.live[index % len(self.live)]

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    @journaled
    def destroy(self, index: int) -> None:
        """Destroy a handle (again, if the index picks a destroyed one); its stats are then an error."""
        handle = self._handle(index)
        text = f"destroy(<handle of {handle.method!r}>{' (destroyed)' if handle.destroyed else ''})"
        want = call(self.oracle.destroy, handle.oracle)
        got = call(self.backend.destroy, handle.backend)
        handle.destroyed = True
        judge("destroy", text, got, want)
        stats_o = call(self.oracle.execute_stats, handle.oracle)
        stats_b = call(self.backend.execute_stats, handle.backend)
        judge("execute_stats", f"execute_stats(<destroyed handle of {handle.method!r}>)", stats_b, stats_o)

    # -- options -------------------------------------------------------------------------------------

    @precondition(lambda self: self.has_options)
    @rule(key_value=st.deferred(lambda: option_calls()))
    @journaled
    def set_option(self, key_value: tuple[object, object]) -> None:
        """``set_option`` with an odd value for the known key, or an odd key with a good value (one broken
        argument per call), then the read-back, then every live handle executes once (options take effect
        on the next execute)."""
        text = compare_option_call(self.backend, self.oracle, *key_value)
        # Options take effect on the next execute: run every live handle once (where outputs go, values).
        for handle in [h for h in self.live if not h.destroyed][:3]:
            self._execute(handle, InputsPlan(seed=len(text)), OutputsPlan())

    # -- execute -------------------------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), broken=st.deferred(lambda: broken_calls()))
    @journaled
    def execute(self, index: int, broken: tuple[InputsPlan, OutputsPlan]) -> None:
        """An execute that breaks one argument (``inputs``, or ``outputs=``): the oracle says how it fails."""
        self._execute(self._handle(index), *broken)

    @precondition(lambda self: self.live)
    @rule(
        index=st.integers(0, 7),
        inputs=st.deferred(lambda: valid_inputs_plans()),
        provided=st.booleans(),
    )
    @journaled
    def execute_valid(self, index: int, inputs: InputsPlan, provided: bool) -> None:
        """An execute the spec allows (any layout and size in range), with or without ``outputs=``: the
        calls a backend must get right, drawn as often as all the broken ones together."""
        self._execute(self._handle(index), inputs, OutputsPlan("provided" if provided else "none"))

    def _execute(
        self,
        handle: HandlePair,
        inputs: InputsPlan,
        outputs: OutputsPlan,
        given: tuple[object, object] | None = None,
    ) -> None:
        """One execute on both sides, judged. ``given``: the ``inputs`` arguments (backend's, oracle's) the
        caller already holds, with the values ``inputs`` describes (else they are built from it)."""
        spec = method_spec(handle.program.plan.model, handle.zoo_method)
        device = self.target if (inputs.on_device and self.device == "cuda") else torch.device("cpu")
        if given is None:
            args_b, args_o = build_inputs(spec, inputs, device), build_inputs(spec, inputs, device)
        else:
            args_b, args_o = given
        state = " (destroyed)" if handle.destroyed else ""
        text = f"execute(<handle of {handle.method!r}>{state}, {inputs!r}, {outputs!r})"
        # Where outputs go this call, and what they are: the oracle's answer without outputs=.
        first = call(self.oracle.execute, handle.oracle, build_inputs(spec, inputs, device))
        if not first.ok:  # broken inputs: no outputs=, so that the call breaks one argument only
            outputs = OutputsPlan()
        given_b = build_outputs(outputs, first, self.target)
        given_o = build_outputs(outputs, first, self.target)
        before_in = snapshot(flat_tensors(args_b))
        before_out = snapshot(flat_tensors(given_b))
        kw_b = {} if given_b is None else {"outputs": given_b}
        kw_o = {} if given_o is None else {"outputs": given_o}
        want = call(self.oracle.execute, handle.oracle, args_o, **kw_o)
        with busy_caller_stream(self.device, inputs.seed):  # CUDA: a busy, sometimes non-default stream
            got = call(self.backend.execute, handle.backend, args_b, **kw_b)
            seen = read_at_once(got.value) if got.ok else []
        _sync()
        full = f"{text} with inputs {describe_args(flat_tensors(args_b))}"
        if got.ok:
            check_read_at_once(full, seen, got.value)
        if not (got.ok and want.ok):
            handle.countable = False  # a failed execute: its counters are the backend's business
        judge("execute", full, got, want)
        if not unchanged(before_in, flat_tensors(args_b)):
            fail(
                INPUTS_UNTOUCHED,
                full,
                "the caller's inputs changed; execute never writes them",
            )
        if not got.ok:
            if not unchanged(before_out, flat_tensors(given_b)):
                fail(
                    OUTPUTS_UNTOUCHED,
                    full,
                    "a rejected execute wrote the caller's outputs; on any error outputs stay untouched",
                )
            return
        check_held(self.held, full)
        if not want.ok:
            return
        check_execute_results(full, spec, args_b, got.value, want.value, given_b)
        if given_b is None:
            self.held = [*self.held[-3:], Held.of(full, got.value)]
        host_strided = any(
            t.device.type == "cpu" and (t.layout != torch.strided or not t.is_contiguous())
            for t in flat_tensors(args_b)
        )
        handle.countable = not host_strided
        if handle.countable:
            self._compare_stats(handle, f"execute_stats after {full}")

    def _compare_stats(self, handle: HandlePair, text: str) -> None:
        """``execute_stats`` of ``handle`` on both sides: the same outcome, the same structure, and the same
        counts where they are comparable (``handle.countable``)."""
        stats_o = call(self.oracle.execute_stats, handle.oracle)
        stats_b = call(self.backend.execute_stats, handle.backend)
        judge("execute_stats", text, stats_b, stats_o)
        if not (stats_b.ok and stats_o.ok):
            return
        check_structure(text, stats_b.value, stats_o.value)
        if handle.countable is not False and dict(stats_b.value) != dict(stats_o.value):
            fail(
                COUNTERS,
                text,
                f"{dict(stats_b.value)}; for the same calls the oracle counts {dict(stats_o.value)}",
            )

    # -- focused calls (driven by the chapter's generated cases, not by the machine's rules) -----------

    @journaled
    def open_every_method(self) -> None:
        """A program of every menu model both sides lower, and a handle of each of its methods."""
        for model in sorted(self.lowerable):
            self.lower(LowerPlan(model))
        for index, program in enumerate(self.programs):
            for which in range(len(program.plan.method_names())):
                self.init(index, which, "exact", CorruptPlan())

    @journaled
    def execute_call(self, index: int, named: bool, inputs: InputsPlan, outputs: OutputsPlan) -> None:
        """One execute on live handle ``index`` (see :meth:`open_every_method`), the skip-copy option first
        naming its method or not (``named``; it takes effect on this execute), judged like the machine's."""
        handle = self._handle(index)
        if self.has_options:
            value = handle.method if named else ""
            if self._runtime_option(self.oracle) != value:
                compare_option_call(self.backend, self.oracle, SKIP_COPY_OPTION, value)
        self._execute(handle, inputs, outputs)

    @journaled
    def lower_under_option(
        self, option: object, option_first: bool, plan: LowerPlan, which: int, name: str
    ) -> None:
        """``set_option`` of the skip-copy option (judged) before or after ``lower(plan)``, then ``init`` of
        one of its methods by ``name`` (a :class:`NameVariant` kind) and one execute: a placement is checked
        against the option at ``lower`` *and* at ``init``, whichever came first. Leaves no handle behind."""
        try:
            if self.has_options and option_first:
                compare_option_call(self.backend, self.oracle, SKIP_COPY_OPTION, option)
            self.lower(plan)
            if self.has_options and not option_first:
                compare_option_call(self.backend, self.oracle, SKIP_COPY_OPTION, option)
            if self.programs:
                self.init(0, which, name, CorruptPlan())
                if self.live:
                    self._execute(self.live[0], InputsPlan(seed=which), OutputsPlan())
        finally:  # also after a failure: its replay (and the shrinking) must start from the same state
            self.teardown()

    # -- threads -------------------------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), seeds=st.lists(st.integers(0, 2**16), min_size=2, max_size=4, unique=True))
    @journaled
    def execute_in_threads(self, index: int, seeds: list[int]) -> None:
        """Several threads execute one handle at once, each on inputs of its own: each gets its own result."""
        handle = self._handle(index)
        if handle.destroyed:
            return
        spec = method_spec(handle.program.plan.model, handle.zoo_method)
        plans = [InputsPlan(seed=s) for s in seeds]
        device = torch.device("cpu")
        if not all(call(self.oracle.execute, handle.oracle, build_inputs(spec, p, device)).ok for p in plans):
            return  # the oracle refuses these (e.g. a method that takes device inputs): nothing to compare
        results: dict[int, CallResult] = {}
        inputs = {i: build_inputs(spec, p, device) for i, p in enumerate(plans)}
        # The inputs as given (values for the eager reference, bits for the untouched check).
        before = {i: [t.clone() for t in flat_tensors(args)] for i, args in inputs.items()}
        barrier = threading.Barrier(len(plans))

        def worker(i: int) -> None:
            barrier.wait()
            results[i] = call(self.backend.execute, handle.backend, inputs[i])
            _sync()

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show every run
        try:
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(plans))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
        texts = [
            f"execute(<handle of {handle.method!r}>, {p!r}) in thread {i} of {len(plans)}"
            for i, p in enumerate(plans)
        ]
        check_thread_results(spec, texts, inputs, before, results)

    # -- end of an example ---------------------------------------------------------------------------

    def teardown(self) -> None:
        """Destroy every live handle, restore the options, and forget programs, handles and held results
        (the focused cases run several rounds on one machine)."""
        for pair in self.live:
            if not pair.destroyed:
                call(self.backend.destroy, pair.backend)
                call(self.oracle.destroy, pair.oracle)
        if self.saved_options is not None:
            call(self.backend.set_option, SKIP_COPY_OPTION, self.saved_options[0])
            call(self.oracle.set_option, SKIP_COPY_OPTION, self.saved_options[1])
        self.programs.clear()
        self.live.clear()
        self.held.clear()


def machine_for(
    backend: Any,
    oracle: Any,
    device: str,
    *,
    shard: int = 0,
    run_seed: object = None,
    journal: CallJournal | None = None,
    lowerable: Iterable[str] | None = None,
) -> type[ProtocolMachine]:
    """The machine class for one backend, oracle and target ("cpu" or "cuda"), as shard ``shard`` of a run
    seeded ``run_seed`` (``--hypothesis-seed``, if any): see :func:`as_shard`. With a ``journal``, every
    step and every backend call is noted there first (a replay passes the ``lowerable`` models the case
    found, so that it does not lower every model again)."""
    keys = tuple(
        k for k in (SKIP_H2D, SKIP_D2H) if k in lower_options(backend) and k in lower_options(oracle)
    )
    has_options = not missing_attributes(backend, "runtime_options") and not missing_attributes(
        oracle, "runtime_options"
    )
    name = f"ProtocolMachine_{device}"
    machine = type(
        name,
        (ProtocolMachine,),
        {
            "backend": backend,
            "oracle": oracle,
            "device": device,
            "has_options": has_options,
            "placement_keys": keys,
            "lowered": {},
            "lowerable": frozenset(),
        },
    )
    if journal is not None:
        machine.backend, machine.oracle = watched(journal, backend, oracle)
        machine.journal = journal
    if lowerable is not None:
        machine.lowerable = frozenset(lowerable)
        return as_shard(machine, shard, run_seed)
    # Each model lowered once, plainly, before any example: what the backend can lower at all (a model it
    # cannot is a coverage gap, not this chapter's finding), and a baseline that a later refusal of the
    # same model (a failure that stuck) is judged against.
    # Only a clean refusal is a gap: the protocol's ValueError naming what the backend lacks. A crash of
    # any other kind on a model the oracle lowers is this chapter's finding (conformance/common/oracle.py).
    probe = machine()
    found = set()
    for model in MENU:
        want = probe._lower("oracle", machine.oracle, LowerPlan(model))
        got = probe._lower("backend", machine.backend, LowerPlan(model))
        if got.ok and want.ok:
            found.add(model)
        elif want.ok and got.kind != "invalid-argument":
            fail(
                ERROR_CLASS,
                f"lower({{'forward': <{model}>}}, device={device!r})",
                f"{got.describe()}; a backend that cannot lower a model raises ValueError naming what it "
                "lacks (the oracle lowers it)",
            )
    machine.lowerable = frozenset(found)
    if journal is not None:
        journal.state.machine["lowerable"] = sorted(found)
    return as_shard(machine, shard, run_seed)


def as_shard(machine: M, shard: int, run_seed: object = None) -> M:
    """``machine`` drawing the examples of shard ``shard``: shard 0 is ``machine`` itself (it draws as an
    unsharded machine); shard k > 0 a subclass named ``<name>_shard<k+1>``, because Hypothesis derives a
    derandomized run's examples from the machine's name, and in a run with a seed (which every shard
    would otherwise share) seeded ``<seed>:shard<k+1>``."""
    if not shard:
        return machine
    sharded = type(f"{machine.__name__}_shard{shard + 1}", (machine,), {})
    return seed(f"{run_seed}:shard{shard + 1}")(sharded) if run_seed is not None else sharded
