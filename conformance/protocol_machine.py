"""A Hypothesis state machine that drives the runtime protocol with generated calls, side by side on the
backend under test and on the oracle (``conformance/oracle.py``).

Each step is one protocol call — ``lower`` (with placement options, renamed methods), ``init`` (with method
names a caller gets wrong, corrupted programs), ``set_option`` / ``get_option``, ``execute`` (inputs of
every layout and size, valid or broken one way, with and without ``outputs=``), ``execute_stats``,
``destroy``, and executes from several threads at once — made on both backends with the same arguments.
The oracle decides whether the call is an error; the backend's values are judged against float64 eager; the
spec decides what else the call may change (the caller's inputs never; provided outputs only on success).

Steps draw *plans* (:class:`LowerPlan`, :class:`InputsPlan`, …): small frozen dataclasses whose ``repr`` is
the code that makes them, so a shrunk failure prints as a runnable sequence of calls.
"""

from __future__ import annotations

import copy
import inspect
import sys
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.checks import assert_model_output_close, bits, fail
from conformance.models import get_model
from conformance.models.opaque import CallsOpaqueOp, opaque_inputs
from conformance.oracle import Outcome, call, describe_args, judge
from conformance.protocol import SKIP_D2H, SKIP_H2D, lower_options, missing_attributes
from conformance.rules import rule_id
from conformance.strategies import (
    LAYOUTS,
    NAME_SETS,
    NAME_VARIANTS,
    NameVariant,
    TensorRecipe,
    dtype_name,
    lower_name_sets,
    option_keys,
    option_values,
    placement_values,
)

__all__ = [
    "EXECUTE_FOCUSES",
    "MENU",
    "PLACEMENT_FOCUSES",
    "CorruptPlan",
    "HandlePair",
    "InputsPlan",
    "LowerPlan",
    "OutputsPlan",
    "ProgramPair",
    "build_inputs",
    "machine_for",
    "method_spec",
]

SKIP_COPY_OPTION = "skip_copy_output_to_cpu_for_method"
#: The zoo models the machine lowers (float32: every one is pre-lowered for both targets), plus a method
#: that no backend can lower (an op with no kernel) for failing lowers in the middle of a sequence.
MENU: tuple[str, ...] = ("add_mul", "asr", "llm")
OPAQUE = "opaque"
DTYPE = torch.float32

# The rules this module checks (conformance/catalogue/rule_table.py).
OPTION_READ_BACK = rule_id("differential/option-read-back")
PROGRAM = rule_id("differential/program")
INPUTS_UNTOUCHED = rule_id("differential/inputs-untouched")
VALUES = rule_id("differential/values")
OUTPUT_DEVICE = rule_id("differential/output-device")
OUTPUTS_UNTOUCHED = rule_id("differential/outputs-untouched")
COUNTERS = rule_id("differential/counters")
OUTPUTS_OWNED = rule_id("differential/outputs-owned")
OUTPUTS_FILLED = rule_id("differential/outputs-filled")
THREADS = rule_id("differential/threads")
ERROR_CLASS = rule_id("differential/error-class")

#: Every method name the menu's models use: what option values are written from.
MENU_METHODS: tuple[str, ...] = ("forward", "encoder", "decoder", "prefill", "decode")


# ================================================================================================== plans


@dataclass(frozen=True)
class LowerPlan:
    """``lower`` of zoo model ``model`` (float32), its methods renamed to ``names`` (None: the model's own),
    with ``options`` (sorted ``(key, value)`` pairs)."""

    model: str
    names: tuple[str, ...] | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def zoo_methods(self) -> tuple[str, ...]:
        return ("forward",) if self.model == OPAQUE else get_model(self.model).methods

    def method_names(self) -> tuple[str, ...]:
        return self.names if self.names is not None else self.zoo_methods()


@dataclass(frozen=True)
class CorruptPlan:
    """How ``init`` gets its program: ``intact``, or ``truncated`` / ``flipped`` (one byte at fraction
    ``at``), ``trailing`` (junk appended), ``empty``, ``not-bytes`` (a str)."""

    kind: str = "intact"
    at: float = 0.5

    def apply(self, program: bytes) -> object:
        if self.kind == "intact":
            return program
        if self.kind == "truncated":
            return program[: int(len(program) * self.at)]
        if self.kind == "flipped":
            index = min(len(program) - 1, int(len(program) * self.at))
            return program[:index] + bytes([program[index] ^ 0x5A]) + program[index + 1 :]
        if self.kind == "trailing":
            return program + b"\x00trailing bytes"
        if self.kind == "empty":
            return b""
        return "not a program"


#: Ways an ``inputs`` argument is broken (``none``: it is not).
BAD_INPUTS: tuple[str, ...] = (
    "fewer", "more", "none-element", "int-element", "bare-tensor", "none-inputs", "wrong-dtype",
    "wrong-rank", "wrong-size", "empty-size", "size-below", "size-above",
)  # fmt: skip
#: Sizes for a method's dynamic dimensions (``Dim(min, max)``): inside the range, and just past it.
SIZES: tuple[str, ...] = ("example", "min", "max", "mid")


@dataclass(frozen=True)
class InputsPlan:
    """The ``inputs`` of one execute, for whatever method it goes to: values from ``seed``; input ``i`` in
    ``layouts[i % len(layouts)]``; dynamic sizes at ``size``; broken as ``bad`` (at input ``bad_index``);
    ``on_device``: already on the handle's CUDA device (a CUDA target), else host tensors."""

    seed: int = 0
    layouts: tuple[str, ...] = ("contiguous",)
    size: str = "example"
    bad: str = "none"
    bad_index: int = 0
    on_device: bool = False


#: Ways an ``outputs=`` argument is given: not at all, right, or broken one way.
OUTPUT_KINDS: tuple[str, ...] = (
    "none", "provided", "one-more", "one-fewer", "wrong-dtype", "wrong-shape", "non-tensor", "bare-tensor",
    "other-device",
)  # fmt: skip


@dataclass(frozen=True)
class OutputsPlan:
    kind: str = "none"


# ========================================================================================= method specs


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    low: int
    high: int
    dynamic: tuple[tuple[int, int, int], ...] = ()  # (axis, min, max)


@dataclass
class MethodSpec:
    """One zoo method: its eager module (float32, CPU), example inputs and what its inputs may be."""

    module: torch.nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: tuple[InputSpec, ...]
    float64: torch.nn.Module = field(repr=False, default=None)  # type: ignore[assignment]


_SPECS: dict[tuple[str, str], MethodSpec] = {}


def method_spec(model: str, method: str) -> MethodSpec:
    """The spec of ``model``'s ``method`` (built once per process)."""
    key = (model, method)
    if key not in _SPECS:
        entry = get_model(model)
        module, example = entry.build(DTYPE, torch.device("cpu"))[method]
        dynamic = _dynamic_axes(module, entry.dynamic_shapes_for(method))
        specs = []
        for index, tensor in enumerate(example):
            low, high = 0, 8
            if not tensor.is_floating_point():
                low, high = int(tensor.min()), int(tensor.max()) + 1
            axes = tuple((axis, lo, hi) for (i, axis, lo, hi) in dynamic if i == index)
            specs.append(InputSpec(tuple(tensor.shape), tensor.dtype, low, high, axes))
        float64 = copy.deepcopy(module).to(dtype=torch.float64)
        _SPECS[key] = MethodSpec(module, tuple(example), tuple(specs), float64)
    return _SPECS[key]


def _dynamic_axes(module: torch.nn.Module, shapes: Any) -> list[tuple[int, int, int, int]]:
    """``(input index, axis, min, max)`` of every ``Dim`` in a method's ``dynamic_shapes``."""
    if not shapes:
        return []
    names = list(inspect.signature(module.forward).parameters)
    found = []
    for name, axes in shapes.items() if isinstance(shapes, dict) else enumerate(shapes):
        index = names.index(name) if isinstance(name, str) else int(name)
        for axis, dim in (axes or {}).items():
            found.append((index, int(axis), int(dim.min), int(dim.max)))
    return found


def eager_float64(spec: MethodSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    args = [t.detach().cpu().double() if t.is_floating_point() else t.detach().cpu() for t in inputs]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        out = spec.float64(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _size_for(spec: InputSpec, choice: str) -> tuple[int, ...]:
    shape = list(spec.shape)
    for axis, low, high in spec.dynamic:
        # Below a bound of 2: 0, not 1 (export cannot declare a bound of 1; a size-1 step is the reference's
        # waiver, and a backend that holds the declared bound is not wrong).
        below = 0 if low == 2 else low - 1
        shape[axis] = {
            "min": low,
            "max": high,
            "mid": (low + high) // 2,
            "below": below,
            "above": high + 1,
        }.get(choice, shape[axis])
    return tuple(shape)


def build_inputs(spec: MethodSpec, plan: InputsPlan, device: torch.device) -> object:
    """The ``inputs`` argument ``plan`` describes, for a method of ``spec``, on ``device``."""
    size = {"size-below": "below", "size-above": "above"}.get(plan.bad, plan.size)
    if not any(s.dynamic for s in spec.inputs) and plan.bad in ("size-below", "size-above"):
        size = "example"
    recipes = []
    for index, s in enumerate(spec.inputs):
        layout = plan.layouts[index % len(plan.layouts)]
        recipes.append(
            TensorRecipe(_size_for(s, size), dtype_name(s.dtype), layout, plan.seed + index, s.low, s.high)
        )
    tensors: list[Any] = [r.build(device) for r in recipes]
    at = plan.bad_index % max(1, len(tensors))
    bad = plan.bad
    if bad == "fewer":
        return tensors[:-1]
    if bad == "more":
        return [*tensors, tensors[0].clone()]
    if bad == "none-element":
        tensors[at] = None
    elif bad == "int-element":
        tensors[at] = 3
    elif bad == "bare-tensor":
        return tensors[0]
    elif bad == "none-inputs":
        return None
    elif bad == "wrong-dtype":
        t = tensors[at]
        tensors[at] = t.to(torch.float64 if t.dtype != torch.float64 else torch.float32)
        if not t.is_floating_point():
            tensors[at] = t.to(torch.int32)
    elif bad == "wrong-rank":
        tensors[at] = tensors[at].unsqueeze(0)
    elif bad == "wrong-size":
        t = tensors[at]
        tensors[at] = torch.cat([t, t], dim=-1) if t.dim() else t.reshape(1).repeat(2)
    elif bad == "empty-size":
        t = tensors[at]
        tensors[at] = t.narrow(-1, 0, 0) if t.dim() else t
    return tensors


# ============================================================================================ the machine


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


def _flat_tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _snapshot(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [bits(t).clone() for t in tensors]


def _unchanged(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> bool:
    return all(torch.equal(b, bits(a)) for b, a in zip(before, after, strict=True))


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class ProtocolMachine(RuleBasedStateMachine):
    """Subclassed by :func:`machine_for` with the backend, the oracle and the target device."""

    backend: ClassVar[Any]
    oracle: ClassVar[Any]
    device: ClassVar[str]
    has_options: ClassVar[bool]
    placement_keys: ClassVar[tuple[str, ...]]
    #: ``lower`` results by (side, plan), across examples: a warm lower still costs an export.
    lowered: ClassVar[dict[tuple[str, str], Outcome]]
    #: The menu's models both backends lowered before the first example (the others are coverage gaps).
    lowerable: ClassVar[frozenset[str]]

    def __init__(self) -> None:
        super().__init__()
        #: Programs lowered and handles made in this example, in order; rules pick one by index (a list, not
        #: a Hypothesis bundle: every example starts with one of each, so calls on them happen from step 1).
        self.programs: list[ProgramPair] = []
        self.live: list[HandlePair] = []
        #: Results the caller still holds (a few of the latest): no later call may change them.
        self.held: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]] = []
        self.lower_failed = False  # the backend refused a lower: the next one asks it again
        self.saved_options: tuple[object, object] | None = None

    # -- plumbing ------------------------------------------------------------------------------------

    @property
    def target(self) -> torch.device:
        if self.device == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _lower(self, side: str, who: Any, plan: LowerPlan) -> Outcome:
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
    def remember_options(self) -> None:
        if self.has_options:
            self.saved_options = (
                call(self.backend.get_option, SKIP_COPY_OPTION).value,
                call(self.oracle.get_option, SKIP_COPY_OPTION).value,
            )

    @initialize(model=st.sampled_from(MENU), which=st.integers(0, 1))
    def start(self, model: str, which: int) -> None:
        """Every example starts with a program of a menu model and a handle of one of its methods."""
        if model not in self.lowerable:
            return
        self.lower(LowerPlan(model))
        if self.programs:
            self.init(0, which, "exact", CorruptPlan())

    @rule(plan=st.deferred(lambda: lower_plans()))
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
    def init(self, index: int, which: int, name: str, corrupt: CorruptPlan) -> None:
        program = self.programs[index % len(self.programs)]
        names = program.plan.method_names()
        real = names[which % len(names)]
        # One broken argument per call: a corrupt program goes with the right name.
        method = NameVariant(real, name if corrupt.kind == "intact" else "exact").apply()
        if isinstance(method, str) and method in names:  # a variant that names another method ("Step")
            real = method
        text = f"init(<program of {program.plan!r}> {corrupt!r}, {method!r})"
        got = call(self.backend.init, corrupt.apply(program.backend), method)
        want = call(self.oracle.init, corrupt.apply(program.oracle), method)
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
    def destroy(self, index: int) -> None:
        """Destroy a handle (again, if the index picks a destroyed one); its stats are then an error."""
        handle = self._handle(index)
        text = f"destroy(<handle of {handle.method!r}>{' (destroyed)' if handle.destroyed else ''})"
        got = call(self.backend.destroy, handle.backend)
        want = call(self.oracle.destroy, handle.oracle)
        handle.destroyed = True
        judge("destroy", text, got, want)
        judge(
            "execute_stats",
            f"execute_stats(<destroyed handle of {handle.method!r}>)",
            call(self.backend.execute_stats, handle.backend),
            call(self.oracle.execute_stats, handle.oracle),
        )

    # -- options -------------------------------------------------------------------------------------

    @precondition(lambda self: self.has_options)
    @rule(key_value=st.deferred(lambda: option_calls()))
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
    def execute(self, index: int, broken: tuple[InputsPlan, OutputsPlan]) -> None:
        """An execute that breaks one argument (``inputs``, or ``outputs=``): the oracle says how it fails."""
        self._execute(self._handle(index), *broken)

    @precondition(lambda self: self.live)
    @rule(
        index=st.integers(0, 7),
        inputs=st.deferred(lambda: valid_inputs_plans()),
        provided=st.booleans(),
    )
    def execute_valid(self, index: int, inputs: InputsPlan, provided: bool) -> None:
        """An execute the spec allows (any layout and size in range), with or without ``outputs=``: the
        calls a backend must get right, drawn as often as all the broken ones together."""
        self._execute(self._handle(index), inputs, OutputsPlan("provided" if provided else "none"))

    def _execute(self, handle: HandlePair, inputs: InputsPlan, outputs: OutputsPlan) -> None:
        spec = method_spec(handle.program.plan.model, handle.zoo_method)
        device = self.target if (inputs.on_device and self.device == "cuda") else torch.device("cpu")
        args_b = build_inputs(spec, inputs, device)
        args_o = build_inputs(spec, inputs, device)
        state = " (destroyed)" if handle.destroyed else ""
        text = f"execute(<handle of {handle.method!r}>{state}, {inputs!r}, {outputs!r})"
        # Where outputs go this call, and what they are: the oracle's answer without outputs=.
        first = call(self.oracle.execute, handle.oracle, build_inputs(spec, inputs, device))
        if not first.ok:  # broken inputs: no outputs=, so that the call breaks one argument only
            outputs = OutputsPlan()
        given_b = self._outputs(outputs, first, spec)
        given_o = self._outputs(outputs, first, spec)
        before_in = _snapshot(_flat_tensors(args_b))
        before_out = _snapshot(_flat_tensors(given_b))
        kw_b = {} if given_b is None else {"outputs": given_b}
        kw_o = {} if given_o is None else {"outputs": given_o}
        got = call(self.backend.execute, handle.backend, args_b, **kw_b)
        want = call(self.oracle.execute, handle.oracle, args_o, **kw_o)
        _sync()
        full = f"{text} with inputs {describe_args(_flat_tensors(args_b))}"
        judge("execute", full, got, want)
        if not _unchanged(before_in, _flat_tensors(args_b)):
            fail(
                INPUTS_UNTOUCHED,
                full,
                "the caller's inputs changed; execute never writes them",
            )
        if not got.ok:
            if not _unchanged(before_out, _flat_tensors(given_b)):
                fail(
                    OUTPUTS_UNTOUCHED,
                    full,
                    "a rejected execute wrote the caller's outputs; on any error outputs stay untouched",
                )
            return
        self._check_held(full)
        if not want.ok:
            return
        self._check_results(full, spec, args_b, got.value, want.value, given_b)
        if given_b is None:
            returned = _flat_tensors(got.value)
            self.held = [*self.held[-3:], (full, returned, _snapshot(returned))]
        host_strided = any(t.device.type == "cpu" and not t.is_contiguous() for t in _flat_tensors(args_b))
        if not host_strided:
            stats_b = call(self.backend.execute_stats, handle.backend)
            stats_o = call(self.oracle.execute_stats, handle.oracle)
            judge("execute_stats", f"execute_stats after {full}", stats_b, stats_o)
            if stats_b.ok and stats_o.ok and dict(stats_b.value) != dict(stats_o.value):
                fail(
                    COUNTERS,
                    f"execute_stats after {full}",
                    f"{dict(stats_b.value)}; for the same execute the oracle counts {dict(stats_o.value)}",
                )

    def _check_held(self, text: str) -> None:
        for earlier, tensors, before in self.held:
            if not _unchanged(before, tensors):
                fail(
                    OUTPUTS_OWNED,
                    text,
                    f"changed the outputs an earlier call returned ({earlier}); returned tensors belong to "
                    "the caller and no later call may write them",
                )

    def _outputs(self, plan: OutputsPlan, first: Outcome, spec: MethodSpec) -> object:
        if plan.kind == "none":
            return None
        outs = [t for t in first.value] if first.ok else [torch.empty(0)]
        where = [t.device for t in outs]
        made: list[Any] = [
            torch.full(t.shape, 1.5, dtype=t.dtype, device=d)
            if t.dtype.is_floating_point
            else torch.full(t.shape, 7, dtype=t.dtype, device=d)
            for t, d in zip(outs, where, strict=True)
        ]
        kind = plan.kind
        if kind == "one-more":
            made.append(made[0].clone())
        elif kind == "one-fewer":
            made = made[:-1]
        elif kind == "wrong-dtype":
            made[0] = made[0].to(torch.float64 if made[0].dtype != torch.float64 else torch.float32)
        elif kind == "wrong-shape":
            made[0] = torch.cat([made[0], made[0]]) if made[0].dim() else made[0].reshape(1)
        elif kind == "non-tensor":
            made[0] = 1.5
        elif kind == "bare-tensor":
            return made[0]
        elif kind == "other-device" and torch.cuda.is_available():
            other = "cpu" if made[0].is_cuda else self.target
            made[0] = made[0].to(other)
        return made

    def _check_results(
        self,
        text: str,
        spec: MethodSpec,
        inputs: object,
        got: object,
        want: object,
        given: object,
    ) -> None:
        results = list(got) if isinstance(got, (list, tuple)) else None  # type: ignore[call-overload]
        if results is None or not all(isinstance(t, torch.Tensor) for t in results):
            fail(VALUES, text, f"must return a list of tensors, got {type(got).__name__}")
        expected = eager_float64(spec, _flat_tensors(inputs))
        if len(results) != len(expected):
            fail(VALUES, text, f"returned {len(results)} outputs; eager returns {len(expected)}")
        for index, (out, ref) in enumerate(zip(results, expected, strict=True)):
            assert_model_output_close(VALUES, f"{text}: output {index}", out, _as(ref, out))
        devices = [t.device.type for t in results]
        oracle_devices = [t.device.type for t in want]  # type: ignore[attr-defined]
        if devices != oracle_devices:
            fail(
                OUTPUT_DEVICE,
                text,
                f"outputs on {devices}; the oracle puts them on {oracle_devices} (placement and options)",
            )
        if given is not None:
            for index, (dst, ref) in enumerate(zip(_flat_tensors(given), expected, strict=False)):
                assert_model_output_close(
                    OUTPUTS_FILLED,
                    f"{text}: provided outputs[{index}] after the call",
                    dst,
                    _as(ref, dst),
                )

    # -- focused calls (driven by the chapter's generated cases, not by the machine's rules) -----------

    def open_every_method(self) -> None:
        """A program of every menu model both sides lower, and a handle of each of its methods."""
        for model in sorted(self.lowerable):
            self.lower(LowerPlan(model))
        for index, program in enumerate(self.programs):
            for which in range(len(program.plan.method_names())):
                self.init(index, which, "exact", CorruptPlan())

    def execute_call(self, index: int, named: bool, inputs: InputsPlan, outputs: OutputsPlan) -> None:
        """One execute on live handle ``index`` (see :meth:`open_every_method`), the skip-copy option first
        naming its method or not (``named``; it takes effect on this execute), judged like the machine's."""
        handle = self._handle(index)
        if self.has_options:
            value = handle.method if named else ""
            if self._runtime_option(self.oracle) != value:
                compare_option_call(self.backend, self.oracle, SKIP_COPY_OPTION, value)
        self._execute(handle, inputs, outputs)

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
        results: dict[int, Outcome] = {}
        inputs = {i: build_inputs(spec, p, device) for i, p in enumerate(plans)}
        # The inputs as given (values for the eager reference, bits for the untouched check).
        before = {i: [t.clone() for t in _flat_tensors(args)] for i, args in inputs.items()}
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
        # What a racing call did wrong is named by the rule it breaks: its inputs written, results that
        # share memory with another thread's, and only then values or errors that differ from a lone call.
        texts = [
            f"execute(<handle of {handle.method!r}>, {p!r}) in thread {i} of {len(plans)}"
            for i, p in enumerate(plans)
        ]
        for i, text in enumerate(texts):
            if not _unchanged([bits(t) for t in before[i]], _flat_tensors(inputs[i])):
                fail(INPUTS_UNTOUCHED, text, "changed its inputs; execute never writes them")
        storages: dict[int, int] = {}
        for i, text in enumerate(texts):
            outs = _flat_tensors(results[i].value) if results[i].ok else []
            for out in outs:
                other = storages.setdefault(out.untyped_storage().data_ptr(), i)
                if other != i and out.numel():
                    fail(
                        OUTPUTS_OWNED,
                        text,
                        f"returned an output sharing memory with thread {other}'s results; returned tensors "
                        "belong to their caller",
                    )
        for i, text in enumerate(texts):
            outcome = results[i]
            if not outcome.ok:
                fail(THREADS, text, f"a valid execute racing others {outcome.describe()}")
            expected = eager_float64(spec, before[i])
            for index, (out, ref) in enumerate(zip(outcome.value, expected, strict=False)):
                assert_model_output_close(THREADS, f"{text}: output {index}", out, _as(ref, out))

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


def _as(ref: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The float64 reference, as ``assert_model_output_close`` takes it for an output like ``out``."""
    return ref if ref.is_floating_point() else ref.to(out.dtype) if not out.is_floating_point() else ref


# ========================================================================================= strategies


def compare_option_call(backend: Any, oracle: Any, key: object, value: object) -> str:
    """``set_option(key, value)`` on both sides, judged, then the read-back of ``key`` (and of the known
    key, where ``key`` is another): the same outcomes and the same values. Returns the call's text."""
    text = f"set_option({key!r}, {value!r})"
    judge("set_option", text, call(backend.set_option, key, value), call(oracle.set_option, key, value))
    _compare_read_back(backend, oracle, f"get_option({key!r}) after {text}", key)
    if key != SKIP_COPY_OPTION:
        after = f"get_option({SKIP_COPY_OPTION!r}) after {text}"
        _compare_read_back(backend, oracle, after, SKIP_COPY_OPTION)
    return text


def _compare_read_back(backend: Any, oracle: Any, text: str, key: object) -> None:
    """``get_option(key)`` on both sides: the same outcome, and the same value."""
    got = call(backend.get_option, key)
    want = call(oracle.get_option, key)
    judge("get_option", text, got, want)
    if got.ok and want.ok and (type(got.value) is not type(want.value) or got.value != want.value):
        fail(
            OPTION_READ_BACK,
            text,
            f"returned {got.value!r}; after the same calls the oracle returns {want.value!r}",
        )


def option_calls() -> st.SearchStrategy[tuple[object, object]]:
    """``set_option`` arguments breaking at most one: an odd value for the known key, or an odd key with a
    good value."""
    return st.one_of(
        st.tuples(st.just(SKIP_COPY_OPTION), option_values(MENU_METHODS)),
        st.tuples(option_keys((SKIP_COPY_OPTION,)), st.sampled_from(("", "forward", "encoder, decoder"))),
    )


def lower_plans() -> st.SearchStrategy[LowerPlan]:
    """A model of the menu (sometimes the one no backend can lower), its methods sometimes renamed, and
    placement options written every way a caller writes them."""

    @st.composite
    def plans(draw: st.DrawFn) -> LowerPlan:
        model = draw(st.sampled_from((*MENU, *MENU, OPAQUE)))
        zoo = LowerPlan(model).zoo_methods()
        names = draw(st.one_of(st.none(), lower_name_sets(len(zoo))))
        shown = tuple(names if names is not None else zoo)
        options: dict[str, Any] = {}
        for key in (SKIP_H2D, SKIP_D2H):
            if draw(st.integers(0, 2)) == 0:
                options[key] = draw(placement_values(shown))
        return LowerPlan(model, names, tuple(sorted(options.items())))

    return plans()


#: ``init`` name kinds: mostly the exact name, then every way a caller gets it wrong (the Unicode forms and
#: spacing, the slips that pass most easily, twice).
INIT_NAMES = st.sampled_from(
    NAME_VARIANTS[:1] * 6 + NAME_VARIANTS[1:] + ("nfd", "nfkc", "upper", "trailing-space")
)


#: What a round of :func:`placement_rounds` aims at: method names (renamed at ``lower``, misspelt at
#: ``init``), placement values written every way, and a placement against the runtime option set before the
#: ``lower`` or after it (a conflict is an error at ``lower`` and at ``init``).
PLACEMENT_FOCUSES: tuple[str, ...] = ("names", "unicode-names", "values", "option-first", "option-after")
#: The lower name sets with a name that another Unicode normal form writes differently.
UNICODE_NAME_SETS = {
    n: tuple(s for s in sets if any(unicodedata.normalize("NFKD", m) != m for m in s))
    for n, sets in NAME_SETS.items()
}


def placement_rounds(focus: str) -> st.SearchStrategy[tuple[object, bool, LowerPlan, int, str]]:
    """Arguments of :meth:`ProtocolMachine.lower_under_option` for one of :data:`PLACEMENT_FOCUSES`."""

    @st.composite
    def rounds(draw: st.DrawFn) -> tuple[object, bool, LowerPlan, int, str]:
        model = draw(st.sampled_from(MENU))
        zoo = LowerPlan(model).zoo_methods()
        if focus == "unicode-names":  # names whose normal forms differ, asked for in each form
            names: tuple[str, ...] | None = draw(st.sampled_from(UNICODE_NAME_SETS[len(zoo)]))
        elif focus == "names" or draw(st.booleans()):
            names = draw(lower_name_sets(len(zoo)))
        else:
            names = None
        shown = tuple(names if names is not None else zoo)
        known = tuple(n for n in shown if n) or ("forward",)
        if focus in ("names", "unicode-names"):
            options: dict[str, object] = {}
        elif focus == "values":
            options = {k: draw(placement_values(shown)) for k in (SKIP_H2D, SKIP_D2H) if draw(st.booleans())}
        else:  # a valid placement (bools, or mappings of the program's own names), to meet the option
            flags = st.one_of(
                st.booleans(), st.dictionaries(st.sampled_from(known), st.booleans(), max_size=3)
            )
            options = {k: draw(flags) for k in (SKIP_H2D, SKIP_D2H) if draw(st.booleans()) or k == SKIP_D2H}
        plan = LowerPlan(model, names, tuple(sorted(options.items())))
        some = st.one_of(st.sampled_from(known), st.just(", ".join(known)))
        option = draw(some) if focus.startswith("option") else ""
        kinds = {"names": NAME_VARIANTS, "unicode-names": ("nfd", "nfkc")}
        name = draw(st.sampled_from(kinds.get(focus, ("exact",))))
        return option, focus != "option-after", plan, draw(st.integers(0, 1)), name

    return rounds()


#: What a call of :func:`execute_calls` breaks: one way of breaking ``inputs`` or ``outputs=``, or nothing.
EXECUTE_FOCUSES: tuple[str, ...] = (
    *BAD_INPUTS,
    *(f"outputs-{k}" for k in OUTPUT_KINDS if k not in ("none", "provided")),
    "valid",
)


def execute_calls(handles: int, focus: str) -> st.SearchStrategy[tuple[int, bool, InputsPlan, OutputsPlan]]:
    """Arguments of :meth:`ProtocolMachine.execute_call` over ``handles`` live handles for one of
    :data:`EXECUTE_FOCUSES`: the handle, the option naming its method or not, the inputs and outputs."""
    if focus == "valid":
        calls = st.tuples(valid_inputs_plans(), st.sampled_from(("none", "provided")).map(OutputsPlan))
    elif focus.startswith("outputs-"):
        calls = st.tuples(valid_inputs_plans(), st.just(OutputsPlan(focus.removeprefix("outputs-"))))
    else:
        broken = st.builds(
            InputsPlan,
            seed=st.integers(0, 2**16),
            size=st.sampled_from(SIZES),
            bad=st.just(focus),
            bad_index=st.integers(0, 3),
            on_device=st.booleans(),
        )
        calls = st.tuples(broken, st.just(OutputsPlan()))
    return st.tuples(st.sampled_from(range(handles)), st.booleans(), calls).map(lambda c: (c[0], c[1], *c[2]))


def valid_inputs_plans() -> st.SearchStrategy[InputsPlan]:
    return st.builds(
        InputsPlan,
        seed=st.integers(0, 2**16),
        layouts=st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=3).map(tuple),
        size=st.sampled_from(SIZES),
        on_device=st.booleans(),
    )


#: Broken ``inputs``, weighted towards the slips that pass unnoticed most easily: a dtype converted, a
#: dynamic size past its bound, an empty input (a rejected count or ``None`` is hard to miss).
_BAD_WEIGHTED: tuple[str, ...] = (*BAD_INPUTS, "wrong-dtype", "size-above", "size-below", "empty-size")


def broken_calls() -> st.SearchStrategy[tuple[InputsPlan, OutputsPlan]]:
    """An execute that breaks one argument: ``inputs`` (without ``outputs=``), or ``outputs=`` (with valid
    inputs). The valid calls are ``execute_valid``'s."""
    broken_inputs = st.builds(
        InputsPlan,
        seed=st.integers(0, 2**16),
        layouts=st.just(("contiguous",)),
        size=st.sampled_from(SIZES),
        bad=st.sampled_from(_BAD_WEIGHTED),
        bad_index=st.integers(0, 3),
        on_device=st.booleans(),
    )
    broken_outputs = st.sampled_from(tuple(k for k in OUTPUT_KINDS if k not in ("none", "provided")))
    return st.one_of(
        st.tuples(broken_inputs, st.just(OutputsPlan())),
        st.tuples(valid_inputs_plans(), broken_outputs.map(OutputsPlan)),
    )


def machine_for(backend: Any, oracle: Any, device: str) -> type[ProtocolMachine]:
    """The machine class for one backend, oracle and target ("cpu" or "cuda")."""
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
    # Each model lowered once, plainly, before any example: what the backend can lower at all (a model it
    # cannot is a coverage gap, not this chapter's finding), and a baseline that a later refusal of the
    # same model (a failure that stuck) is judged against.
    # Only a clean refusal is a gap: the protocol's ValueError naming what the backend lacks. A crash of
    # any other kind on a model the oracle lowers is this chapter's finding (conformance/oracle.py).
    probe = machine()
    lowerable = set()
    for model in MENU:
        got = probe._lower("backend", backend, LowerPlan(model))
        want = probe._lower("oracle", oracle, LowerPlan(model))
        if got.ok and want.ok:
            lowerable.add(model)
        elif want.ok and got.kind != "invalid-argument":
            fail(
                ERROR_CLASS,
                f"lower({{'forward': <{model}>}}, device={device!r})",
                f"{got.describe()}; a backend that cannot lower a model raises ValueError naming what it "
                "lacks (the oracle lowers it)",
            )
    machine.lowerable = frozenset(lowerable)
    return machine
