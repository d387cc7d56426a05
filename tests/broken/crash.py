"""A backend that kills its process on one kind of generated input: an execute given an input with no
elements reads through a null pointer (``ctypes.string_at(0)``: a segmentation fault), as a runtime that
checks no sizes does (PyTorch's AOTI runner as deployed, ``torch_aoti/repros/empty_input.py``). It breaks
no rule's check in a way the case could report: the process dies. ``tests/conformance/test_crash_replay.py``
shows the differential chapter finding the crash again, shrinking it and recording it ``crashed`` under
``differential/missing-error`` (the oracle rejects an empty input), with every other case unaffected."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE


class SegfaultsOnEmptyInput:
    """Forwards every protocol part to the reference; ``execute`` dies on an input with no elements."""

    name = "segfaults-on-empty-input"
    version = "crash"
    lowering_devices = REFERENCE.lowering_devices
    lower_options = REFERENCE.lower_options

    def __getattr__(self, attr: str) -> Any:
        return getattr(REFERENCE, attr)

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> Any:
        if isinstance(inputs, (list, tuple)) and any(
            isinstance(t, torch.Tensor) and t.numel() == 0 for t in inputs
        ):
            ctypes.string_at(0)  # a read through a null pointer: SIGSEGV
        return REFERENCE.execute(handle, inputs, outputs)


SEGFAULTS_ON_EMPTY_INPUT = SegfaultsOnEmptyInput()


class SegfaultsOnEmptyMatmul:
    """Forwards every protocol part to the reference; ``mm_out`` dies when the inner dimension is 0 (a
    kernel that reads ``self[0, 0]`` before looping over k), whatever the operands' device."""

    name = "segfaults-on-empty-matmul"
    version = "crash"

    def __getattr__(self, attr: str) -> Any:
        return getattr(REFERENCE, attr)

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if isinstance(self_, torch.Tensor) and self_.dim() == 2 and self_.shape[1] == 0:
            ctypes.string_at(0)  # a read through a null pointer: SIGSEGV
        REFERENCE.mm_out(out, self_, mat2)


SEGFAULTS_ON_EMPTY_MATMUL = SegfaultsOnEmptyMatmul()
