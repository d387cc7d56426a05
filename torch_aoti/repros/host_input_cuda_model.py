"""PyTorch's AOTI runner takes host tensors given to a CUDA model as device memory, in either mode: why the
adapter copies the protocol's host inputs to the device itself (``stage_inputs``).

    python torch_aoti/repros/host_input_cuda_model.py        (needs a CUDA device)

Exports ``x * y + z`` on three float32 [4, 32] CUDA inputs, packages it with ``aoti_compile_and_package``,
loads it with ``aoti_load_package`` and calls it with the three inputs on the host, each mode in a fresh
process: as deployed (``AOTI_RUNTIME_CHECK_INPUTS`` unset) and with ``AOTI_RUNTIME_CHECK_INPUTS=1``. Seen
on an H100 with torch 2.11.0+cu130: as deployed, "CUDA error: an illegal memory access was encountered"
(the kernel read the host pointers; the process's CUDA context is unusable after it); with the checks on,
"run_func_(...) API call failed" (the generated checks do not name the device either). Exits 0 when
neither mode refuses the call with an error that says which device the inputs should be on (it returns,
fails with a CUDA error, or the process dies); 1 otherwise (PyTorch changed: update the adapter's
docstring); 0 with "skipped" on a machine without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import torch
from _add_mul import AddMul  # this directory: the script's own

#: An error that says which device the inputs should be on names the device and what was expected.
DEVICE_WORDS = ("device", "expected")


def child(path: str) -> None:
    """One call with host inputs; prints ACCEPTED (and whether the values are right) or REJECTED."""
    model = torch._inductor.aoti_load_package(path)
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randint(-8, 9, (4, 32), generator=gen).float() for _ in range(3))
    try:
        out = model(x, y, z)
        torch.cuda.synchronize()
        right = torch.equal(out.cpu().double(), x.double() * y.double() + z.double())
    except RuntimeError as exc:  # CUDA errors surface as RuntimeError (torch.AcceleratorError) too
        print(f"REJECTED {' '.join(str(exc).split())[:300]}")
        return
    print(f"ACCEPTED: returned {out.dtype}{list(out.shape)} on {out.device}, right values: {right}")


def main() -> int:
    if sys.argv[1:2] == ["--run"]:
        child(sys.argv[2])
        return 0
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA device (nothing was checked)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        example = tuple(torch.ones(4, 32, device="cuda") for _ in range(3))
        exported = torch.export.export(AddMul(), example)
        path = torch._inductor.aoti_compile_and_package(exported, package_path=os.path.join(tmp, "m.pt2"))
        said = {}
        for mode in ("default", "checked"):
            env = {k: v for k, v in os.environ.items() if k != "AOTI_RUNTIME_CHECK_INPUTS"}
            env.update({"AOTI_RUNTIME_CHECK_INPUTS": "1"} if mode == "checked" else {})
            call = [sys.executable, __file__, "--run", path]
            done = subprocess.run(call, env=env, capture_output=True, text=True)
            line = next((s for s in done.stdout.splitlines() if s.startswith(("ACC", "REJ"))), "")
            said[mode] = line or f"CRASHED: exit code {done.returncode}"
            print(f"{mode:8} host inputs to a CUDA model -> {said[mode]}")

    def about_device(line: str) -> bool:
        return line.startswith("REJECTED") and all(w in line.lower() for w in DEVICE_WORDS)

    ok = not about_device(said["default"]) and not about_device(said["checked"])
    print("reproduced" if ok else "NOT reproduced: PyTorch's behaviour changed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
