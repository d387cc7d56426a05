"""PyTorch's AOTI runner checks a dynamic dimension's bounds only with input checks on, lower bound 2 too.

    python torch_aoti/repros/dim_bound.py

Exports ``x * y + z`` on three float32 [rows, 32] inputs with ``Dim("rows", max=8)`` (no lower bound given),
packages it with ``aoti_compile_and_package``, loads it with ``aoti_load_package`` and calls it with 12 rows
and with 1 row, each in a fresh process. As deployed (``AOTI_RUNTIME_CHECK_INPUTS`` unset) both run (12 rows
past the declared maximum). With ``AOTI_RUNTIME_CHECK_INPUTS=1`` both are rejected: 12 is too large, and 1,
a valid size, is "too small" (export's 0/1 specialisation makes the bound 2; ``aot_inductor.check_lowerbound``
gates it, pytorch#196131). Exits 0 when reproduced; 1 otherwise.
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
CASES: dict[str, tuple[Inputs, str, str]] = {
    "12 rows (max=8)": (
        lambda x, y, z: [torch.cat([t, t, t[:4]]) for t in (x, y, z)],
        "ACCEPTED",
        "REJECTED",
    ),
    "1 row (a valid size)": (lambda x, y, z: [t[:1] for t in (x, y, z)], "ACCEPTED", "REJECTED"),
}


class AddMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x * y + z


def run(path: str, case: str) -> None:
    """In the child: one call with the case's inputs; prints ACCEPTED or REJECTED (a crash prints nothing)."""
    model = torch._inductor.aoti_load_package(path)
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randint(-8, 9, (4, 32), generator=gen).float() for _ in range(3))
    inputs = CASES[case][0](x, y, z)
    try:
        out = model(*inputs)
    except RuntimeError as exc:
        print(f"REJECTED {str(exc).splitlines()[0]}")
        return
    a, b, c = (t.double() for t in inputs)
    equal = torch.equal(out.double(), a * b + c)
    print(f"ACCEPTED: returned {out.dtype}{list(out.shape)}, equal to x * y + z: {equal}")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        example = tuple(torch.ones(4, 32) for _ in range(3))
        rows = torch.export.Dim("rows", max=8)
        ep = torch.export.export(AddMul(), example, dynamic_shapes=({0: rows},) * 3)
        path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, "add_mul.pt2"))
        ok = True
        for column, mode in enumerate(("default", "checked"), start=1):
            env = {k: v for k, v in os.environ.items() if k != "AOTI_RUNTIME_CHECK_INPUTS"}
            env.update({"AOTI_RUNTIME_CHECK_INPUTS": "1"} if mode == "checked" else {})
            for case in CASES:
                child = [sys.executable, __file__, "--run", path, case]
                done = subprocess.run(child, env=env, capture_output=True, text=True)
                line = next((s for s in done.stdout.splitlines() if s.startswith(("ACC", "REJ"))), "")
                line = line or f"CRASHED: exit code {done.returncode}"
                print(f"{mode:8} {case:24} -> {line}")
                ok &= line.startswith(CASES[case][column])
    print("reproduced" if ok else "NOT reproduced: PyTorch's behaviour changed")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
