"""PyTorch's AOTI runner accepts an input in bfloat16 where float32 was exported, even with its input checks
on (``AOTI_RUNTIME_CHECK_INPUTS=1``), which reject float64, float16 and int64 (``wrong_dtype.py``).

    python torch_aoti/repros/bfloat16_input.py [--device cuda]

The same model and runner as ``wrong_dtype.py`` (``x * y + z`` on three float32 [4, 32] inputs), called with
``x`` in bfloat16, in a fresh process each way. Exits 0 when both runners accept it (what torch 2.13 does on
a CPU model, found by the differential chapter's exhaustive round); 1 otherwise (PyTorch changed: update
the known failure).
"""

from __future__ import annotations

import sys

from _add_mul import Cases, reproduce  # this directory: the script's own

CASES: Cases = {
    "x as bfloat16": (lambda x, y, z: [x.bfloat16(), y, z], "ACCEPTED", "ACCEPTED"),
}


if __name__ == "__main__":
    sys.exit(reproduce(CASES, __file__))
