"""PyTorch's AOTI runner accepts an input of the wrong dtype and returns garbage (no input checks by default).

    python torch_aoti/repros/wrong_dtype.py [--device cuda]

Exports ``x * y + z`` on three float32 [4, 32] inputs, packages it with ``aoti_compile_and_package``, loads
it with ``aoti_load_package`` and calls it with one input in float64, float16 or int64: each in a fresh
process, once as deployed (``AOTI_RUNTIME_CHECK_INPUTS`` unset) and once with ``AOTI_RUNTIME_CHECK_INPUTS=1``
(read once per compiled model, at its first run). Exits 0 when the default runner accepts every one
silently and the checked one rejects every one; 1 otherwise (PyTorch changed: update the known failure).
``--device cuda``: the same on a CUDA model (the inputs copied to the device as a deployment does,
see ``_add_mul.py``).
"""

from __future__ import annotations

import sys

from _add_mul import Cases, reproduce  # this directory: the script's own

#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
CASES: Cases = {
    "y as float64": (lambda x, y, z: [x, y.double(), z], "ACCEPTED", "REJECTED"),
    "x as float16": (lambda x, y, z: [x.half(), y, z], "ACCEPTED", "REJECTED"),
    "z as int64": (lambda x, y, z: [x, y, z.long()], "ACCEPTED", "REJECTED"),
}


if __name__ == "__main__":
    sys.exit(reproduce(CASES, __file__))
