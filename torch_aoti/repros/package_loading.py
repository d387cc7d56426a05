"""What ``torch._inductor.package.load_package`` accepts and how it words a refusal (torch 2.13 and 2.11).

    python torch_aoti/repros/package_loading.py [--device cuda]

Packages two models (``add``, ``mul``) into one ``.pt2`` with ``aot_compile`` + ``package_aoti`` (compiled
for the CPU, or for CUDA with ``--device cuda``) and loads damaged copies, each in a fresh process (a
damaged shared library may crash it):

* empty, truncated or random bytes: refused, but in miniz's words ("failed finding central directory",
  "not a ZIP archive"), which never say the file is truncated, empty or corrupt;
* the package with one zero byte appended: loaded (trailing data is not noticed);
* one byte flipped inside a model's ``.wrapper.so`` entry: loaded (entries' CRC-32 are not checked);
* model name ``""``: the loader matches the name as a path prefix, so a package of one model loads that model
  (a package of two is refused: "Multiple wrapper shared libraries found ... for model ''");
* model name ``ad`` (a proper prefix of ``add``) in the two-model package, and ``mul_ad`` in a package of
  ``mul_add`` and ``plus`` (the suite's ``test_method_names_match_exactly[prefix]``): torch 2.11 loads the
  model the name is a prefix of, torch 2.13 refuses it ("Failed to find a generated cpp file or so file for
  model 'ad'", seen on 2.13.0+cpu);
* CUDA only: one byte flipped inside a kernel's ``.cubin`` entry, if the package has one: loaded (the
  kernel is read at its first launch); what one call of the model then does is printed, not checked.

Exits 0 when all of this is seen (the prefix cases as expected for the running torch version); 1 otherwise
(PyTorch changed: update the known failures); 0 with "skipped" for ``--device cuda`` without CUDA.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import zipfile
from typing import NamedTuple

import torch
from _add_mul import (  # this directory: the script's own
    Expected,
    arguments,
    call,
    child_run,
    cuda_missing,
    expected,
    first_starting,
)

#: Words a refusal of damaged bytes would use to say what is wrong with them (miniz's never do).
WHY_WORDS = ("truncat", "corrupt", "empty", "invalid", "malformed")


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Mul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y


class Case(NamedTuple):
    data: bytes  # the file's bytes
    model: str  # the model name to load
    want: Expected  # the outcome expected (a line prefix, or a table keyed on torch's major.minor)
    damaged: bool = False  # damaged bytes: a refusal must not say what is wrong (miniz's words)
    call: bool = False  # after loading, call the model once and print what happens (not checked)


def load(path: str, model: str, device: str | None) -> None:
    """In the child: load ``model`` from ``path``; prints LOADED or REFUSED with the message, and with
    ``device`` what one call of the loaded model does (RAN, REJECTED or DEVICE-FAULT)."""
    from torch._inductor.package import load_package

    try:
        loaded = load_package(path, model_name=model)
    except RuntimeError as exc:
        print(f"REFUSED {str(exc).splitlines()[0]}", flush=True)
        return
    print("LOADED", flush=True)
    if device:
        x, y = torch.full((4, 32), 2.0), torch.full((4, 32), 3.0)
        verdict, out = call(loaded, [x.to(device), y.to(device)], device)
        if verdict == "ok":
            assert isinstance(out, torch.Tensor)
            verdict = f"RAN, x + y right: {torch.equal(out, x + y)}"
        print(f"then one call: {verdict} {'' if isinstance(out, torch.Tensor) else out}".rstrip(), flush=True)


def package(tmp: str, device: str) -> tuple[str, str, str]:
    """Three packages of the same compiled files (one compile per model): ``add`` and ``mul``, ``add``
    alone, and the suite's names ``mul_add`` (add) and ``plus`` (mul)."""
    from torch._inductor.package import package_aoti

    example = (torch.ones(4, 32, device=device), torch.ones(4, 32, device=device))
    files = {}
    for name, module in (("add", Add()), ("mul", Mul())):
        ep = torch.export.export(module, example)
        options = {"aot_inductor.package": True}
        files[name] = torch._inductor.aot_compile(ep.module(), example, options=options)
    two, one, named = (os.path.join(tmp, f"{n}.pt2") for n in ("two", "one", "named"))
    package_aoti(two, files)
    package_aoti(one, {"add": files["add"]})
    package_aoti(named, {"mul_add": files["add"], "plus": files["mul"]})
    return two, one, named


def flipped(data: bytes, archive: zipfile.ZipFile, suffix: str) -> tuple[bytes, str] | None:
    """``data`` with the middle byte of add's first member ending in ``suffix`` flipped, and that member's
    name; None when the package has no such member."""
    entry = next(
        (i for i in archive.infolist() if "/add/" in i.filename and i.filename.endswith(suffix)), None
    )
    if entry is None:
        return None
    # The member's data starts after its local header, whose name and extra field (torch pads it to align
    # the data) have their own lengths, which the central directory's entry does not give.
    name_len, extra_len = struct.unpack("<HH", data[entry.header_offset + 26 : entry.header_offset + 30])
    flip_at = entry.header_offset + 30 + name_len + extra_len + entry.compress_size // 2
    return data[:flip_at] + bytes([data[flip_at] ^ 0xFF]) + data[flip_at + 1 :], entry.filename


def damaged(two: str, single: str, named: str, device: str) -> dict[str, Case]:
    """case → what to load and what is expected."""
    with open(two, "rb") as f:
        data = f.read()
    with open(single, "rb") as f:
        one_model = f.read()
    with open(named, "rb") as f:
        suite_names = f.read()
    with zipfile.ZipFile(two) as archive:
        so = flipped(data, archive, ".wrapper.so")
        cubin = flipped(data, archive, ".cubin") if device == "cuda" else None
    assert so is not None, "no .wrapper.so member for add"
    prefix = {"2.11": "LOADED", "2.13": "REFUSED"}  # 2.11 matches the name as a path prefix
    cases = {
        "empty": Case(b"", "add", "REFUSED", damaged=True),
        "truncated to half": Case(data[: len(data) // 2], "add", "REFUSED", damaged=True),
        "random bytes": Case(os.urandom(4096), "add", "REFUSED", damaged=True),
        "one zero byte appended": Case(data + b"\0", "add", "LOADED"),
        "a byte of add's .so flipped": Case(so[0], "add", "LOADED"),
        "model name '', one model": Case(one_model, "", "LOADED"),
        # torch 2.11 loads one of the two (seen on the GPU image, 2026-11-26); 2.13 refuses the ambiguity.
        "model name '', two models": Case(data, "", {"2.11": "LOADED", "2.13": "REFUSED Multiple"}),
        "model name 'ad', two models": Case(data, "ad", prefix),
        "'mul_ad', mul_add and plus": Case(suite_names, "mul_ad", prefix),
    }
    if device == "cuda":
        if cubin is None:
            print("(no .cubin member for add in the CUDA package: the .cubin case is not run)")
        else:
            print(f"(the .cubin flipped: {cubin[1]})")
            cases["a byte of add's .cubin flipped"] = Case(cubin[0], "add", "LOADED", call=True)
    return cases


def main() -> int:
    if sys.argv[1:2] == ["--load"]:
        load(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
        return 0
    device = arguments(__doc__, child=False).device
    if cuda_missing(device):
        return 0
    print(f"device {device}, torch {torch.__version__}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in damaged(*package(tmp, device), device).items():
            path = os.path.join(tmp, "case.pt2")
            with open(path, "wb") as f:
                f.write(case.data)
            command = [sys.executable, __file__, "--load", path, case.model, *([device] if case.call else [])]
            lines, _stderr, died = child_run(command)
            line = first_starting(lines, ("LOADED", "REFUSED"), died)
            prefixes, want = expected(case.want)
            seen = line.startswith(prefixes)
            if case.damaged and line.startswith("REFUSED"):  # the refusal never says what is wrong
                seen &= not any(w in line.lower() for w in WHY_WORDS)
            print(f"{'ok' if seen else 'UNEXPECTED':10} {name:30} -> {line[:200]}  [expected {want}]")
            if case.call:
                ran = next((s for s in lines if s.startswith("then one call")), f"then one call: {died}")
                print(f"{'':10} {'':30}    {ran}  [observed, not checked]")
            ok &= seen
    print("reproduced" if ok else "NOT reproduced: PyTorch's behaviour changed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
