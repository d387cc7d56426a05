"""Faulty backends: each wraps the reference and is faulty in one call, the way CUDA backends fail in the
field — a call that never returns, a process that dies, a kernel that stores out of bounds, an allocation
beyond the card. They break no rule: they test that the suite contains the fault, names the case that
caused it with its evidence, and gives every other case the outcome it gets against the reference
(``tests/harness/test_fault_robustness.py``; the CUDA ones on a GPU through ``.ci/gpu/faults.sh``).

Each declares ``fault`` (a ``Fault``): what the run must show. Each faulty call is met by exactly one
case: the CPU ones by a bad-inputs case (an execute with one input more, one fewer, a float64 input), by
the non-ASCII program's lowering (``test_non_ascii_method_names_round_trip[cpu-program]``) or by one
view-pass catalogue graph (``test_view_pass_verdicts[every-view-twin/slice_copy]``); the CUDA ones by the
execute of
method ``解码器`` of that program for CUDA (``...[cuda-program]``). The faulty methods call ``super()``, so
``AllCpuFaults`` has every CPU fault at once, each at its own case: the CPU self-test runs that one.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import Forwarding

PROGRAM_FORMAT = "conformance/program_format/test_program_format.py"
BAD_INPUTS = "conformance/bad_inputs/test_bad_inputs.py"
LOWERING = "conformance/lowering/test_lowering.py"
#: The method whose execute (or lower) is faulty; only the non-ASCII program has it.
TRIGGER = "解码器"


def non_ascii_case(target: str) -> str:
    return f"{PROGRAM_FORMAT}::test_non_ascii_method_names_round_trip[{target}-program]"


def bad_inputs_case(rule: str) -> str:
    return f"{BAD_INPUTS}::test_bad_inputs_are_rejected_and_change_nothing[{rule}-cpu-program]"


@dataclass(frozen=True)
class Fault:
    """What a run of ``chapters`` against the faulty backend must show: each case of ``faulty`` ends in
    its outcome, with its evidence (a substring) in its message or evidence; every other case as against
    the reference. ``cuda``: the fault needs a GPU. ``select``: pytest arguments that keep the CPU
    self-test's run small (the GPU script runs whole chapters)."""

    chapters: tuple[str, ...]
    faulty: Mapping[str, tuple[str, str]]  # case id -> (outcome, evidence)
    cuda: bool = False
    select: tuple[str, ...] = ()


#: The CPU self-test's selection: every CPU faulty case and some healthy neighbours of each.
CPU_SELECTION = (
    "-k",
    "non_ascii or every_method or method_names_match or empty_program "
    "or (view_pass_verdicts and slice) or (bad_inputs_are_rejected and (one-input or wrong-dtype))",
)


class Faulty(Forwarding):
    """Forwards every protocol part to the reference; a subclass makes one call faulty. It declares a
    ``fault``, never ``breaks``: it breaks no rule, so rule coverage does not count it."""

    version = "faulty"
    fault: Fault

    def __init__(self, name: str, fault: Fault) -> None:  # not Forwarding's: no `breaks`
        self.name = name
        self.fault = fault

    # The calls a subclass makes faulty; each subclass calls super() for every other call.
    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> Any:
        return REFERENCE.execute(handle, inputs, outputs)

    def lower(self, methods: Mapping[str, Any], *, device: str, **kwargs: Any) -> bytes:
        return REFERENCE.lower(methods, device=device, **kwargs)

    def view_copy_pass(self, graph_module: Any) -> Any:
        return REFERENCE.view_copy_pass(graph_module)


def _on_cpu(handle: object) -> bool:
    return getattr(getattr(handle, "device", None), "type", None) == "cpu"


def _is_trigger(handle: object) -> bool:
    """The execute of method 解码器 of a CUDA program."""
    device = getattr(handle, "device", None)
    return getattr(handle, "method_name", None) == TRIGGER and getattr(device, "type", None) == "cuda"


def _bad(handle: object, inputs: Any, extra: int = 0, dtype: torch.dtype | None = None) -> bool:
    """An execute of a CPU program with ``extra`` inputs more than its method takes (-1: one fewer), or
    with a ``dtype`` input: one bad-inputs case each."""
    if not _on_cpu(handle) or not isinstance(inputs, (list, tuple)):
        return False
    if dtype is not None:
        return any(isinstance(t, torch.Tensor) and t.dtype == dtype for t in inputs)
    return len(inputs) == getattr(handle, "num_inputs", -10) + extra


# ==================================================================================================== hangs


def deadlock_holding_the_gil() -> None:
    """Block forever in C with the GIL held, as a C extension stuck on a lock (or in a CUDA wait without
    releasing the GIL) does: no Python thread of the process runs again, no signal handler either."""
    mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t is an unlocked default mutex
    ctypes.CDLL(None).pthread_mutex_lock(mutex)
    ctypes.PyDLL(None).pthread_mutex_lock(mutex)  # PyDLL keeps the GIL during the call


class HangsInExecute(Faulty):
    """An execute with one input too many (of a CPU program) never returns, stuck in C holding the GIL:
    a deadlocked stream wait instead of the invalid-argument error."""

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> Any:
        if _bad(handle, inputs, extra=1):
            deadlock_holding_the_gil()
        return super().execute(handle, inputs, outputs)


class HangsInLower(Faulty):
    """Lowering a program with method ``解码器`` for the CPU waits on a lock it already holds."""

    def lower(self, methods: Mapping[str, Any], *, device: str, **kwargs: Any) -> bytes:
        if TRIGGER in methods and device == "cpu":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # never returns
        return super().lower(methods, device=device, **kwargs)


class HangsInViewPass(Faulty):
    """The view pass waits forever on the catalogue's ``every-view-twin/slice_copy`` graph (its copy node
    ``c`` a ``slice_copy``): built by hand, no export, so the case reaches the pass at once."""

    def view_copy_pass(self, graph_module: Any) -> Any:
        if any(node.name == "c" and "slice_copy" in str(node.target) for node in graph_module.graph.nodes):
            threading.Event().wait()
        return super().view_copy_pass(graph_module)


# ============================================================================================ process death


class DiesInExecute(Faulty):
    """An execute with one input too few (of a CPU program) aborts the process (a failed assertion in the
    backend's C++) instead of raising the invalid-argument error."""

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> Any:
        if _bad(handle, inputs, extra=-1):
            os.abort()
        return super().execute(handle, inputs, outputs)


# =============================================================================== a device fault, simulated

_POISONED: list[str] = []
SIMULATED_ERROR = "CUDA error: an illegal memory access was encountered (simulated sticky error)"


def simulated_probe() -> str | None:
    """The device probe for ``PoisonsItsProcess`` (``--device-probe tests.broken.fault:
    simulated_probe``): the poisoned process's error, like a sticky CUDA error."""
    return f"AcceleratorError: {_POISONED[0]}" if _POISONED else None


class PoisonsItsProcess(Faulty):
    """A sticky device error without a GPU: an execute with a float64 input (of a CPU program) poisons
    its process, and from then on every call into the backend in that process fails, as every CUDA call
    fails after an illegal address. Without containment every later case on that worker fails with it."""

    def __getattr__(self, attr: str) -> Any:
        value = getattr(REFERENCE, attr)
        if not callable(value) or attr in ("name", "version"):
            return value

        def poisoned(*args: Any, **kwargs: Any) -> Any:
            if _POISONED:
                raise RuntimeError(_POISONED[0])
            return value(*args, **kwargs)

        return poisoned

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> Any:
        if not _POISONED and _bad(handle, inputs, dtype=torch.float64):
            _POISONED.append(SIMULATED_ERROR)
        if _POISONED:
            raise RuntimeError(_POISONED[0])
        return super().execute(handle, inputs, outputs)

    def lower(self, methods: Mapping[str, Any], *, device: str, **kwargs: Any) -> bytes:
        if _POISONED:
            raise RuntimeError(_POISONED[0])
        return super().lower(methods, device=device, **kwargs)

    def view_copy_pass(self, graph_module: Any) -> Any:
        if _POISONED:
            raise RuntimeError(_POISONED[0])
        return super().view_copy_pass(graph_module)


# ====================================================================================== CUDA (on the GPU)


def _store_out_of_bounds() -> None:
    """A Triton kernel that stores 4 TiB past its buffer: an illegal address, reported asynchronously."""
    import triton
    import triton.language as tl

    @triton.jit
    def store(ptr, offset):  # type: ignore[no-untyped-def]
        tl.store(ptr + offset, 1.0)

    buffer = torch.zeros(1, device="cuda")
    store[(1,)](buffer, 1 << 40)


def _spin_forever() -> None:
    """A Triton kernel that waits for a flag nobody sets, then a synchronisation that waits for it: a
    deadlocked stream wait (in C, the GIL released by torch)."""
    import triton
    import triton.language as tl

    @triton.jit
    def spin(flag_ptr):  # type: ignore[no-untyped-def]
        while tl.load(flag_ptr, volatile=True) == 0:
            pass

    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    spin[(1,)](flag)
    torch.cuda.synchronize()


class IllegalAddressInExecute(Faulty):
    """One execute of a CUDA program launches a kernel that stores out of bounds, then runs as usual: the
    error surfaces at the next synchronisation, and sticks to the process."""

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> Any:
        if _is_trigger(handle):
            _store_out_of_bounds()
        return super().execute(handle, inputs, outputs)


class OutOfMemoryInExecute(Faulty):
    """One execute of a CUDA program holds a quarter of the card in a local, then asks for twice the card:
    a CUDA out-of-memory whose traceback (kept by pytest) would hold that quarter for later cases."""

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> Any:
        if _is_trigger(handle):
            total = torch.cuda.get_device_properties(0).total_memory
            held = torch.empty(total // 4, dtype=torch.uint8, device="cuda")
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")  # raises torch.OutOfMemoryError
            del held
        return super().execute(handle, inputs, outputs)


class HangsOnTheDevice(Faulty):
    """One execute of a CUDA program waits forever on a kernel that never ends."""

    def execute(self, handle: object, inputs: Any, outputs: Any = None) -> Any:
        if _is_trigger(handle):
            _spin_forever()
        return super().execute(handle, inputs, outputs)


_CUDA_CHAPTERS = (PROGRAM_FORMAT, BAD_INPUTS)
_CPU_CHAPTERS = (PROGRAM_FORMAT, BAD_INPUTS, LOWERING)


def _cuda(outcome: str, evidence: str) -> Fault:
    """The fault of the CUDA execute of 解码器: whole chapters, on a GPU."""
    return Fault(_CUDA_CHAPTERS, {non_ascii_case("cuda"): (outcome, evidence)}, cuda=True)


def _cpu(case: str, outcome: str, evidence: str) -> Fault:
    return Fault(_CPU_CHAPTERS, {case: (outcome, evidence)}, select=CPU_SELECTION)


HANGS_IN_EXECUTE = HangsInExecute(
    "hangs_in_execute", _cpu(bad_inputs_case("one-input-more"), "timeout", "in deadlock_holding_the_gil")
)
HANGS_IN_LOWER = HangsInLower("hangs_in_lower", _cpu(non_ascii_case("cpu"), "timeout", "in lower"))
HANGS_IN_VIEW_PASS = HangsInViewPass(
    "hangs_in_view_pass",
    _cpu(f"{LOWERING}::test_view_pass_verdicts[every-view-twin/slice_copy]", "timeout", "in view_copy_pass"),
)
DIES_IN_EXECUTE = DiesInExecute(
    "dies_in_execute", _cpu(bad_inputs_case("one-input-fewer"), "crashed", "crashed while running")
)
POISONS_ITS_PROCESS = PoisonsItsProcess(
    "poisons_its_process",
    _cpu(bad_inputs_case("wrong-dtype-float64"), "device-fault", "simulated sticky error"),
)
ILLEGAL_ADDRESS_IN_EXECUTE = IllegalAddressInExecute(
    "illegal_address_in_execute", _cuda("device-fault", "illegal memory access")
)
OUT_OF_MEMORY_IN_EXECUTE = OutOfMemoryInExecute("out_of_memory_in_execute", _cuda("failed", "out of memory"))
HANGS_ON_THE_DEVICE = HangsOnTheDevice("hangs_on_the_device", _cuda("timeout", "in _spin_forever"))


class AllCpuFaults(PoisonsItsProcess, HangsInExecute, DiesInExecute, HangsInLower, HangsInViewPass):
    """Every CPU fault at once, each at its own case: one run shows them all (the CPU self-test)."""


#: The CPU faulty backends, each at its own case.
CPU_FAULTS = (HANGS_IN_EXECUTE, HANGS_IN_LOWER, HANGS_IN_VIEW_PASS, DIES_IN_EXECUTE, POISONS_ITS_PROCESS)
ALL_CPU_FAULTS = AllCpuFaults(
    "all_cpu_faults",
    Fault(
        _CPU_CHAPTERS,
        {case: want for backend in CPU_FAULTS for case, want in backend.fault.faulty.items()},
        select=CPU_SELECTION,
    ),
)


class SlowViewPass:
    """Correct, only slow: every view pass takes ``seconds``, so a self-test can stop a run of the
    view-pass cases halfway (tests/project/test_front_door.py). Not faulty: it declares no fault."""

    name, version = "slow_view_pass", "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __getattr__(self, attr: str) -> Any:
        return getattr(REFERENCE, attr)

    def view_copy_pass(self, graph_module: Any) -> Any:
        time.sleep(self.seconds)
        return REFERENCE.view_copy_pass(graph_module)


SLOW_VIEW_PASS = SlowViewPass(0.33)
#: 52 view-pass cases on two workers: at least 52 s, whatever the machine.
SLOWER_VIEW_PASS = SlowViewPass(2.0)


def faulty_backends() -> dict[str, Faulty]:
    """Every faulty backend of this module, by ``--backend`` spec."""
    return {f"{__name__}:{name}": value for name, value in globals().items() if isinstance(value, Faulty)}
