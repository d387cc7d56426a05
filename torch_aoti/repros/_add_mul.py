"""What the add-mul repros share: ``x * y + z`` on three float32 [4, 32] inputs, packaged with
``aoti_compile_and_package``, called once per case in a fresh process as deployed
(``AOTI_RUNTIME_CHECK_INPUTS`` unset) and once with ``AOTI_RUNTIME_CHECK_INPUTS=1``. Torch only, like the
scripts that use it (each runs as ``python torch_aoti/repros/X.py [--device cuda]``: this directory is on
its path).

``--device cuda`` exports the model with CUDA example inputs; the child builds each case's inputs on the
host as on the CPU, copies each tensor to the device with its sizes and strides (what a deployment's copy
does; ``Tensor.to`` would make a step slice contiguous), calls the model and synchronises inside the same
``try``, so an asynchronous CUDA error is seen as ``DEVICE-FAULT``. Results are compared on the host.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

import torch

Inputs = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list[torch.Tensor]]
#: An outcome: the prefix of the child's line (ACCEPTED, REJECTED, DEVICE-FAULT, CRASHED, ...), or several
#: of them, any of which is the expected one.
Outcome = str | tuple[str, ...]
#: An outcome, or a table of them keyed on torch's major.minor version (see ``for_this_torch``).
Expected = Outcome | dict[str, Outcome]
#: case -> (the inputs from good x, y, z; the outcome as deployed; the outcome with checks on)
Cases = dict[str, tuple[Inputs, Expected, Expected]]

#: A child's call that does not end within this many seconds is reported as TIMEOUT.
CHILD_TIMEOUT_S = 300


class AddMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x * y + z


def torch_minor(version: str = torch.__version__) -> tuple[int, int]:
    """``(2, 11)`` for ``2.11.0+cu130``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def for_this_torch(table: dict[str, Outcome]) -> tuple[str, Outcome]:
    """The entry of ``table`` (keyed ``"2.11"``, ``"2.13"``, ...) for the running torch, with its key: its
    own version's, else the newest older version's, else the oldest one's (an unlisted version is assumed
    to behave like its nearest listed predecessor; the key printed with the outcome says which was used)."""
    keys = sorted(table, key=torch_minor)
    older = [k for k in keys if torch_minor(k) <= torch_minor()]
    key = older[-1] if older else keys[0]
    return key, table[key]


def expected(want: Expected) -> tuple[tuple[str, ...], str]:
    """The accepted line prefixes of ``want`` for the running torch, and how to print them."""
    note = ""
    if isinstance(want, dict):
        key, want = for_this_torch(want)
        note = f" (torch {key})"
    prefixes = (want,) if isinstance(want, str) else tuple(want)
    return prefixes, " or ".join(prefixes) + note


def device_fault(exc: BaseException) -> bool:
    """A CUDA error (``torch.AcceleratorError``, missing in some versions, or a RuntimeError saying so)."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and "CUDA error" in str(exc)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def same_layout_on(tensor: object, device: str) -> object:
    """``tensor`` copied to ``device`` with its sizes and strides (a non-tensor as it is). A tensor whose
    elements share memory (an expanded one) cannot be written with its strides: ``Tensor.to``."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == device:
        return tensor
    try:
        placed = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
        return placed.copy_(tensor)
    except RuntimeError:  # "some elements of the written-to tensor refer to a single memory location"
        return tensor.to(device)


def call(model: Callable[..., object], inputs: list[object], device: str) -> tuple[str, object]:
    """One call, synchronised on CUDA: ``("ok", output on the host)``, ``("DEVICE-FAULT", line)`` or
    ``("REJECTED", line)`` (any other exception propagates: the child dies, CRASHED)."""
    try:
        out = model(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        host = out.cpu() if isinstance(out, torch.Tensor) else [t.cpu() for t in out]
    except RuntimeError as exc:  # torch.AcceleratorError is a RuntimeError
        return ("DEVICE-FAULT" if device_fault(exc) else "REJECTED"), first_line(exc)
    return "ok", host


def run(cases: Cases, path: str, case: str, device: str, *, of_inputs: bool = False) -> None:
    """In the child: one call with the case's inputs; prints ACCEPTED, REJECTED or DEVICE-FAULT (a crash
    prints nothing). An accepted call is compared with x * y + z of the good inputs, or with ``of_inputs``
    of its own (inputs of another valid size)."""
    model = torch._inductor.aoti_load_package(path)
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randint(-8, 9, (4, 32), generator=gen).float() for _ in range(3))
    inputs = cases[case][0](x, y, z)  # on the host, as the case makes them
    verdict, out = call(model, [same_layout_on(t, device) for t in inputs], device)
    if verdict != "ok":
        print(f"{verdict} {out}", flush=True)
        return
    assert isinstance(out, torch.Tensor)
    a, b, c = (t.double() for t in (inputs if of_inputs else (x, y, z)))
    which = "its inputs" if of_inputs else "the good inputs"
    print(
        f"ACCEPTED: returned {out.dtype}{list(out.shape)}, equal to x * y + z of {which}: "
        f"{torch.equal(out.double(), a * b + c)}",
        flush=True,
    )


def child_run(command: list[str], env: dict[str, str] | None = None) -> tuple[list[str], str, str]:
    """One child process: its stdout lines, its stderr, and how it ended when it printed no verdict
    (``CRASHED: exit code N``, or ``TIMEOUT after ...`` when it outlived ``CHILD_TIMEOUT_S``)."""
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [], "", f"TIMEOUT after {CHILD_TIMEOUT_S} s"
    return done.stdout.splitlines(), done.stderr, f"CRASHED: exit code {done.returncode}"


def first_starting(lines: list[str], prefixes: tuple[str, ...], otherwise: str) -> str:
    """The first of ``lines`` starting with one of ``prefixes``, else ``otherwise``."""
    return next((s for s in lines if s.startswith(prefixes)), "") or otherwise


def child_line(command: list[str], env: dict[str, str], prefixes: tuple[str, ...]) -> str:
    """The child's first line starting with one of ``prefixes``, or CRASHED / TIMEOUT."""
    lines, _stderr, died = child_run(command, env)
    return first_starting(lines, prefixes, died)


def mode_env(mode: str) -> dict[str, str]:
    """This environment with ``AOTI_RUNTIME_CHECK_INPUTS=1`` for ``checked``, without it for ``default``."""
    env = {k: v for k, v in os.environ.items() if k != "AOTI_RUNTIME_CHECK_INPUTS"}
    env.update({"AOTI_RUNTIME_CHECK_INPUTS": "1"} if mode == "checked" else {})
    return env


def compare_modes(cases: Cases, script: str, device: str, dynamic_shapes: object = None) -> int:
    """The parent: the model exported (with ``dynamic_shapes``) on ``device`` and packaged once, each case
    called in a fresh process per mode; 0 when every outcome is the one the cases expect."""
    print(f"device {device}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        example = tuple(torch.ones(4, 32, device=device) for _ in range(3))
        exported = torch.export.export(AddMul(), example, dynamic_shapes=dynamic_shapes)
        package = os.path.join(tmp, "add_mul.pt2")
        path = torch._inductor.aoti_compile_and_package(exported, package_path=package)
        ok = True
        for column, mode in enumerate(("default", "checked"), start=1):
            for case in cases:
                child = [sys.executable, script, "--run", path, case, "--device", device]
                line = child_line(child, mode_env(mode), ("ACCEPTED", "REJECTED", "DEVICE-FAULT"))
                prefixes, want = expected(cases[case][column])
                seen = line.startswith(prefixes)
                print(f"{'ok' if seen else 'UNEXPECTED':10} {mode:8} {case:24} -> {line}  [expected {want}]")
                ok &= seen
    print("reproduced" if ok else "NOT reproduced: PyTorch's behaviour changed")
    return 0 if ok else 1


def arguments(doc: str | None = None, *, child: bool = True) -> argparse.Namespace:
    """``--device cpu|cuda`` (the model's device, cpu by default) and, with ``child``, the child's
    ``--run PATH CASE``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="the model's device")
    if child:
        parser.add_argument("--run", nargs=2, metavar=("PATH", "CASE"), help="(the child: one call)")
    return parser.parse_args()


def cuda_missing(device: str) -> bool:
    """True (and the skip said) when ``device`` is cuda and this machine has none."""
    if device == "cuda" and not torch.cuda.is_available():
        print("skipped: --device cuda needs a CUDA device (nothing was checked)")
        return True
    return False


def reproduce(cases: Cases, script: str, dynamic_shapes: object = None, *, of_inputs: bool = False) -> int:
    """The script's entry point: the parent compares the modes; ``--run PATH CASE`` is one child call."""
    args = arguments(sys.modules["__main__"].__doc__)
    if args.run:
        run(cases, *args.run, args.device, of_inputs=of_inputs)
        return 0
    if cuda_missing(args.device):
        return 0
    return compare_modes(cases, script, args.device, dynamic_shapes)
