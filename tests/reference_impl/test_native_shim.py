"""CPU-side self-tests of the native ``mm_out`` shim: build skipped cleanly, key and cache logic and the C ABI
against torch's headers. The Python entry module is in test_native_entry.py, routing compiled programs to
another ``mm_out`` symbol in test_native_routing.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from reference_impl.shims.native import build, routing
from reference_impl.shims.native.build import BuildPlan, NativeBuildError
from tests.reference_impl.native_support import CXX, TORCH_INCLUDE, cpu_only, needs_cxx

SHIM_H = TORCH_INCLUDE / "torch/csrc/inductor/aoti_torch/c/shim.h"
C_SHIM_CUDA_H = TORCH_INCLUDE / "torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h"
SOURCE_TEXT = build.SOURCE.read_text()


# ----------------------------------------------------------------------------------------- the C ABI


def test_every_aoti_function_the_source_calls_is_declared_in_torch_headers() -> None:
    declared = set(re.findall(r"\b(aoti_torch_\w+)\s*\(", SHIM_H.read_text()))
    called = set(re.findall(r"\b(aoti_torch_\w+)\s*\(", SOURCE_TEXT)) - {"aoti_torch_cuda_mm_out"}
    assert called, "the source reads tensors through the AOTI C shim"
    assert called <= declared, f"not in shim.h: {sorted(called - declared)}"


def test_routed_entry_has_the_abi_of_aoti_torch_cuda_mm_out() -> None:
    decl = re.search(r"AOTITorchError aoti_torch_cuda_mm_out\(([^)]*)\)", C_SHIM_CUDA_H.read_text())
    ours = re.search(r"AOTITorchError refimpl_cuda_mm_out_v1\(([^)]*)\)", SOURCE_TEXT)
    assert decl
    assert ours

    def types(params: str) -> list[str]:
        return [" ".join(p.split()[:-1]) for p in params.split(",")]

    assert types(decl.group(1)) == types(ours.group(1)) == ["AtenTensorHandle"] * 3
    # ... and the compiler checks it too (static_assert against the generated header).
    assert "static_assert(std::is_same<decltype(&refimpl_cuda_mm_out_v1)" in SOURCE_TEXT
    assert len(routing.ROUTED_SYMBOL) == len(routing.ABI_SYMBOL)


def test_source_never_exports_the_abi_name_by_default() -> None:
    # Exported only under REFIMPL_EXPORT_AOTI_NAME: loaded RTLD_GLOBAL it would take over every program.
    body = SOURCE_TEXT.split("#ifdef REFIMPL_EXPORT_AOTI_NAME", 1)
    assert "REFIMPL_API AOTITorchError aoti_torch_cuda_mm_out" not in body[0]
    assert "REFIMPL_API AOTITorchError aoti_torch_cuda_mm_out" in body[1]


def test_error_rules_in_the_source_match_the_python_rules() -> None:
    from reference_impl.shims.errors import RULES

    used = set(re.findall(r'argument_error\([^,]+,\s*"([a-z0-9-]+)"', SOURCE_TEXT))
    used |= set(re.findall(r'check_size\(|"(size-limit)"', SOURCE_TEXT)) - {""}
    python_only = {"is-tensor"}  # the C ABI only sees handles; Python checks the type first
    assert used <= set(RULES)
    assert set(RULES) - used == python_only


def _cuda_include_dirs() -> list[str] | None:
    extra = [d for d in os.environ.get("REFIMPL_NATIVE_TEST_INCLUDE", "").split(os.pathsep) if d]
    try:
        return build.resolve_include_dirs([*extra, *build.candidate_include_dirs()])
    except NativeBuildError:
        return None


@needs_cxx
@pytest.mark.parametrize("defines", [[], ["-DREFIMPL_EXPORT_AOTI_NAME"]], ids=["default", "abi-name"])
def test_source_compiles_warning_free_against_real_headers(defines: list[str]) -> None:
    includes = _cuda_include_dirs()
    if includes is None:
        pytest.skip("no CUDA headers here (set REFIMPL_NATIVE_TEST_INCLUDE to CUDA include dirs)")
    flags = [f for f in build.FLAGS if f not in ("-shared", "-O2")]
    command = [CXX, *flags, *defines, "-fsyntax-only", "-isystem", str(TORCH_INCLUDE)]
    command += [arg for d in includes for arg in ("-isystem", d)] + [str(build.SOURCE)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# -------------------------------------------------------------------------------------- build, cache


@cpu_only
def test_build_is_skipped_cleanly_without_cuda(tmp_path: Path) -> None:
    status = build.build_library(cache=build.ArtifactCache(tmp_path), force=True)
    assert not status.available
    assert status.path is None
    assert "not built" in status.reason
    assert torch.__version__ in status.reason
    assert not any(tmp_path.rglob("*.bin")), "nothing is compiled on a CPU-only machine"


def test_disable_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.DISABLE_ENV_VAR, "1")
    status = build.build_library(force=True)
    assert not status.available
    assert build.DISABLE_ENV_VAR in status.reason
    monkeypatch.delenv(build.DISABLE_ENV_VAR)
    build.build_library(force=True)


@cpu_only
def test_cpu_machine_runs_the_python_path_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_impl.shims import path

    monkeypatch.delenv(path.PATH_ENV_VAR, raising=False)
    chosen, why = path.selected_path()
    assert chosen == "python"
    assert "native shim unavailable" in why
    assert "Python/ctypes" in path.describe_path()
    from reference_impl.shims.mm_out import mm_out

    assert path.mm_out_entry() is mm_out
    monkeypatch.setenv(path.PATH_ENV_VAR, "native")
    from reference_impl.shims.native.library import NativeUnavailableError

    with pytest.raises(NativeUnavailableError, match="unavailable"):
        path.selected_path()
    monkeypatch.setenv(path.PATH_ENV_VAR, "bogus")
    with pytest.raises(ValueError, match="auto, native, python"):
        path.selected_path()


def test_compiler_resolution_honours_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.CXX_ENV_VAR, "/opt/my/c++")
    assert build.resolve_compiler() == "/opt/my/c++"
    monkeypatch.delenv(build.CXX_ENV_VAR)
    monkeypatch.setenv("CXX", "/opt/other/g++")
    assert build.resolve_compiler() == "/opt/other/g++"
    monkeypatch.delenv("CXX")
    assert build.resolve_compiler().endswith("g++")


def test_include_resolution_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "cublas_v2.h").write_text("")
    with pytest.raises(NativeBuildError, match=r"cuda_runtime_api\.h.*searched"):
        build.resolve_include_dirs([str(tmp_path / "a")])
    (tmp_path / "b" / "crt").mkdir(parents=True)
    (tmp_path / "b" / "nv").mkdir()
    for name in ("cuda_runtime_api.h", "crt/host_defines.h", "nv/target"):
        (tmp_path / "b" / name).write_text("")
    dirs = build.resolve_include_dirs([str(tmp_path / "a"), str(tmp_path / "b")])
    assert dirs == [str(tmp_path / "a"), str(tmp_path / "b")]


def _plan(tmp_path: Path, source: Path, flags: tuple[str, ...] = build.FLAGS) -> BuildPlan:
    lib = tmp_path / "libcublas.so.13"
    lib.write_bytes(b"x")
    return BuildPlan(
        compiler=CXX or "g++",
        source=source,
        include_dirs=(str(TORCH_INCLUDE),),
        torch_lib_dir=str(tmp_path),
        libraries=(str(lib),),
        flags=flags,
    )


def test_key_follows_source_flags_and_libraries(tmp_path: Path) -> None:
    source = tmp_path / "mm_out.cpp"
    source.write_text("int x;")
    plan = _plan(tmp_path, source)
    key = build.library_key(plan)
    assert key == build.library_key(plan), "deterministic"
    source.write_text("int y;")
    assert build.library_key(plan) != key, "source content is in the key"
    source.write_text("int x;")
    assert build.library_key(plan) == key
    assert build.library_key(_plan(tmp_path, source, (*build.FLAGS, "-DX"))) != key, "flags are in the key"
    (tmp_path / "libcublas.so.13").write_bytes(b"longer")
    assert build.library_key(plan) != key, "a changed library is in the key"


def test_command_links_torch_cuda_libraries_and_forbids_undefined_symbols(tmp_path: Path) -> None:
    plan = _plan(tmp_path, build.SOURCE)
    command = plan.command("/out/lib.so")
    assert command[0] == plan.compiler
    assert "-Werror" in command
    assert "-fvisibility=hidden" in command
    assert ["-isystem", str(TORCH_INCLUDE)] == command[
        command.index("-isystem") : command.index("-isystem") + 2
    ]
    assert "-ltorch_cuda" in command
    assert str(tmp_path / "libcublas.so.13") in command
    assert "-Wl,--no-undefined" in command
    assert f"-Wl,-rpath,{tmp_path}" in command


def test_cache_lives_beside_the_artifact_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONFORMANCE_CACHE_DIR", str(tmp_path))
    assert build.native_cache().root == tmp_path / "native"
