"""PyTorch's AOTI runner accepts inputs of the wrong rank or sizes (pytorch#141115; checks only on request).

    python torch_aoti/repros/wrong_shape.py [--device cuda]

Exports ``x * y + z`` on three float32 [4, 32] inputs (static shapes), packages it with
``aoti_compile_and_package``, loads it with ``aoti_load_package`` and calls it with one input of rank 3 or 1,
of size [4, 31] or [32, 4] or [4, 32, 1] (the exported sizes and a trailing 1), or with all three [8, 32]:
each in a fresh process, once as deployed (``AOTI_RUNTIME_CHECK_INPUTS`` unset) and once with
``AOTI_RUNTIME_CHECK_INPUTS=1``. As deployed, every call returns a [4, 32] result (the 8-row call silently
drops four rows; the [4, 31] one reads past the end of ``z``). Exits 0 when the default runner accepts every
one and the checked one rejects every one, except [4, 32, 1], which the checked runner of torch 2.11 accepts
(it never compares the rank; 2.13 refuses it); 1 otherwise. ``--device cuda``: the same on a CUDA model
(see ``_add_mul.py``).
"""

from __future__ import annotations

import sys

import torch
from _add_mul import Cases, reproduce  # this directory: the script's own

#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
CASES: Cases = {
    "x as [1, 4, 32] (rank 3)": (lambda x, y, z: [x[None], y, z], "ACCEPTED", "REJECTED"),
    "y as [128] (rank 1)": (lambda x, y, z: [x, y.flatten(), z], "ACCEPTED", "REJECTED"),
    "z as [4, 31]": (lambda x, y, z: [x, y, z[:, :-1].contiguous()], "ACCEPTED", "REJECTED"),
    "x as [32, 4]": (lambda x, y, z: [x.t().contiguous(), y, z], "ACCEPTED", "REJECTED"),
    "all as [8, 32]": (lambda x, y, z: [torch.cat([t, t]) for t in (x, y, z)], "ACCEPTED", "REJECTED"),
    # The exported sizes and one more: torch 2.11's check compares the exported dims by index and never the
    # rank, so it passes; 2.13's refuses it ("expected ndim 2 but got 3", seen on 2.13.0+cpu).
    "y as [4, 32, 1]": (
        lambda x, y, z: [x, y[..., None], z],
        "ACCEPTED",
        {"2.11": "ACCEPTED", "2.13": "REJECTED"},
    ),
}


if __name__ == "__main__":
    sys.exit(reproduce(CASES, __file__))
