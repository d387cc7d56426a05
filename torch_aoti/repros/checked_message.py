"""Where the checked runner's refusal puts its words: torch 2.11 prints them on stderr and raises only
"run_func_(...) API call failed"; torch 2.13 puts them in the exception (and on stderr).

    python torch_aoti/repros/checked_message.py [--device cuda]

Exports ``x * y + z`` on three float32 [4, 32] inputs (on ``--device``, cpu by default), packages it with
``aoti_compile_and_package`` and calls it in a fresh process with ``AOTI_RUNTIME_CHECK_INPUTS=1`` and ``y``
as float64, the child's stderr captured. Observed: whether the exception's text names the dtype, and
whether the child's stderr has the check's words ("unmatched dtype"). On a CPU model, when this machine has
a CUDA device, a second case gives ``y`` as a CUDA tensor ("unmatched device type"; the suite's
``test_cuda_tensor_to_cpu_program``).

What each torch version does is the table ``EXPECTED`` below (keyed on major.minor; a version not in it is
taken to behave as the nearest older one listed). Exits 0 when what is seen is what that table says for the
running torch ("reproduced"), whether or not that version has the defect; 1 otherwise (PyTorch changed:
update the table and the known failures); 0 with "skipped" for ``--device cuda`` without CUDA.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
from _add_mul import (  # this directory: the script's own
    AddMul,
    arguments,
    child_run,
    cuda_missing,
    device_fault,
    first_starting,
    for_this_torch,
    mode_env,
    same_layout_on,
)

#: case -> (the word the exception should use, the check's words printed on stderr by torch 2.11)
CASES = {
    "y as float64": ("dtype", "unmatched dtype"),
    "y on cuda, cpu model": ("device", "unmatched device type"),
}

#: torch major.minor -> case -> (the exception names it, the child's stderr has the check's words).
EXPECTED: dict[str, dict[str, tuple[bool, bool]]] = {
    # Seen on the GPU image (2.11.0+cu130), CPU and CUDA models, in the suite's checked run of 2026-11-26:
    # the words on stderr only, the exception "run_func_(...) API call failed at ...".
    "2.11": {"y as float64": (False, True), "y on cuda, cpu model": (False, True)},
    # Seen on 2.13.0+cpu: the check's words are the exception's, and printed on stderr too ("Error: ...").
    # The device case needs CUDA, not yet seen on 2.13: assumed to behave as the dtype case.
    "2.13": {"y as float64": (True, True), "y on cuda, cpu model": (True, True)},
}


def child(path: str, case: str, device: str) -> None:
    """One checked call; prints REJECTED (or DEVICE-FAULT) with the whole exception text on one line, or
    ACCEPTED."""
    model = torch._inductor.aoti_load_package(path)
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randint(-8, 9, (4, 32), generator=gen).float() for _ in range(3))
    if case == "y as float64":
        inputs = [same_layout_on(t, device) for t in (x, y.double(), z)]
    else:  # a CUDA tensor for the CPU model
        inputs = [x, y.cuda(), z]
    try:
        model(*inputs)
        if any(t.is_cuda for t in inputs):
            torch.cuda.synchronize()
    except RuntimeError as exc:
        verdict = "DEVICE-FAULT" if device_fault(exc) else "REJECTED"
        print(f"{verdict} {' '.join(str(exc).split())}", flush=True)
        return
    print("ACCEPTED", flush=True)


def observe(path: str, case: str, device: str) -> tuple[str, bool, bool]:
    """The child's line, whether it names the case's word, whether its stderr has the check's words."""
    word, words = CASES[case]
    command = [sys.executable, __file__, "--run", path, case, "--device", device]
    lines, stderr, died = child_run(command, mode_env("checked"))
    line = first_starting(lines, ("ACCEPTED", "REJECTED", "DEVICE-FAULT"), died)
    return line, line.startswith("REJECTED") and word in line.lower(), words in stderr


def main() -> int:
    args = arguments(__doc__)
    if args.run:
        child(*args.run, args.device)
        return 0
    if cuda_missing(args.device):
        return 0
    key, table = for_this_torch(EXPECTED)
    print(f"device {args.device}, torch {torch.__version__} (expected: the table's torch {key})")
    cases = ["y as float64"]
    if args.device == "cpu" and torch.cuda.is_available():
        cases.append("y on cuda, cpu model")
    else:
        print("(case 'y on cuda, cpu model' not run: it needs a CPU model on a machine with CUDA)")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        example = tuple(torch.ones(4, 32, device=args.device) for _ in range(3))
        exported = torch.export.export(AddMul(), example)
        package = os.path.join(tmp, "add_mul.pt2")
        path = torch._inductor.aoti_compile_and_package(exported, package_path=package)
        for case in cases:
            word, words = CASES[case]
            line, names, on_stderr = observe(path, case, args.device)
            want = table[case]
            seen = line.startswith("REJECTED") and (names, on_stderr) == want
            print(f"{'ok' if seen else 'UNEXPECTED':10} checked  {case:22} -> {line[:200]}")
            print(
                f"{'':10} the exception names {word!r}: {names}; stderr has {words!r}: {on_stderr}"
                f"  [expected {want[0]}, {want[1]}]"
            )
            ok &= seen
    defect = not all(table[case][0] for case in cases)
    if ok:
        where = "on stderr only" if defect else "in the exception"
        print(f"reproduced: as recorded for torch {key}, the check's words are {where}")
        return 0
    print("NOT reproduced: PyTorch's behaviour changed (update EXPECTED and the known failures)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
