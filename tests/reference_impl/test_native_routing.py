"""CPU-side self-tests of routing compiled programs to another ``mm_out`` symbol (proved end to end on a CPU
package: a routed program calls a library's symbol, an unrouted one keeps libtorch's).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from reference_impl.shims.native import routing
from tests.reference_impl.native_support import CXX, TORCH_INCLUDE

# ------------------------------------------------------------------------------------------- routing

CPU_OLD, CPU_NEW = "aoti_torch_cpu_mm_out", "refimpl_cpu_mm_out_v1"  # same length, like the CUDA pair


class _MatMulPlusOne(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b) + 1


@pytest.fixture(scope="module")
def cpu_package(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A CPU AOTInductor package whose code calls ``aoti_torch_cpu_mm_out`` once per run."""
    if CXX is None:
        pytest.skip("needs g++ to compile an AOTInductor package")
    from reference_impl.lowering.preprocess import compile_artifact

    exported = torch.export.export(_MatMulPlusOne(), (torch.randn(8, 8), torch.randn(8, 8)))
    artifact = compile_artifact(exported, device=torch.device("cpu"), cxx=CXX)
    if routing.count_call_sites(artifact, CPU_OLD) != 1:
        pytest.skip("inductor generated its own GEMM here: no aoti_torch_cpu_mm_out call to route")
    return artifact


@pytest.fixture(scope="module")
def forwarder(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """A library defining the routed CPU name (forwarding to libtorch's kernel) with a call counter."""
    if CXX is None:
        pytest.skip("needs g++")
    folder = tmp_path_factory.mktemp("forwarder")
    source = folder / "forward.cpp"
    source.write_text(
        "#include <torch/csrc/inductor/aoti_torch/c/shim.h>\n#include <atomic>\n"
        f'extern "C" AOTITorchError {CPU_OLD}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle);\n'
        "static std::atomic<unsigned long long> calls{0};\n"
        '#define EXPORT extern "C" __attribute__((visibility("default")))\n'
        f"EXPORT AOTITorchError {CPU_NEW}(AtenTensorHandle o, AtenTensorHandle s, AtenTensorHandle m)"
        f" {{ ++calls; return {CPU_OLD}(o, s, m); }}\n"
        "EXPORT unsigned long long forward_calls() { return calls; }\n"
    )
    lib = folder / "libforward.so"
    torch_lib = Path(torch.__file__).parent / "lib"
    command = [CXX, "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]
    command += ["-isystem", str(TORCH_INCLUDE), str(source), "-o", str(lib), f"-L{torch_lib}", "-ltorch_cpu"]
    command += [f"-Wl,-rpath,{torch_lib}", "-Wl,--no-undefined"]
    subprocess.run(command, check=True, capture_output=True)
    cdll = ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    cdll.forward_calls.restype = ctypes.c_ulonglong
    return cdll


def _run(package: bytes, tmp_path: Path, name: str) -> torch.Tensor:
    from reference_impl.format.package_loader import load_package_fast

    path = tmp_path / name
    path.write_bytes(package)
    a = torch.arange(64, dtype=torch.float32).reshape(8, 8) / 7
    result = load_package_fast(path).run([a, a.t()])[0]
    assert torch.allclose(result, a @ a.t() + 1)
    return result


@pytest.mark.proof
def test_routed_package_changes_only_the_symbol_and_crcs(cpu_package: bytes) -> None:
    routed = routing.route_package(cpu_package, CPU_OLD, CPU_NEW)
    assert len(routed.patched_members) == 1
    assert routed.call_sites == 1
    assert len(routed.package) == len(cpu_package)
    changed = sum(a != b for a, b in zip(cpu_package, routed.package, strict=True))
    assert 0 < changed <= len(CPU_OLD) + 3 * 4, "the name's bytes and the CRC fields, nothing else"
    with zipfile.ZipFile(__import__("io").BytesIO(routed.package)) as archive:
        assert archive.testzip() is None
    again = routing.route_package(cpu_package, CPU_OLD, CPU_NEW)
    assert again.package == routed.package, "deterministic: routing is a pure function of the artifact"
    assert routing.route_package(routed.package, CPU_OLD, CPU_NEW).patched_members == (), "idempotent"


@pytest.mark.proof
def test_routed_program_fails_to_load_without_the_provider(cpu_package: bytes, tmp_path: Path) -> None:
    routed = routing.route_package(cpu_package, CPU_OLD, CPU_NEW).package
    # Runs before the forwarder fixture in this module's order; skip if some other test loaded it first.
    if _defined_in_process(CPU_NEW):
        pytest.skip("the provider is already loaded in this process")
    with pytest.raises(Exception, match=f"undefined symbol: {CPU_NEW}"):
        _run(routed, tmp_path, "routed.pt2")


def _defined_in_process(symbol: str) -> bool:
    try:
        getattr(ctypes.CDLL(None), symbol)
    except AttributeError:
        return False
    return True


@pytest.mark.proof
def test_routed_program_calls_the_provider_and_unrouted_keeps_libtorch(
    cpu_package: bytes, forwarder: ctypes.CDLL, tmp_path: Path
) -> None:
    routed = routing.route_package(cpu_package, CPU_OLD, CPU_NEW).package
    before = forwarder.forward_calls()
    _run(routed, tmp_path, "routed.pt2")
    _run(routed, tmp_path, "routed2.pt2")
    assert forwarder.forward_calls() - before == 2, "each run of the routed program called the provider once"
    before = forwarder.forward_calls()
    _run(cpu_package, tmp_path, "plain.pt2")
    assert forwarder.forward_calls() == before, "an unrouted program keeps libtorch's kernel"


def test_rename_refuses_a_defined_symbol(forwarder: ctypes.CDLL) -> None:
    library = Path(forwarder._name).read_bytes()
    with pytest.raises(routing.RoutingError, match="defines"):
        routing.rename_undefined_symbol(library, CPU_NEW, CPU_OLD)
    renamed, count = routing.rename_undefined_symbol(library, CPU_OLD, "x" * len(CPU_OLD))
    assert count == 1
    assert b"x" * len(CPU_OLD) in renamed
    assert routing.rename_undefined_symbol(library, "not_referenced_at_all", "n" * 21) == (library, 0)
    with pytest.raises(routing.RoutingError, match="as long as"):
        routing.rename_undefined_symbol(library, CPU_OLD, "short")


def test_rename_rejects_non_elf_and_compressed_members() -> None:
    with pytest.raises(routing.RoutingError, match="not an ELF"):
        routing.rename_undefined_symbol(b"MZ not elf", CPU_OLD, CPU_NEW)
    buffer = __import__("io").BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("m/data/aotinductor/model/x.so", b"\x7fELF" + b"\0" * 100)
    with pytest.raises(routing.RoutingError, match="compressed"):
        routing.route_package(buffer.getvalue())
    with pytest.raises(routing.RoutingError, match="not a zip"):
        routing.route_package(b"nope")


@pytest.mark.proof  # a real AOTInductor compile (``cpu_package``): 63 s of the fast tier on two cores
def test_apply_route_policy_on_this_machine(cpu_package: bytes) -> None:
    same, record = routing.apply_route(cpu_package, "cpu", None)
    assert same == cpu_package
    assert record["provider"] == "libtorch"
    assert "CUDA only" in record["reason"]
    same, record = routing.apply_route(cpu_package, "cuda", False)
    assert same == cpu_package
    assert record == {"provider": "libtorch", "reason": "native_mm_out=False"}
    if not torch.cuda.is_available():
        same, record = routing.apply_route(cpu_package, "cuda", None)
        assert same == cpu_package
        assert record["provider"] == "libtorch"
        assert "not built" in str(record["reason"])
        with pytest.raises(routing.RoutingError, match="native_mm_out=True"):
            routing.apply_route(cpu_package, "cuda", True)


def test_call_sites_ignore_comments_and_strings() -> None:
    buffer = __import__("io").BytesIO()
    code = (
        "// aoti_torch_cuda_mm_out(a, b, c);\n"
        'const char* s = "aoti_torch_cuda_mm_out(";\n'
        "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda_mm_out(buf0, x, y));\n"
        "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda_mm_out (buf1, x, y));\n"
        "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda_addmm_out(buf2, b, x, y, 1, 1));\n"
    )
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("m/data/aotinductor/model/w.wrapper.cpp", code)
    assert routing.count_call_sites(buffer.getvalue()) == 2
