"""What a caller does to the differential machine's backends besides the plain calls
(``conformance/common/protocol_machine.py``): it reads a handle's counters later, refills its own input
buffers and calls again, writes over the results it holds, and passes arguments left out, ``None``, of another
Python type or past a string's limit (``conformance/common/contract_surface.py``). Each is a rule of the
machine, mixed in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from conformance.common.crash_journal import journaled
from conformance.common.oracle import call, judge
from conformance.common.protocol_checks import check_structure, compare_read_back, flat_tensors, snapshot
from conformance.common.protocol_inputs import build_inputs, method_spec
from conformance.common.protocol_plans import SKIP_COPY_OPTION, InputsPlan, OddArgument, OutputsPlan
from conformance.common.protocol_strategies import odd_arguments

if TYPE_CHECKING:
    from conformance.common.protocol_checks import Held
    from conformance.common.protocol_machine import HandlePair

__all__ = ["CallerSteps"]


class CallerSteps:
    """The caller's steps; :class:`conformance.common.protocol_machine.ProtocolMachine` provides the rest."""

    backend: Any
    oracle: Any
    device: str
    has_options: bool
    live: list[HandlePair]
    held: list[Held]
    target: torch.device

    if TYPE_CHECKING:

        def _handle(self, index: int) -> HandlePair: ...
        def _execute(
            self, handle: HandlePair, inputs: InputsPlan, outputs: OutputsPlan, given: Any = None
        ) -> None: ...
        def _compare_stats(self, handle: HandlePair, text: str) -> None: ...

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7))
    @journaled
    def read_stats(self, index: int) -> None:
        """``execute_stats`` of any handle at any time (other handles' calls in between): the counters are
        the handle's own last execute, whatever ran since."""
        handle = self._handle(index)
        state = " (destroyed)" if handle.destroyed else ""
        self._compare_stats(handle, f"execute_stats(<handle of {handle.method!r}>{state}) later")

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), seed=st.integers(0, 2**16), on_device=st.booleans())
    @journaled
    def execute_refilled(self, index: int, seed: int, on_device: bool) -> None:
        """Execute, then the caller refills the very same input tensors in place with other values and
        executes again: the second call sees the new values (nothing keyed on the tensors' identity or
        address, nothing read from them after the first call returned)."""
        handle = self._handle(index)
        spec = method_spec(handle.program.plan.model, handle.zoo_method)
        first, second = (
            InputsPlan(seed=seed, on_device=on_device),
            InputsPlan(seed=seed + 1, on_device=on_device),
        )
        device = self.target if (on_device and self.device == "cuda") else torch.device("cpu")
        given = (build_inputs(spec, first, device), build_inputs(spec, first, device))
        self._execute(handle, first, OutputsPlan(), given)
        refill = flat_tensors(build_inputs(spec, second, device))
        for args in given:
            for old, new in zip(flat_tensors(args), refill, strict=True):
                old.copy_(new)
        self._execute(handle, second, OutputsPlan(), given)

    @precondition(lambda self: self.held)
    @rule(poison=st.sampled_from((float("nan"), -7.0, 0.0)))
    @journaled
    def scribble_on_results(self, poison: float) -> None:
        """The caller writes over every result it holds (they are its own): later calls are unaffected."""
        with torch.no_grad():
            for held in self.held:
                for t in held.tensors:
                    t.fill_(poison if t.is_floating_point() else int(poison) if poison == poison else 7)
                held.before = snapshot(held.tensors)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 7), odd=st.deferred(lambda: odd_arguments()))
    @journaled
    def odd_call(self, index: int, odd: OddArgument) -> None:
        """A protocol call with one argument left out, ``None``, of another Python type, or a string past its
        limit (``conformance/common/contract_surface.py``), on both sides: the same verdict, then the same
        state."""
        self.call_with(self._handle(index), odd)

    def call_with(self, handle: HandlePair, odd: OddArgument) -> None:
        """``odd.method`` on ``handle`` (or its program) with ``odd``'s argument, judged; a handle that both
        sides made is kept, and the handle's counters and the option are compared after."""
        if odd.method in ("set_option", "get_option") and not self.has_options:
            return
        if odd.method == "execute" and handle.destroyed:
            return
        program = handle.program

        def valid(h: object, program_bytes: bytes) -> list[object]:
            """The call's right arguments on one side (a handle's, a program's, the known option)."""
            if odd.method == "init":
                return [program_bytes, handle.method]
            if odd.method == "execute":
                spec = method_spec(program.plan.model, handle.zoo_method)
                return [h, build_inputs(spec, InputsPlan(), torch.device("cpu"))]
            if odd.method == "set_option":
                return [SKIP_COPY_OPTION, ""]
            if odd.method == "get_option":
                return [SKIP_COPY_OPTION]
            return [h]

        # The oracle first: a journal notes its answer.
        want = call(getattr(self.oracle, odd.method), *odd.arguments(valid(handle.oracle, program.oracle)))
        got = call(getattr(self.backend, odd.method), *odd.arguments(valid(handle.backend, program.backend)))
        text = f"{odd.method}({odd!r}) on <handle of {handle.method!r}>"
        if odd.method == "init" and got.ok != want.ok:  # a handle only one side made: released first
            made, who = (got, self.backend) if got.ok else (want, self.oracle)
            call(who.destroy, made.value)
        if odd.method == "destroy" and got.ok and want.ok:
            handle.destroyed = True
        judge(odd.method, text, got, want)
        if got.ok and want.ok:
            if odd.method == "init":
                names = program.plan.method_names()
                if odd.value() in names:
                    zoo = program.plan.zoo_methods()[names.index(odd.value())]
                    self.live.append(HandlePair(program, str(odd.value()), zoo, got.value, want.value))
                else:
                    call(self.backend.destroy, got.value)
                    call(self.oracle.destroy, want.value)
            elif odd.method != "execute":
                check_structure(text, got.value, want.value)
        if not handle.destroyed:
            self._compare_stats(handle, f"execute_stats(<handle of {handle.method!r}>) after {text}")
        if self.has_options:
            compare_read_back(self.backend, self.oracle, f"get_option after {text}", SKIP_COPY_OPTION)
