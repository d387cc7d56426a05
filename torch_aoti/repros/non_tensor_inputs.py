"""PyTorch's AOTI package runner drops non-tensor inputs before the compiled model sees them.

    python torch_aoti/repros/non_tensor_inputs.py [--device cuda]

Exports ``x * y + z`` on three float32 [4, 32] inputs, packages it with ``aoti_compile_and_package``, loads
it with ``aoti_load_package`` and calls it with ``None`` or a float in place of ``z``, and with a float after
the three tensors. ``AOTICompiledModel.__call__`` (torch/export/pt2_archive/_package.py) keeps only the
``torch.Tensor`` leaves of the arguments, so the first two fail with "expected inputs vector size to be 3,
but got 2" (a count, not the non-tensor) and the third runs as if the float were not there, in both modes
(``AOTI_RUNTIME_CHECK_INPUTS`` unset and ``=1``). Exits 0 when reproduced; 1 otherwise.
``--device cuda``: the same on a CUDA model (see ``_add_mul.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from _add_mul import reproduce  # this directory: the script's own

Inputs = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list[object]]
#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
CASES: dict[str, tuple[Inputs, str, str]] = {
    "z as None": (lambda x, y, z: [x, y, None], "REJECTED expected inputs vector size", "REJECTED expected"),
    "z as 3.0": (lambda x, y, z: [x, y, 3.0], "REJECTED expected inputs vector size", "REJECTED expected"),
    "x, y, z and 3.0": (lambda x, y, z: [x, y, z, 3.0], "ACCEPTED", "ACCEPTED"),
}


if __name__ == "__main__":
    sys.exit(reproduce(CASES, __file__))
