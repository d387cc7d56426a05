"""What the add-mul repros share: ``x * y + z`` on three float32 [4, 32] inputs, packaged with
``aoti_compile_and_package``, called once per case in a fresh process as deployed
(``AOTI_RUNTIME_CHECK_INPUTS`` unset) and once with ``AOTI_RUNTIME_CHECK_INPUTS=1``. Torch only, like the
scripts that use it (each runs as ``python torch_aoti/repros/X.py``: this directory is on its path).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

import torch

Inputs = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list[torch.Tensor]]
#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
Cases = dict[str, tuple[Inputs, str, str]]


class AddMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x * y + z


def run(cases: Cases, path: str, case: str, *, of_inputs: bool = False) -> None:
    """In the child: one call with the case's inputs; prints ACCEPTED or REJECTED (a crash prints nothing).
    An accepted call is compared with x * y + z of the good inputs, or with ``of_inputs`` of its own (inputs
    of another valid size)."""
    model = torch._inductor.aoti_load_package(path)
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randint(-8, 9, (4, 32), generator=gen).float() for _ in range(3))
    inputs = cases[case][0](x, y, z)
    try:
        out = model(*inputs)
    except RuntimeError as exc:
        print(f"REJECTED {str(exc).splitlines()[0]}")
        return
    a, b, c = (t.double() for t in (inputs if of_inputs else (x, y, z)))
    which = "its inputs" if of_inputs else "the good inputs"
    print(
        f"ACCEPTED: returned {out.dtype}{list(out.shape)}, equal to x * y + z of {which}: "
        f"{torch.equal(out.double(), a * b + c)}"
    )


def compare_modes(cases: Cases, script: str, dynamic_shapes: object = None) -> int:
    """The parent: the model exported (with ``dynamic_shapes``) and packaged once, each case called in a
    fresh process per mode; 0 when every outcome is the one the cases expect."""
    with tempfile.TemporaryDirectory() as tmp:
        example = tuple(torch.ones(4, 32) for _ in range(3))
        exported = torch.export.export(AddMul(), example, dynamic_shapes=dynamic_shapes)
        package = os.path.join(tmp, "add_mul.pt2")
        path = torch._inductor.aoti_compile_and_package(exported, package_path=package)
        ok = True
        for column, mode in enumerate(("default", "checked"), start=1):
            env = {k: v for k, v in os.environ.items() if k != "AOTI_RUNTIME_CHECK_INPUTS"}
            env.update({"AOTI_RUNTIME_CHECK_INPUTS": "1"} if mode == "checked" else {})
            for case in cases:
                child = [sys.executable, script, "--run", path, case]
                done = subprocess.run(child, env=env, capture_output=True, text=True)
                line = next((s for s in done.stdout.splitlines() if s.startswith(("ACC", "REJ"))), "")
                line = line or f"CRASHED: exit code {done.returncode}"
                print(f"{mode:8} {case:24} -> {line}")
                ok &= line.startswith(cases[case][column])
    print("reproduced" if ok else "NOT reproduced: PyTorch's behaviour changed")
    return 0 if ok else 1


def reproduce(cases: Cases, script: str, dynamic_shapes: object = None, *, of_inputs: bool = False) -> int:
    """The script's entry point: the parent compares the modes; ``--run PATH CASE`` is one child call."""
    if sys.argv[1:2] == ["--run"]:
        run(cases, sys.argv[2], sys.argv[3], of_inputs=of_inputs)
        return 0
    return compare_modes(cases, script, dynamic_shapes)
