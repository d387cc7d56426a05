"""The adapter's package cache (``torch_aoti/package_cache.py``): one compile per program, keyed by what
decides the compiled bytes, whole entries only."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

import torch_aoti.backend as adapter
from torch_aoti.package_cache import PackageCache, package_key


class Scale(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = torch.nn.Parameter(torch.full((4,), factor))
        # A 0-dim buffer, as Whisper's has: its bytes are keyed too (a view as bytes needs a dimension).
        self.register_buffer("offset", torch.tensor(0.0, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor + self.offset.float()


def _exported(
    factor: float = 2.0, shape: tuple[int, ...] = (3, 4), offset: float = 0.0
) -> torch.export.ExportedProgram:
    module = Scale(factor)
    module.offset.fill_(offset)
    return torch.export.export(module, (torch.ones(shape),))


def test_the_key_follows_what_decides_the_compiled_bytes() -> None:
    base = package_key({"forward": _exported()}, "cpu", adapter.INDUCTOR_OPTIONS)
    assert package_key({"forward": _exported()}, "cpu", adapter.INDUCTOR_OPTIONS) == base  # deterministic
    different = [
        package_key({"forward": _exported(3.0)}, "cpu", adapter.INDUCTOR_OPTIONS),  # another weight
        package_key({"forward": _exported(offset=1.0)}, "cpu", adapter.INDUCTOR_OPTIONS),  # a 0-dim buffer
        package_key({"forward": _exported(shape=(5, 4))}, "cpu", adapter.INDUCTOR_OPTIONS),  # example shape
        package_key({"other": _exported()}, "cpu", adapter.INDUCTOR_OPTIONS),  # the method's name
        package_key({"forward": _exported()}, "cuda", adapter.INDUCTOR_OPTIONS),  # the device
        package_key({"forward": _exported()}, "cpu", {**adapter.INDUCTOR_OPTIONS, "max_autotune": True}),
    ]
    assert base not in different
    assert len(set(different)) == len(different)


def test_a_key_is_built_once_and_a_damaged_entry_is_built_again(tmp_path: Path) -> None:
    cache, builds = PackageCache(tmp_path), []

    def build() -> bytes:
        builds.append(1)
        return b"package %d" % len(builds)

    assert cache.get_or_build("k", build) == (b"package 1", False)
    assert cache.get_or_build("k", build) == (b"package 1", True)
    (tmp_path / "k.pt2").write_bytes(b"package 1, cut")  # a damaged file is never handed out
    assert cache.get_or_build("k", build) == (b"package 2", False)

    def fails() -> bytes:
        raise ValueError("no compile")

    with pytest.raises(ValueError, match="no compile"):
        cache.get_or_build("other", fails)
    assert not (tmp_path / "other.pt2").exists()


def test_concurrent_builders_of_one_key_compile_once(tmp_path: Path) -> None:
    builds: list[int] = []

    def slow_build() -> bytes:
        builds.append(1)
        time.sleep(0.3)
        return b"the package"

    results: list[tuple[bytes, bool]] = []
    threads = [
        threading.Thread(target=lambda: results.append(PackageCache(tmp_path).get_or_build("k", slow_build)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert sorted(results) == [(b"the package", False)] + [(b"the package", True)] * 3


@pytest.mark.proof  # a real AOTInductor compile: 36 s of the fast tier on two cores
def test_lower_compiles_a_program_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The same methods lowered twice (another process, or the other check mode): one real compile, the same
    bytes; the package loads and runs."""
    monkeypatch.setenv("CONFORMANCE_CACHE_DIR", str(tmp_path))
    compiles: list[str] = []
    real = adapter.compile_method
    monkeypatch.setattr(adapter, "compile_method", lambda name, ep: compiles.append(name) or real(name, ep))
    methods = {"forward": (Scale(2.0), (torch.ones(3, 4),))}
    first = adapter.TorchAotiBackend(checked=False).lower(methods, device="cpu")
    second = adapter.TorchAotiBackend(checked=True).lower(methods, device="cpu")
    assert (first == second, compiles) == (True, ["forward"])
    backend = adapter.TorchAotiBackend(checked=False)
    handle = backend.init(second, "forward")
    (out,) = backend.execute(handle, [torch.full((3, 4), 3.0)])
    assert torch.equal(out, torch.full((3, 4), 6.0))
