"""CPU-side self-tests of the native ``mm_out`` shim: build skipped cleanly, key and cache logic, the C ABI
against torch's headers, and routing compiled programs to another ``mm_out`` symbol (proved end to end on a
CPU package: a routed program calls a library's symbol, an unrouted one keeps libtorch's).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from reference_impl.shims.native import build, routing
from reference_impl.shims.native.build import BuildPlan, NativeBuildError

TORCH_INCLUDE = Path(torch.__file__).parent / "include"
SHIM_H = TORCH_INCLUDE / "torch/csrc/inductor/aoti_torch/c/shim.h"
C_SHIM_CUDA_H = TORCH_INCLUDE / "torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h"
SOURCE_TEXT = build.SOURCE.read_text()
CXX = shutil.which("g++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="needs g++")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


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


# ------------------------------------------------------------------------------- the Python entry module
# The extension (entry.cpp) needs no CUDA, so it is built here against CPU torch and bound to a fake C entry
# with the shim's signature, which records what it was given and forwards to libtorch's CPU mm_out (proving
# the borrowed handles are the caller's tensors) or fails with a chosen error record.

FAKE_SOURCE = r"""
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <cstdint>
#include <string>
extern "C" AOTITorchError aoti_torch_cpu_mm_out(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle);
extern "C" int PyGILState_Check(void);
#define EXPORT extern "C" __attribute__((visibility("default")))
namespace {
thread_local int32_t t_kind = 0, t_status = 0;
thread_local std::string t_argument, t_rule, t_detail;
int32_t g_kind = 0, g_status = 0;
std::string g_argument, g_rule, g_detail;
int64_t g_record[6] = {0, 0, 0, 0, 0, 0};  // mask, GIL held, out/self/mat2 data pointers, calls
int64_t data(AtenTensorHandle h) { void* p = nullptr; aoti_torch_get_data_ptr(h, &p); return (int64_t)p; }
}
EXPORT void fake_fail(int32_t kind, const char* argument, const char* rule, const char* detail,
                      int32_t status) {
  g_kind = kind; g_status = status; g_argument = argument; g_rule = rule; g_detail = detail;
}
EXPORT int32_t fake_entry(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2, int32_t mask) {
  g_record[0] = mask; g_record[1] = PyGILState_Check();
  g_record[2] = data(out); g_record[3] = data(self); g_record[4] = data(mat2); g_record[5] += 1;
  if (g_kind != 0) {
    t_kind = g_kind; t_status = g_status; t_argument = g_argument; t_rule = g_rule; t_detail = g_detail;
    return 1;
  }
  return aoti_torch_cpu_mm_out(out, self, mat2);
}
EXPORT int32_t fake_last_error(const char** a, const char** r, const char** d, int32_t* s) {
  *a = t_argument.c_str(); *r = t_rule.c_str(); *d = t_detail.c_str(); *s = t_status; return t_kind;
}
EXPORT void fake_record(int64_t* out) { for (int i = 0; i < 6; ++i) out[i] = g_record[i]; }
"""


@pytest.fixture(scope="module")
def entry_build(tmp_path_factory: pytest.TempPathFactory) -> build.NativeStatus:
    """The entry module built (cold) into a fresh cache."""
    if CXX is None:
        pytest.skip("needs g++")
    root = tmp_path_factory.mktemp("entry-cache")
    status = build.build_entry(cache=build.ArtifactCache(root))
    assert status.available, status.reason
    assert status.path is not None
    assert Path(status.path).is_relative_to(root)
    return status


@pytest.fixture(scope="module")
def fake_shim(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if CXX is None:
        pytest.skip("needs g++")
    folder = tmp_path_factory.mktemp("fake-shim")
    (folder / "fake.cpp").write_text(FAKE_SOURCE)
    torch_lib = Path(torch.__file__).parent / "lib"
    command = [
        CXX,
        "-std=c++17",
        "-O1",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Werror",
    ]
    command += ["-isystem", str(TORCH_INCLUDE), str(folder / "fake.cpp"), "-o", str(folder / "libfake.so")]
    command += [f"-L{torch_lib}", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"]
    subprocess.run(command, check=True, capture_output=True)
    cdll = ctypes.CDLL(str(folder / "libfake.so"))
    cdll.fake_fail.argtypes = [
        ctypes.c_int32,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_int32,
    ]
    cdll.fake_record.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    charpp = ctypes.POINTER(ctypes.c_char_p)
    cdll.fake_last_error.argtypes = [charpp, charpp, charpp, ctypes.POINTER(ctypes.c_int32)]
    cdll.fake_last_error.restype = ctypes.c_int32
    return cdll


def _addr(function: object) -> int:
    return int(ctypes.cast(function, ctypes.c_void_p).value or 0)


@pytest.fixture(scope="module")
def entry_module(entry_build: build.NativeStatus, fake_shim: ctypes.CDLL) -> object:
    from reference_impl.shims.native import library

    assert entry_build.path is not None
    module = library.load_entry_module(entry_build.path)
    if not module.is_bound():  # a fresh load (CPython keeps one copy per file and process)
        with pytest.raises(RuntimeError, match="not bound"):
            module.mm_out(*_operands())
    library.bind_entry_module(module, _addr(fake_shim.fake_entry), _addr(fake_shim.fake_last_error))
    assert module.is_bound()
    return module


def _record(fake: ctypes.CDLL) -> dict[str, int]:
    values = (ctypes.c_int64 * 6)()
    fake.fake_record(values)
    return dict(zip(("mask", "gil_held", "out", "self", "mat2", "calls"), values, strict=True))


def _operands(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.randn(3, 4, dtype=dtype)
    b = torch.randn(4, 5, dtype=dtype)
    return torch.full((3, 5), float("nan"), dtype=dtype), a, b


@pytest.mark.proof
def test_entry_builds_on_cpu_torch_warning_free_and_is_cached(entry_build: build.NativeStatus) -> None:
    plan = build.plan_entry_build()
    assert "-Werror" in plan.flags
    assert "-DUSE_CUDA" not in plan.flags
    assert "-ltorch_python" in plan.command("x.so")
    assert "-Wl,--no-undefined" not in plan.command("x.so"), "Python's symbols come from the interpreter"
    assert entry_build.cache_hit is False
    assert entry_build.build_seconds > 0
    assert entry_build.path is not None
    root = Path(entry_build.path).parents[2]  # <root>/v1/<key[:2]>/<key>.bin
    again = build.build_entry(cache=build.ArtifactCache(root))
    assert again.available
    assert again.cache_hit is True
    assert (again.path, again.key) == (entry_build.path, entry_build.key)


def test_entry_key_follows_its_source_and_differs_from_the_library_key(tmp_path: Path) -> None:
    plan = build.plan_entry_build()
    key = build.entry_key(plan)
    assert key == build.entry_key(plan)
    source = tmp_path / "entry.cpp"
    source.write_text(build.ENTRY_SOURCE.read_text() + "\n// changed\n")
    assert build.entry_key(build.plan_entry_build(source)) != key


def test_entry_build_reports_why_not(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(build.ENTRY_DISABLE_ENV_VAR, "1")
    status = build.build_entry(cache=build.ArtifactCache(tmp_path))
    assert not status.available
    assert build.ENTRY_DISABLE_ENV_VAR in status.reason
    monkeypatch.delenv(build.ENTRY_DISABLE_ENV_VAR)
    monkeypatch.setenv(build.CXX_ENV_VAR, str(tmp_path / "no-such-g++"))
    status = build.build_entry(cache=build.ArtifactCache(tmp_path))
    assert not status.available
    assert "not built" in status.reason
    assert "no-such-g++" in status.reason
    assert not any(tmp_path.rglob("*.bin"))


@pytest.mark.proof
def test_entry_passes_the_callers_tensors_with_the_gil_released(
    entry_module: object, fake_shim: ctypes.CDLL
) -> None:
    out, a, b = _operands()
    calls = _record(fake_shim)["calls"]
    assert entry_module.mm_out(out, a, b) is None  # type: ignore[attr-defined]
    record = _record(fake_shim)
    assert record["calls"] == calls + 1
    assert record["gil_held"] == 0, "the C entry runs with the GIL released"
    assert (record["out"], record["self"], record["mat2"]) == (out.data_ptr(), a.data_ptr(), b.data_ptr())
    assert record["mask"] == 0
    torch.testing.assert_close(out, a @ b), "written in place into the caller's out"


@pytest.mark.proof
def test_entry_borrows_handles_and_leaks_nothing(entry_module: object) -> None:
    out, a, b = _operands()
    storages = [t.untyped_storage() for t in (out, a, b)]

    def counts() -> list[int]:
        return [sys.getrefcount(t) for t in (out, a, b)] + [
            torch._C._storage_Use_Count(st._cdata) for st in storages
        ]

    before = counts()
    for _ in range(1000):
        entry_module.mm_out(out, a, b)  # type: ignore[attr-defined]
    assert counts() == before, "no handle kept a Python or a storage reference"


@pytest.mark.parametrize("negative", [(), ("out",), ("self",), ("mat2",), ("out", "self", "mat2")])
@pytest.mark.proof
def test_entry_computes_the_negative_view_mask(
    entry_module: object, fake_shim: ctypes.CDLL, negative: tuple[str, ...]
) -> None:
    from reference_impl.shims.errors import CublasError

    args = dict(zip(("out", "self", "mat2"), _operands(), strict=True))
    for name in negative:
        args[name] = torch._neg_view(args[name])
    fake_shim.fake_fail(2, b"cublasGemmEx", b"CUBLAS_STATUS_NOT_SUPPORTED", b"", 15)  # stop before writing
    try:
        with pytest.raises(CublasError, match="CUBLAS_STATUS_NOT_SUPPORTED"):
            entry_module.mm_out(args["out"], args["self"], args["mat2"])  # type: ignore[attr-defined]
    finally:
        fake_shim.fake_fail(0, b"", b"", b"", 0)
    bits = {"out": 1, "self": 2, "mat2": 4}
    assert _record(fake_shim)["mask"] == sum(bits[n] for n in negative)


@pytest.mark.parametrize(
    ("kind", "status"),
    [(1, 0), (2, 14), (3, 2), (4, 0), (7, 0)],
    ids=["argument", "cublas", "cuda", "internal", "unknown-kind"],
)
@pytest.mark.proof
def test_entry_raises_what_the_ctypes_entry_raises(
    entry_module: object, fake_shim: ctypes.CDLL, kind: int, status: int
) -> None:
    from types import SimpleNamespace

    from reference_impl.shims.errors import CublasError, MmOutArgumentError
    from reference_impl.shims.native import library

    out, a, b = _operands()
    fields = (
        b"mat2",
        b"same-dtype",
        "mat2 has dtype torch.float16 but self has torch.float32 \u2014 x".encode(),
    )
    fake_shim.fake_fail(kind, *fields, status)
    try:
        with pytest.raises((ValueError, RuntimeError)) as native:
            entry_module.mm_out(out, a, b)  # type: ignore[attr-defined]
        with pytest.raises(
            (ValueError, RuntimeError)
        ) as fallback:  # the ctypes entry's reader of the same record
            library._raise_last_error(SimpleNamespace(last_error=fake_shim.fake_last_error))  # type: ignore[arg-type]
    finally:
        fake_shim.fake_fail(0, b"", b"", b"", 0)
    assert type(native.value) is type(fallback.value)
    assert str(native.value) == str(fallback.value)
    expected = {1: MmOutArgumentError, 2: CublasError}.get(kind, RuntimeError)
    assert type(native.value) is expected
    if kind == 1:
        assert (native.value.argument, native.value.rule) == ("mat2", "same-dtype")  # type: ignore[attr-defined]
        assert native.value.detail.endswith("\u2014 x")  # type: ignore[attr-defined]
    if kind == 2:
        assert (native.value.function, native.value.status) == ("mat2", 14)  # type: ignore[attr-defined]
    assert torch.isnan(out).all(), "the fake failed before writing"


T = "tensor"  # stands for the valid tensor of that position
NOT_TENSORS = [
    ("self-none", (T, None, T), "self", "present"),
    ("out-none", (None, T, T), "out", "present"),
    ("all-none-blames-self", (None, None, None), "self", "present"),
    ("mat2-int", (T, T, 3), "mat2", "is-tensor"),
    ("self-list", (T, [[1.0]], T), "self", "is-tensor"),
    ("out-ndarray", ("ndarray", T, T), "out", "is-tensor"),
]


@pytest.mark.parametrize(
    ("spec", "argument", "rule"), [c[1:] for c in NOT_TENSORS], ids=[c[0] for c in NOT_TENSORS]
)
@pytest.mark.proof
def test_entry_non_tensors_get_the_python_rules_and_messages(
    entry_module: object, fake_shim: ctypes.CDLL, spec: tuple[object, ...], argument: str, rule: str
) -> None:
    from reference_impl.shims.errors import MmOutArgumentError
    from reference_impl.shims.mm_out import validate

    tensors = _operands()
    args = [tensors[i] if v == T else v for i, v in enumerate(spec)]
    if spec[0] == "ndarray":
        args[0] = tensors[0].numpy()
    calls = _record(fake_shim)["calls"]
    with pytest.raises(MmOutArgumentError) as native:
        entry_module.mm_out(*args)  # type: ignore[attr-defined]
    with pytest.raises(MmOutArgumentError) as python:
        validate(*args)
    assert (native.value.argument, native.value.rule) == (argument, rule)
    assert str(native.value) == str(python.value)
    assert _record(fake_shim)["calls"] == calls, "the C entry is never reached"


@pytest.mark.proof
def test_entry_lets_tensor_subclasses_through_after_the_python_check(
    entry_module: object, fake_shim: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reference_impl.shims.native import library

    class Sub(torch.Tensor):
        pass

    seen: list[tuple[type, ...]] = []
    real = library._check_python_rules

    def counting(out: object, self_: object, mat2: object) -> None:
        seen.append((type(out), type(self_), type(mat2)))
        real(out, self_, mat2)

    monkeypatch.setattr(library, "_check_python_rules", counting)
    shim_addr = (_addr(fake_shim.fake_entry), _addr(fake_shim.fake_last_error))
    library.bind_entry_module(entry_module, *shim_addr)  # type: ignore[arg-type]
    try:
        out, a, b = _operands()
        entry_module.mm_out(out, a, b)  # type: ignore[attr-defined]
        entry_module.mm_out(torch.nn.Parameter(torch.zeros(3, 5), requires_grad=False), a, b)  # type: ignore[attr-defined]
        assert seen == [], "exact tensors (and Parameters) take no Python call"
        sub = a.as_subclass(Sub)
        entry_module.mm_out(out, sub, b)  # type: ignore[attr-defined]
        assert seen == [(torch.Tensor, Sub, torch.Tensor)]
        assert _record(fake_shim)["self"] == a.data_ptr()
        torch.testing.assert_close(out, a @ b)
    finally:
        monkeypatch.undo()
        library.bind_entry_module(entry_module, *shim_addr)  # type: ignore[arg-type]


@pytest.mark.proof
def test_entry_arity_and_keywords_are_call_errors(entry_module: object, fake_shim: ctypes.CDLL) -> None:
    out, a, b = _operands()
    calls = _record(fake_shim)["calls"]
    mm_out = entry_module.mm_out  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'mat2'"):
        mm_out(out, a)
    with pytest.raises(TypeError, match=r"missing 2 required positional arguments: 'self' and 'mat2'"):
        mm_out(out)
    with pytest.raises(TypeError, match=r"missing 3 required"):
        mm_out()
    with pytest.raises(TypeError, match=r"takes 3 positional arguments but 4 were given"):
        mm_out(out, a, b, b)
    with pytest.raises(TypeError, match=r"keyword"):
        mm_out(out, a, mat2=b)
    assert _record(fake_shim)["calls"] == calls
    assert torch.isnan(out).all()


@pytest.mark.proof
def test_fast_entry_prefers_the_extension_and_falls_back_to_ctypes_with_the_reason(
    entry_build: build.NativeStatus, fake_shim: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from reference_impl.shims import path
    from reference_impl.shims.native import library

    fake_library = SimpleNamespace(
        call_borrowed=fake_shim.fake_entry, last_error=fake_shim.fake_last_error, call_owned=None
    )
    monkeypatch.setattr(library, "load", lambda: fake_library)
    monkeypatch.setattr(library, "_ENTRY", None)
    monkeypatch.setattr(library, "_ENTRY_STATUS", None)
    monkeypatch.setattr(library, "build_entry", lambda: entry_build)
    entry = library.fast_entry()
    assert getattr(entry, "__name__", None) == "mm_out"
    assert type(entry).__name__ == "builtin_function_or_method", "a C function: no Python frame per call"
    kind, why = library.entry_status()
    assert kind == library.EXTENSION
    assert entry_build.path is not None
    assert entry_build.path in why
    out, a, b = _operands()
    entry(out, a, b)
    torch.testing.assert_close(out, a @ b)
    monkeypatch.setattr(path, "selected_path", lambda: ("native", "native C++ shim (fake)"))
    assert path.describe_path().startswith(f"mm_out path: {path.NATIVE_EXTENSION} — native C++ shim (fake)")

    monkeypatch.setattr(library, "_ENTRY", None)
    monkeypatch.setattr(library, "_ENTRY_STATUS", None)
    monkeypatch.setattr(library, "build_entry", lambda: build.NativeStatus(False, "not built: no Python.h"))
    entry = library.fast_entry()
    assert type(entry).__name__ == "function", "the ctypes fallback"
    assert library.entry_status() == (library.CTYPES, "extension unavailable: not built: no Python.h")
    described = path.describe_path()
    assert path.NATIVE_CTYPES in described
    assert "extension unavailable: not built: no Python.h" in described


@pytest.mark.proof
def test_backend_binds_the_entry_itself(entry_module: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_impl import backend as backend_module
    from reference_impl.shims import path

    fresh = backend_module.ReferenceBackend()
    monkeypatch.setattr(path, "mm_out_entry", lambda: entry_module.mm_out)  # type: ignore[attr-defined]
    captured = fresh.mm_out  # before any call, as the bench's threads suite does
    assert captured is entry_module.mm_out  # type: ignore[attr-defined]
    assert fresh.__dict__["mm_out"] is captured
    out, a, b = _operands()
    fresh.mm_out(out, a, b)
    torch.testing.assert_close(out, a @ b)


def test_backend_access_never_fails_and_the_call_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_impl import backend as backend_module
    from reference_impl.shims import path

    def unavailable() -> object:
        raise RuntimeError("native shim unavailable: test")

    monkeypatch.setattr(path, "mm_out_entry", unavailable)
    fresh = backend_module.ReferenceBackend()
    assert callable(fresh.mm_out)
    with pytest.raises(RuntimeError, match="unavailable: test"):
        fresh.mm_out(*_operands())
    assert "mm_out" not in fresh.__dict__


@cpu_only
def test_backend_on_a_cpu_machine_binds_the_python_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_impl import backend as backend_module
    from reference_impl.shims import path
    from reference_impl.shims.mm_out import mm_out

    monkeypatch.delenv(path.PATH_ENV_VAR, raising=False)
    assert backend_module.ReferenceBackend().mm_out is mm_out


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
