"""Validated call shapes for ``mm_out``'s fast path: a repeated call skips re-checking what cannot change.

A GEMM call's validity depends on the three tensors' types, layouts, dtypes, shapes, strides and
devices (the ``key``), plus two things a key cannot hold: where the tensors lie (``out`` must not
overlap an operand) and their negative-view bits. Once a key has passed every check (``mm_out.validate``),
its plan is kept here; a later call with the same key only re-checks the addresses, conservatively
(bounding ranges: anything that merely might overlap goes back through the exact check) and the bits.
Pure inspection of tensor metadata, so everything here is testable on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_impl.shims.gemm_plan import GemmPlan

#: Keys kept before the cache starts over (a call sequence rarely has more than a few dozen shapes).
MAX_ENTRIES = 1024

_TENSOR = torch.Tensor
_STRIDED = torch.strided

Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class FastCall:
    """What one validated key needs per call: the cuBLAS plan and the operands' memory extents."""

    plan: GemmPlan
    data_type: int
    device_index: int
    out_bytes: int
    self_bytes: int
    mat2_bytes: int


def call_key(out: object, self_: object, mat2: object) -> Key | None:
    """The cache key of a call, or None when the call is not of the plain kind (then: always checked).

    Plain: three exact ``torch.Tensor`` objects (no subclass, which may override anything) in strided
    layout (others have no strides to key on).
    """
    if not (type(out) is _TENSOR and type(self_) is _TENSOR and type(mat2) is _TENSOR):
        return None
    if not (out.layout is _STRIDED and self_.layout is _STRIDED and mat2.layout is _STRIDED):
        return None
    return (
        out.dtype, out.shape, out.stride(), out.device,
        self_.dtype, self_.shape, self_.stride(), self_.device,
        mat2.dtype, mat2.shape, mat2.stride(), mat2.device,
    )  # fmt: skip


def extent_bytes(t: torch.Tensor) -> int:
    """Bytes from a strided tensor's first element to one past its last (0 when it has none)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def may_overlap(out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, call: FastCall) -> bool:
    """Whether ``out``'s range meets an operand's: False proves no overlap; True means check exactly."""
    lo = out.data_ptr()
    hi = lo + call.out_bytes
    a = self_.data_ptr()
    b = mat2.data_ptr()
    return (a < hi and lo < a + call.self_bytes) or (b < hi and lo < b + call.mat2_bytes)


def has_negative_view(out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor) -> bool:
    return out.is_neg() or self_.is_neg() or mat2.is_neg()


class CallCache:
    """Key → ``FastCall``; shared by all threads without a lock: dict reads and writes and the reset
    (one assignment) are atomic under the GIL, and a lost entry only means one more full check."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[Key, FastCall] = {}

    def get(self, key: Key) -> FastCall | None:
        return self._entries.get(key)

    def put(self, key: Key, call: FastCall) -> None:
        if len(self._entries) >= self.max_entries:
            self._entries = {}
        self._entries[key] = call

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries = {}
