"""PyTorch's AOTI runner takes host tensors given to a CUDA model as device memory, in either mode: why the
adapter copies the protocol's host inputs to the device itself (``stage_inputs``). And the mirror: a CUDA
tensor given to a CPU model (the suite's ``test_cuda_tensor_to_cpu_program``), observed.

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

The mirror, printed and not checked (it does not change the exit code): the same model exported for the
CPU, called with ``y`` on the CUDA device (x and z on the host), in both modes, with whether the child's
stderr has the generated check's words ("unmatched device type"). Expected from the triage of 2026-11-26:
as deployed the CPU kernel reads a device pointer (a crash or garbage); checked, refused, the words in the
exception on torch 2.13 and on stderr only on 2.11 (``checked_message.py`` checks that part).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
from _add_mul import (  # this directory: the script's own
    AddMul,
    child_run,
    device_fault,
    first_starting,
    mode_env,
)

#: An error that says which device the inputs should be on names the device and what was expected.
DEVICE_WORDS = ("device", "expected")
#: What the generated check of a CPU model prints for a CUDA input (torch 2.11, on stderr).
CHECK_WORDS = "unmatched device type"


def child(path: str, mirror: bool) -> None:
    """One call: host inputs to the CUDA model, or (``mirror``) y on the device to the CPU model; prints
    ACCEPTED (and whether the values are right), REJECTED or DEVICE-FAULT."""
    model = torch._inductor.aoti_load_package(path)
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randint(-8, 9, (4, 32), generator=gen).float() for _ in range(3))
    try:
        out = model(x, y.cuda(), z) if mirror else model(x, y, z)
        torch.cuda.synchronize()
        right = torch.equal(out.cpu().double(), x.double() * y.double() + z.double())
    except RuntimeError as exc:  # CUDA errors surface as RuntimeError (torch.AcceleratorError) too
        verdict = "DEVICE-FAULT" if device_fault(exc) else "REJECTED"
        print(f"{verdict} {' '.join(str(exc).split())[:300]}", flush=True)
        return
    print(
        f"ACCEPTED: returned {out.dtype}{list(out.shape)} on {out.device}, right values: {right}", flush=True
    )


def called(path: str, mode: str, mirror: bool) -> tuple[str, str]:
    """The child's line (or CRASHED / TIMEOUT) and its stderr."""
    command = [sys.executable, __file__, "--run", path, *(["mirror"] if mirror else [])]
    lines, stderr, died = child_run(command, mode_env(mode))
    return first_starting(lines, ("ACC", "REJ", "DEVICE-FAULT"), died), stderr


def package(tmp: str, device: str) -> str:
    example = tuple(torch.ones(4, 32, device=device) for _ in range(3))
    exported = torch.export.export(AddMul(), example)
    return torch._inductor.aoti_compile_and_package(exported, package_path=os.path.join(tmp, f"{device}.pt2"))


def main() -> int:
    if sys.argv[1:2] == ["--run"]:
        child(sys.argv[2], sys.argv[3:4] == ["mirror"])
        return 0
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA device (nothing was checked)")
        return 0
    print(f"torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        path = package(tmp, "cuda")
        said = {}
        for mode in ("default", "checked"):
            said[mode] = called(path, mode, mirror=False)[0]
            print(f"{mode:8} host inputs to a CUDA model -> {said[mode]}")
        path = package(tmp, "cpu")
        for mode in ("default", "checked"):
            line, stderr = called(path, mode, mirror=True)
            print(f"{mode:8} y on cuda to a CPU model   -> {line}  [observed, not checked]")
            print(f"{'':8} {'':28}    its stderr has {CHECK_WORDS!r}: {CHECK_WORDS in stderr}")

    def about_device(line: str) -> bool:
        return line.startswith("REJECTED") and all(w in line.lower() for w in DEVICE_WORDS)

    ok = not about_device(said["default"]) and not about_device(said["checked"])
    print("reproduced" if ok else "NOT reproduced: PyTorch's behaviour changed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
