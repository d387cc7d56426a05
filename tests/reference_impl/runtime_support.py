"""Shared by the runtime's self-tests (test_runtime on the CPU, test_runtime_cuda on a GPU, test_placement):
the toy model, its artifacts compiled once per toolchain and cached on disk, programs built from them, the
inputs and expected outputs, the options reset around each test and the thread hammer.

Artifacts are cached in ``$RUNTIME_TEST_ARTIFACTS`` (default ``/tmp/runtime-test-artifacts``); a file lock
keeps xdist workers from compiling the same artifact twice.
"""

from __future__ import annotations

import inspect
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._inductor
import torch.nn.attention
from torch import nn

from reference_impl.artifact_cache import ArtifactCache, make_key
from reference_impl.format.blob import pack_blob
from reference_impl.format.iospec import io_spec_from_exported_program
from reference_impl.format.program import build_program, program_to_bytes
from reference_impl.runtime import execute
from reference_impl.runtime import options as opts
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
CACHE = Path(os.environ.get("RUNTIME_TEST_ARTIFACTS", "/tmp/runtime-test-artifacts"))


# --- models ---------------------------------------------------------------------------------------------

COLS = 64
MAX_ROWS = 4096


class TwoOut(nn.Module):
    """x, y [rows, 64] → (x + y, 2x - y); rows dynamic in [1, 4096]."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x * 2.0 - y


def _two_out_export_args(device: str) -> tuple[nn.Module, tuple[Any, ...], Any]:
    rows = torch.export.Dim("rows", min=1, max=MAX_ROWS)
    example = (torch.randn(4, COLS, device=device), torch.randn(4, COLS, device=device))
    return TwoOut(), example, {"x": {0: rows}, "y": {0: rows}}


# --- artifact cache -------------------------------------------------------------------------------------


def _key(name: str, device: str) -> str:
    """What the artifact is built from (this file's toy model) and with (torch, CUDA, device)."""
    return make_key(
        {
            "model": inspect.getsource(TwoOut) + inspect.getsource(_two_out_export_args),
            "name": name,
            "device": device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "capability": torch.cuda.get_device_capability() if device == "cuda" else None,
        }
    )


def compiled_artifact(name: str, make: Callable[[str], Any], device: str) -> tuple[bytes, dict[str, Any]]:
    """(AOTInductor package bytes, io spec JSON) for one method, compiled at most once per toolchain."""
    module, example, dynamic = make(device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as folder, torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            package = Path(folder) / "artifact.pt2"  # the packager wants a name ending in .pt2
            torch._inductor.aoti_compile_and_package(ep, package_path=str(package))
            return package.read_bytes()

    # The project's content-addressed cache: atomic entries, per-key lock across xdist workers.
    artifact = ArtifactCache(CACHE).get_or_build(_key(name, device), build).data
    return artifact, io_spec_from_exported_program(ep).to_json()


def make_program(methods: dict[str, tuple[bytes, dict[str, Any] | None]], device: str) -> bytes:
    blobs = [
        (
            name,
            pack_blob(
                artifact,
                method_name=name,
                device=device,
                torch_version=torch.__version__,
                cuda_version=torch.version.cuda,
                extra={} if io is None else {"io": io},
            ),
        )
        for name, (artifact, io) in methods.items()
    ]
    return program_to_bytes(build_program(blobs))


# --- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _reset_options() -> Iterator[None]:
    opts.reset_options()
    yield
    opts.reset_options()


def _inputs(rows: int = 4, seed: int = 0, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, COLS, generator=g).to(device) for _ in range(2)]


def _expected(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    return [(x + y).cpu(), (x * 2.0 - y).cpu()]


def _assert_outputs(got: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
    assert len(got) == 2
    for g, e in zip(got, _expected(*inputs), strict=True):
        torch.testing.assert_close(g.cpu(), e)


def _hammer(handles: list, threads: int, per_thread: int, flip_options: bool, device: str) -> list[str]:
    errors: list[str] = []
    stop = threading.Event()

    def flipper() -> None:
        i = 0
        while not stop.is_set():
            opts.set_option(SKIP, ["forward", "", "other, forward", "other"][i % 4])
            i += 1
            time.sleep(0.0002)  # flip thousands of times a second without starving the workers of the GIL

    def worker(index: int) -> None:
        h = handles[index % len(handles)]
        try:
            for step in range(per_thread):
                rows = 1 + (index * 7 + step) % 9
                inputs = _inputs(rows, seed=index * 1000 + step, device=device if step % 2 else "cpu")
                out = execute(h, inputs)
                for got, want in zip(out, _expected(*inputs), strict=True):
                    if not torch.allclose(got.cpu(), want):
                        errors.append(f"thread {index} step {step}: wrong values")
                        return
        except Exception as exc:  # pragma: no cover - reported through the assertion
            errors.append(f"thread {index}: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    side = threading.Thread(target=flipper) if flip_options else None
    if side:
        side.start()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stop.set()
    if side:
        side.join()
    return errors


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
