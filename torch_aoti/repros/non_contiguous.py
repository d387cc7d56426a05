"""PyTorch's AOTI runner reads a non-contiguous input as if it were contiguous: wrong numbers, no error.

    python torch_aoti/repros/non_contiguous.py [--device cuda]

Exports ``x * y + z`` on three contiguous float32 [4, 32] inputs, packages it with
``aoti_compile_and_package``, loads it with ``aoti_load_package`` and calls it with ``x`` as a transposed
view (the right sizes, strides (1, 4)): in a fresh process, once as deployed (``AOTI_RUNTIME_CHECK_INPUTS``
unset: the kernel indexes with the compiled strides, so the result is wrong) and once with
``AOTI_RUNTIME_CHECK_INPUTS=1`` (a RuntimeError about the stride). Exits 0 when reproduced; 1 otherwise.
``--device cuda``: the same on a CUDA model (the transposed view copied to the device with its
strides, see ``_add_mul.py``).
"""

from __future__ import annotations

import sys

from _add_mul import Cases, reproduce  # this directory: the script's own

#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
CASES: Cases = {
    "x as a transposed view": (lambda x, y, z: [x.t().contiguous().t(), y, z], "ACCEPTED", "REJECTED"),
}


if __name__ == "__main__":
    sys.exit(reproduce(CASES, __file__))
