"""PyTorch's AOTI runner crashes the process on an empty input where [4, 32] was exported (unchecked).

    python torch_aoti/repros/empty_input.py [--device cuda]

Exports ``x * y + z`` on three float32 [4, 32] inputs, packages it with ``aoti_compile_and_package``, loads
it with ``aoti_load_package`` and calls it with ``y`` of size [0, 32], and with ``x`` of size [4, 0] (the
differential chapter's generated call), each in a fresh process, once as deployed
(``AOTI_RUNTIME_CHECK_INPUTS`` unset: a segmentation fault, the kernel reads through an empty tensor's data
pointer) and once with ``AOTI_RUNTIME_CHECK_INPUTS=1`` (a RuntimeError). Exits 0 when the
default runner crashes and the checked one rejects; 1 otherwise (PyTorch changed: update the known failure).

``--device cuda``: the same on a CUDA model, where the kernel's read through the empty (0-byte) device tensor
is an illegal memory access, seen at the synchronisation after the call (DEVICE-FAULT) or killing the
process (CRASHED): either is the expected outcome as deployed.
"""

from __future__ import annotations

import sys

from _add_mul import Cases, reproduce  # this directory: the script's own

#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
CASES: Cases = {
    # CRASHED on the CPU; on CUDA an illegal memory access, DEVICE-FAULT (or CRASHED if it kills the process)
    "y as [0, 32]": (lambda x, y, z: [x, y[:0], z], ("CRASHED", "DEVICE-FAULT"), "REJECTED"),
    # The differential chapter's generated call (InputsPlan bad='empty-size'): an empty last dimension.
    "x as [4, 0]": (lambda x, y, z: [x[:, :0], y, z], ("CRASHED", "DEVICE-FAULT"), "REJECTED"),
}


if __name__ == "__main__":
    sys.exit(reproduce(CASES, __file__))
