"""PyTorch's AOTI runner checks a dynamic dimension's bounds only with input checks on, lower bound 2 too.

    python torch_aoti/repros/dim_bound.py [--device cuda]

Exports ``x * y + z`` on three float32 [rows, 32] inputs with ``Dim("rows", max=8)`` (no lower bound given),
packages it with ``aoti_compile_and_package``, loads it with ``aoti_load_package`` and calls it with 12 rows
and with 1 row, each in a fresh process. As deployed (``AOTI_RUNTIME_CHECK_INPUTS`` unset) both run (12 rows
past the declared maximum). With ``AOTI_RUNTIME_CHECK_INPUTS=1`` both are rejected: 12 is too large, and 1,
a valid size, is "too small" (export's 0/1 specialisation makes the bound 2; ``aot_inductor.check_lowerbound``
gates it, pytorch#196131). Exits 0 when reproduced; 1 otherwise.
``--device cuda``: the same on a CUDA model (see ``_add_mul.py``).
"""

from __future__ import annotations

import sys

import torch
from _add_mul import Cases, reproduce  # this directory: the script's own

#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
CASES: Cases = {
    "12 rows (max=8)": (
        lambda x, y, z: [torch.cat([t, t, t[:4]]) for t in (x, y, z)],
        "ACCEPTED",
        "REJECTED",
    ),
    "1 row (a valid size)": (lambda x, y, z: [t[:1] for t in (x, y, z)], "ACCEPTED", "REJECTED"),
}


if __name__ == "__main__":
    rows = torch.export.Dim("rows", max=8)
    sys.exit(reproduce(CASES, __file__, ({0: rows},) * 3, of_inputs=True))
