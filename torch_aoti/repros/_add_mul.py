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


def run(cases: Cases, path: str, case: str) -> None:
    """In the child: one call with the case's inputs; prints ACCEPTED or REJECTED (a crash prints nothing)."""
    model = torch._inductor.aoti_load_package(path)
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randint(-8, 9, (4, 32), generator=gen).float() for _ in range(3))
    inputs = cases[case][0](x, y, z)
    try:
        out = model(*inputs)
    except RuntimeError as exc:
        print(f"REJECTED {str(exc).splitlines()[0]}")
        return
    equal = torch.equal(out.double(), x.double() * y.double() + z.double())  # what the good inputs give
    print(f"ACCEPTED: returned {out.dtype}{list(out.shape)}, equal to x * y + z of the good inputs: {equal}")


def compare_modes(cases: Cases, script: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        example = tuple(torch.ones(4, 32) for _ in range(3))
        path = torch._inductor.aoti_compile_and_package(
            torch.export.export(AddMul(), example), package_path=os.path.join(tmp, "add_mul.pt2")
        )
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


def reproduce(cases: Cases, script: str) -> int:
    """The script's entry point: the parent compares the modes; ``--run PATH CASE`` is one child call."""
    if sys.argv[1:2] == ["--run"]:
        run(cases, sys.argv[2], sys.argv[3])
        return 0
    return compare_modes(cases, script)
