"""Broken backends for the ``mm_out`` rules a wrong layout cannot show: accumulation into ``out``, a scratch
buffer shared between threads, a host sync, a call that tolerates a missing argument, compiled programs
that never reach the backend's shim, and the two-GPU slips (the current device left moved, operands
copied across devices). Each wraps the reference; the chapter is CUDA-only, so ``.ci/gpu/followup.sh``
runs them on the GPU machine (the CPU self-tests skip them with the reason; the two-GPU ones where fewer
than two GPUs are present).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import ClassVar

import torch

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import MM_OUT, Forwarding
from tests.rule_coverage import Breaks


class AccumulatesIntoOut(Forwarding):
    """Calls GEMM with ``beta = 1`` (the BLAS default for ``C = alpha AB + beta C``) instead of 0: the old
    contents of ``out`` are added to the product. Invisible wherever ``out`` held zeros; the chapter poisons
    it (breaks ``mm_out/exact-ones`` and ``mm_out/exact-identity``)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        out.add_(torch.mm(self_, mat2))


class SharedScratch(Forwarding):
    """Computes every product into one module-wide scratch buffer, then copies it into ``out`` (one
    allocation, reused): two threads' calls overwrite each other's scratch between the GEMM and the copy
    (breaks ``mm_out/threads``)."""

    _scratch: ClassVar[dict[tuple[torch.device, torch.dtype], torch.Tensor]] = {}
    _guard = threading.Lock()

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        m, n = out.shape
        with self._guard:  # only the allocation is guarded: the buffer itself is shared, unlocked
            flat = self._scratch.get((out.device, out.dtype))
            if flat is None or flat.numel() < m * n:
                flat = torch.empty(max(m * n, 1 << 16), dtype=out.dtype, device=out.device)
                self._scratch[(out.device, out.dtype)] = flat
        scratch = flat[: m * n].view(m, n)
        torch.mm(self_, mat2, out=scratch)
        out.copy_(scratch)


class SynchronisesBeforeReturning(Forwarding):
    """Waits for the caller's stream before returning ("so the result is ready"): right values, but every
    call drains the stream and the host stalls on the GPU (breaks ``mm_out/no-host-sync``)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        REFERENCE.mm_out(out, self_, mat2)
        torch.cuda.current_stream(out.device).synchronize()


class TreatsAMissingMat2AsANoOp(Forwarding):
    """Takes ``mat2`` as optional and returns quietly without it ("nothing to multiply"): a call that forgot
    an argument succeeds, and ``out`` keeps whatever it held (breaks ``mm_out/arity``)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor | None = None, /) -> None:
        if mat2 is not None:
            REFERENCE.mm_out(out, self_, mat2)


class ClaimsTheRouteItSkipped(Forwarding):
    """Reports the compiled code's ``mm_out`` call sites as its own (``mm_out_calls_per_execute``), but
    ships the program unrouted: every ``mm_out`` of a compiled program runs libtorch's, and the backend's
    shim never sees one (breaks ``mm_out/program-route``)."""

    _routed_twin: ClassVar[dict[bytes, bytes]] = {}
    _sites: ClassVar[dict[int, int | None]] = {}

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        routed = REFERENCE.lower(methods, device=device, options=options)
        shipped = REFERENCE.lower(methods, device=device, options={**(options or {}), "native_mm_out": False})
        self._routed_twin[shipped] = routed
        return shipped

    def init(self, program: bytes, method: str) -> object:
        handle = REFERENCE.init(program, method)
        twin = self._routed_twin.get(program)
        if twin is not None:
            probe = REFERENCE.init(twin, method)
            self._sites[id(handle)] = REFERENCE.mm_out_calls_per_execute(probe)
            REFERENCE.destroy(probe)
        return handle

    def mm_out_calls_per_execute(self, handle: object) -> int | None:
        return self._sites.get(id(handle))


class LeavesTheCurrentDeviceMoved(Forwarding):
    """Makes the tensors' device current to compute (``cudaSetDevice``) and never sets the caller's back:
    the product is right, but the caller's next allocation or launch lands on the other GPU (breaks
    ``mm_out/device``)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        torch.cuda.set_device(out.device)
        REFERENCE.mm_out(out, self_, mat2)


class CopiesOperandsToOutsDevice(Forwarding):
    """Copies any operand that is not on ``out``'s device over to it, "to be helpful": a call mixing GPUs
    succeeds at the cost of a peer copy the caller never asked for, where the contract says invalid
    argument (breaks ``mm_out/same-device``)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        REFERENCE.mm_out(out, self_.to(out.device), mat2.to(out.device))


# ========================================================================================= declarations

ACCUMULATES_INTO_OUT_ONES = AccumulatesIntoOut(
    "accumulates-into-out",
    Breaks(("mm_out/exact-ones",), MM_OUT, ("-k", "all_ones_is_exactly_2048"), cuda=True),
)
ACCUMULATES_INTO_OUT_IDENTITY = AccumulatesIntoOut(
    "accumulates-into-out",
    Breaks(("mm_out/exact-identity",), MM_OUT, ("-k", "identity_times_diagonal_is_exact"), cuda=True),
)
SHARED_SCRATCH = SharedScratch(
    "shared-scratch", Breaks(("mm_out/threads",), MM_OUT, ("-k", "threads_match_serial"), cuda=True)
)
SYNCHRONISES_BEFORE_RETURNING = SynchronisesBeforeReturning(
    "synchronises-before-returning",
    Breaks(("mm_out/no-host-sync",), MM_OUT, ("-k", "callers_current_stream"), cuda=True, strict_should=True),
)
TREATS_A_MISSING_MAT2_AS_A_NO_OP = TreatsAMissingMat2AsANoOp(
    "treats-a-missing-mat2-as-a-no-op",
    Breaks(("mm_out/arity",), MM_OUT, ("-k", "missing_argument_is_a_call_error"), cuda=True),
)
CLAIMS_THE_ROUTE_IT_SKIPPED = ClaimsTheRouteItSkipped(
    "claims-the-route-it-skipped",
    Breaks(
        ("mm_out/program-route",),
        MM_OUT,
        ("-k", "compiled_program_calls_backend_mm_out and float32"),
        cuda=True,
    ),
)
LEAVES_THE_CURRENT_DEVICE_MOVED = LeavesTheCurrentDeviceMoved(
    "leaves-the-current-device-moved",
    Breaks(("mm_out/device",), MM_OUT, ("-k", "device1_call_runs_on_device1"), cuda=True, gpus=2),
)
COPIES_OPERANDS_TO_OUTS_DEVICE = CopiesOperandsToOutsDevice(
    "copies-operands-to-outs-device",
    Breaks(("mm_out/same-device",), MM_OUT, ("-k", "tensors_on_different_devices"), cuda=True, gpus=2),
)
