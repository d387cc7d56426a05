"""Deliberately broken backends: each breaks one rule, so self-tests can prove the suite catches it.

Each wraps the reference backend and changes one behaviour, the way a real backend regresses.
"""

from __future__ import annotations

import torch

from reference_impl import BACKEND as REFERENCE


class _Wrapped:
    version = "broken"

    def __init__(self, name: str) -> None:
        self.name = name


class AcceptsDtypeMismatch(_Wrapped):
    """Casts a mismatching mat2 to self's dtype instead of rejecting it (breaks mm_out/same-dtype)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if isinstance(self_, torch.Tensor) and isinstance(mat2, torch.Tensor) and mat2.dtype != self_.dtype:
            mat2 = mat2.to(self_.dtype)
        REFERENCE.mm_out(out, self_, mat2)


class AcceptsCpuTensors(_Wrapped):
    """Upstream's gap: no device-type check; CPU tensors are computed with torch.mm (breaks cuda-device)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (out, self_, mat2)):
            torch.mm(self_, mat2, out=out)
            return
        REFERENCE.mm_out(out, self_, mat2)


ACCEPTS_DTYPE_MISMATCH = AcceptsDtypeMismatch("accepts-dtype-mismatch")
ACCEPTS_CPU_TENSORS = AcceptsCpuTensors("accepts-cpu-tensors")


class NoMmOut:
    """A backend that implements no protocol part: chapters must skip, not fail."""

    name = "no-parts"
    version = "0"


NO_PARTS = NoMmOut()
