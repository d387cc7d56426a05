"""Faulty backends: each wraps the reference and is faulty in one call, the way CUDA backends fail in the
field — a call that never returns, a process that dies, a kernel that stores out of bounds, an allocation
beyond the card. They break no rule: they test that the suite contains the fault, names the case that
caused it with its evidence, and gives every other case the outcome it gets against the reference
(``tests/test_fault_robustness.py``; the CUDA ones on a GPU through ``.ci/gpu/faults.sh``).

Each declares ``fault`` (a ``Fault``): what the run must show. The faulty call is the ``execute`` (or
``lower``) of method ``解码器`` of chapter program_format's non-ASCII program, for one target, so exactly
one case of the chapter meets it: ``test_non_ascii_method_names_round_trip[<target>-program]``; the view
pass hangs on the KV-cache attention graph only (``test_view_pass_slicing_heavy_kv_cache``).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE

PROGRAM_FORMAT = "conformance/test_program_format.py"
BAD_INPUTS = "conformance/test_bad_inputs.py"
LOWERING = "conformance/test_lowering.py"
#: The method whose execute (or lower) is faulty; only the non-ASCII program has it.
TRIGGER = "解码器"


def faulty_case(target: str) -> str:
    return f"{PROGRAM_FORMAT}::test_non_ascii_method_names_round_trip[{target}-program]"


@dataclass(frozen=True)
class Fault:
    """What a run of ``chapters`` against the faulty backend must show: the cases ``faulty`` end in
    ``outcome``, with ``evidence`` in their message or evidence; every other case as against the
    reference. ``cuda``: the fault needs a GPU (elsewhere the faulty case is skipped or healthy).
    ``select``: pytest arguments that keep the CPU self-test's run small (the GPU script runs the whole
    chapters)."""

    outcome: str
    chapters: tuple[str, ...]
    faulty: tuple[str, ...]
    evidence: str
    cuda: bool = False
    select: tuple[str, ...] = ()


#: A small program_format selection that still reaches the faulty case: the CPU self-tests run this.
SMALL_PROGRAM_FORMAT = ("-k", "non_ascii or every_method or method_names_match or empty_program")


class Faulty:
    """Forwards every protocol part to the reference; a subclass makes one call faulty."""

    version = "faulty"
    lowering_devices = REFERENCE.lowering_devices
    lower_options = REFERENCE.lower_options
    fault: Fault

    def __init__(self, name: str, fault: Fault) -> None:
        self.name = name
        self.fault = fault

    def __getattr__(self, attr: str) -> Any:
        return getattr(REFERENCE, attr)

    @staticmethod
    def _is_trigger(handle: object, target: str) -> bool:
        device = getattr(handle, "device", None)
        return getattr(handle, "method_name", None) == TRIGGER and getattr(device, "type", None) == target


# ==================================================================================================== hangs


def deadlock_holding_the_gil() -> None:
    """Block forever in C with the GIL held, as a C extension stuck on a lock (or in a CUDA wait without
    releasing the GIL) does: no Python thread of the process runs again, no signal handler either."""
    mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t is an unlocked default mutex
    ctypes.CDLL(None).pthread_mutex_lock(mutex)
    ctypes.PyDLL(None).pthread_mutex_lock(mutex)  # PyDLL keeps the GIL during the call


class HangsInExecute(Faulty):
    """One execute never returns, stuck in C holding the GIL: a deadlocked stream wait."""

    def execute(self, handle: object, inputs: Sequence[torch.Tensor], outputs: Any = None) -> Any:
        if self._is_trigger(handle, "cpu"):
            deadlock_holding_the_gil()
        return REFERENCE.execute(handle, inputs, outputs)


class HangsInLower(Faulty):
    """Lowering a program with method ``解码器`` for the CPU waits on a lock it already holds."""

    def lower(self, methods: Mapping[str, Any], *, device: str, **kwargs: Any) -> bytes:
        if TRIGGER in methods and device == "cpu":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # never returns
        return REFERENCE.lower(methods, device=device, **kwargs)


class HangsInViewPass(Faulty):
    """The view pass loops forever on the KV-cache attention graph (its placeholders ``b_k_cache``)."""

    def view_copy_pass(self, graph_module: Any) -> Any:
        names = {node.name for node in graph_module.graph.nodes if node.op == "placeholder"}
        if "b_k_cache" in names:
            threading.Event().wait()
        return REFERENCE.view_copy_pass(graph_module)


# ============================================================================================ process death


class DiesInExecute(Faulty):
    """One execute aborts the process (a failed assertion in the backend's C++)."""

    def execute(self, handle: object, inputs: Sequence[torch.Tensor], outputs: Any = None) -> Any:
        if self._is_trigger(handle, "cpu"):
            os.abort()
        return REFERENCE.execute(handle, inputs, outputs)


# =============================================================================== a device fault, simulated

_POISONED: list[str] = []
SIMULATED_ERROR = "CUDA error: an illegal memory access was encountered (simulated sticky error)"


def simulated_probe() -> str | None:
    """The device probe for ``PoisonsItsProcess`` (``--device-probe tests.broken_fault_backends:
    simulated_probe``): the poisoned process's error, like a sticky CUDA error."""
    return f"AcceleratorError: {_POISONED[0]}" if _POISONED else None


class PoisonsItsProcess(Faulty):
    """A sticky device error without a GPU: one execute poisons its process, and from then on every call
    into the backend in that process fails, as every CUDA call fails after an illegal address. Without
    containment every later case on that worker fails with it."""

    def __getattr__(self, attr: str) -> Any:
        value = getattr(REFERENCE, attr)
        if not callable(value) or attr in ("name", "version"):
            return value

        def poisoned(*args: Any, **kwargs: Any) -> Any:
            if _POISONED:
                raise RuntimeError(_POISONED[0])
            return value(*args, **kwargs)

        return poisoned

    def execute(self, handle: object, inputs: Sequence[torch.Tensor], outputs: Any = None) -> Any:
        if _POISONED:
            raise RuntimeError(_POISONED[0])
        if self._is_trigger(handle, "cpu"):
            _POISONED.append(SIMULATED_ERROR)
            raise RuntimeError(SIMULATED_ERROR)
        return REFERENCE.execute(handle, inputs, outputs)


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

    def execute(self, handle: object, inputs: Sequence[torch.Tensor], outputs: Any = None) -> Any:
        if self._is_trigger(handle, "cuda"):
            _store_out_of_bounds()
        return REFERENCE.execute(handle, inputs, outputs)


class OutOfMemoryInExecute(Faulty):
    """One execute of a CUDA program holds a quarter of the card in a local, then asks for twice the card:
    a CUDA out-of-memory whose traceback (kept by pytest) would hold that quarter for later cases."""

    def execute(self, handle: object, inputs: Sequence[torch.Tensor], outputs: Any = None) -> Any:
        if self._is_trigger(handle, "cuda"):
            total = torch.cuda.get_device_properties(0).total_memory
            held = torch.empty(total // 4, dtype=torch.uint8, device="cuda")
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")  # raises torch.OutOfMemoryError
            del held
        return REFERENCE.execute(handle, inputs, outputs)


class HangsOnTheDevice(Faulty):
    """One execute of a CUDA program waits forever on a kernel that never ends."""

    def execute(self, handle: object, inputs: Sequence[torch.Tensor], outputs: Any = None) -> Any:
        if self._is_trigger(handle, "cuda"):
            _spin_forever()
        return REFERENCE.execute(handle, inputs, outputs)


_CHAPTERS = (PROGRAM_FORMAT, BAD_INPUTS)


def _on(target: str, outcome: str, evidence: str) -> Fault:
    """The fault of a program_format ``execute``/``lower`` for ``target``: the CPU ones run a small
    selection in the self-tests, the CUDA ones whole chapters on the GPU."""
    if target == "cuda":
        return Fault(outcome, _CHAPTERS, (faulty_case("cuda"),), evidence, cuda=True)
    return Fault(outcome, _CHAPTERS, (faulty_case("cpu"),), evidence, select=SMALL_PROGRAM_FORMAT)


HANGS_IN_EXECUTE = HangsInExecute("hangs_in_execute", _on("cpu", "timeout", "in deadlock_holding_the_gil"))
HANGS_IN_LOWER = HangsInLower("hangs_in_lower", _on("cpu", "timeout", "in lower"))
HANGS_IN_VIEW_PASS = HangsInViewPass(
    "hangs_in_view_pass",
    Fault(
        "timeout",
        (LOWERING,),
        (f"{LOWERING}::test_view_pass_slicing_heavy_kv_cache",),
        "in view_copy_pass",
        select=("-k", "kv_cache or (view_pass_verdicts and slice)"),
    ),
)
DIES_IN_EXECUTE = DiesInExecute("dies_in_execute", _on("cpu", "crashed", "crashed while running"))
POISONS_ITS_PROCESS = PoisonsItsProcess(
    "poisons_its_process", _on("cpu", "device-fault", "simulated sticky error")
)
ILLEGAL_ADDRESS_IN_EXECUTE = IllegalAddressInExecute(
    "illegal_address_in_execute", _on("cuda", "device-fault", "illegal memory access")
)
OUT_OF_MEMORY_IN_EXECUTE = OutOfMemoryInExecute(
    "out_of_memory_in_execute", _on("cuda", "failed", "out of memory")
)
HANGS_ON_THE_DEVICE = HangsOnTheDevice("hangs_on_the_device", _on("cuda", "timeout", "in _spin_forever"))


def faulty_backends() -> dict[str, Faulty]:
    """Every faulty backend of this module, by ``--backend`` spec."""
    return {f"{__name__}:{name}": value for name, value in globals().items() if isinstance(value, Faulty)}
