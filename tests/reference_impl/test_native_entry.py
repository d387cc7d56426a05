"""CPU-side self-tests of the native ``mm_out`` shim's Python entry module (entry.cpp): built against CPU
torch, bound to a fake C entry, it passes the caller's tensors with the GIL released and raises what the
ctypes entry raises; the backend binds it itself.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference_impl.shims.native import build
from tests.reference_impl.native_support import CXX, TORCH_INCLUDE, cpu_only

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
