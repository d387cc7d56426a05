"""What ``torch._inductor.package.load_package`` accepts and how it words a refusal (torch 2.13, CPU).

    python torch_aoti/repros/package_loading.py

Packages two models (``add``, ``mul``) into one ``.pt2`` with ``aot_compile`` + ``package_aoti`` and loads
damaged copies, each in a fresh process (a damaged shared library may crash it):

* empty, truncated or random bytes: refused, but in miniz's words ("failed finding central directory",
  "not a ZIP archive"), which never say the file is truncated, empty or corrupt;
* the package with one zero byte appended: loaded (trailing data is not noticed);
* one byte flipped inside a model's ``.wrapper.so`` entry: loaded (entries' CRC-32 are not checked);
* model name ``""``: the loader matches the name as a path prefix, so a package of one model loads that model
  (a package of two is refused: "Multiple wrapper shared libraries found ... for model ''").

Exits 0 when all of this is seen; 1 otherwise (PyTorch changed: update the known failures).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile

import torch


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Mul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y


def load(path: str, model: str) -> None:
    """In the child: load ``model`` from ``path``; prints LOADED or REFUSED with the message."""
    from torch._inductor.package import load_package

    try:
        load_package(path, model_name=model)
    except RuntimeError as exc:
        print(f"REFUSED {str(exc).splitlines()[0]}")
        return
    print("LOADED")


def package(tmp: str) -> tuple[str, str]:
    """Two packages of the same compiled files: ``add`` and ``mul``, and ``add`` alone."""
    from torch._inductor.package import package_aoti

    example = (torch.ones(4, 32), torch.ones(4, 32))
    files = {}
    for name, module in (("add", Add()), ("mul", Mul())):
        ep = torch.export.export(module, example)
        options = {"aot_inductor.package": True}
        files[name] = torch._inductor.aot_compile(ep.module(), example, options=options)
    two, one = os.path.join(tmp, "two.pt2"), os.path.join(tmp, "one.pt2")
    package_aoti(two, files)
    package_aoti(one, {"add": files["add"]})
    return two, one


def damaged(path: str, single: str) -> dict[str, tuple[bytes, str, str]]:
    """case → (the file's bytes, the model name to load, the outcome expected)."""
    with open(path, "rb") as f:
        data = f.read()
    with open(single, "rb") as f:
        one_model = f.read()
    with zipfile.ZipFile(path) as archive:
        entry = next(i for i in archive.infolist() if i.filename.endswith(".wrapper.so"))
    # The middle of the shared library's data (stored uncompressed): well past its local header.
    flip_at = entry.header_offset + 30 + len(entry.filename) + entry.file_size // 2
    flipped = data[:flip_at] + bytes([data[flip_at] ^ 0xFF]) + data[flip_at + 1 :]
    return {
        "empty": (b"", "add", "REFUSED"),
        "truncated to half": (data[: len(data) // 2], "add", "REFUSED"),
        "random bytes": (os.urandom(4096), "add", "REFUSED"),
        "one zero byte appended": (data + b"\0", "add", "LOADED"),
        "a byte of add's .so flipped": (flipped, "add", "LOADED"),
        "model name '', one model": (one_model, "", "LOADED"),
        "model name '', two models": (data, "", "REFUSED Multiple"),
    }


def main() -> int:
    words = ("truncat", "corrupt", "empty", "invalid", "malformed")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for case, (data, model, want) in damaged(*package(tmp)).items():
            path = os.path.join(tmp, "case.pt2")
            with open(path, "wb") as f:
                f.write(data)
            done = subprocess.run(
                [sys.executable, __file__, "--load", path, model], capture_output=True, text=True
            )
            line = next((s for s in done.stdout.splitlines() if s.startswith(("LOADED", "REFUSED"))), "")
            line = line or f"CRASHED: exit code {done.returncode}"
            print(f"{case:30} -> {line}")
            ok &= line.startswith(want)
            if want == "REFUSED":  # a damaged file's refusal never says what is wrong with it
                ok &= not any(w in line.lower() for w in words)
    print("reproduced" if ok else "NOT reproduced: PyTorch's behaviour changed")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--load"]:
        load(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
