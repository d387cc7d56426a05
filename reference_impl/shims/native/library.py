"""Load the native ``mm_out`` shim and call it from Python: one C call per ``mm_out``, GIL released once.

``load()`` builds the library if needed (``build.py``) and loads it with ``RTLD_GLOBAL``: compiled programs
routed to it (``routing.py``) resolve ``refimpl_cuda_mm_out_v1`` from the global scope when AOTInductor
``dlopen``s them (``RTLD_LOCAL`` for the program itself; global scope is searched first). The library exports
that name only, never ``aoti_torch_cuda_mm_out``, so programs that were not routed keep libtorch's.

Python entry (``fast_entry``): the extension module built from ``entry.cpp`` (``build.build_entry``), whose
``mm_out(out, self, mat2)`` is a builtin function: it unpacks the tensors in C++ (``THPVariable_Unpack``),
computes the negative-view bits, releases the GIL once and calls the library's ``refimpl_mm_out_borrowed``
with non-owning handles (an ``AtenTensorHandle`` is an ``at::Tensor*``); no Python frame, no allocation per
call. Non-tensors and tensor subclasses first go through ``_check_python_rules`` (the rules only Python can
see, with ``mm_out.validate``'s messages). An error comes back as a non-zero code; the library's
thread-local record then gives, through ``_raise_error``, the same exception the Python shim raises
(``MmOutArgumentError`` naming argument and rule, ``CublasError``, ``RuntimeError``).

Fallback, only when the extension cannot be built or loaded here (``entry_status`` says why): the ctypes
entry (``_make_entry``): ``torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors`` turns the tensors into new
handles owned by ``refimpl_mm_out_owned`` (it deletes them), three ``is_neg()`` and capsule reads in Python,
and a ctypes call that drops and retakes the GIL. Same rules, same exceptions, more host time per call.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn

from reference_impl.shims.errors import CublasError, MmOutArgumentError
from reference_impl.shims.native.build import ENTRY_MODULE, NativeStatus, build_entry, build_library

__all__ = [
    "ABI_VERSION",
    "ROUTED_SYMBOL",
    "NativeLibrary",
    "NativeUnavailableError",
    "call_counts",
    "entry_status",
    "fast_entry",
    "load",
    "mm_out",
    "status",
    "try_load",
]

ABI_VERSION = 2
#: The version of the extension module's ``bind()`` contract this side speaks (entry.cpp kEntryAbiVersion).
ENTRY_ABI_VERSION = 1
#: The name compiled programs are routed to; as long as ``aoti_torch_cuda_mm_out`` (see routing.py).
ROUTED_SYMBOL = "refimpl_cuda_mm_out_v1"

_KIND_ARGUMENT, _KIND_CUBLAS = 1, 2


class NativeUnavailableError(RuntimeError):
    """The native shim cannot be used here; the message says why (CPU build, no compiler, headers, ...)."""


@dataclass(frozen=True)
class NativeLibrary:
    """The loaded library and its typed entry points."""

    path: str
    cdll: ctypes.CDLL
    call_owned: Callable[..., int]
    call_borrowed: Callable[..., int]
    last_error: Callable[..., int]
    calls: Callable[[], int]
    abi_calls: Callable[[], int]
    cublas_version: int

    def describe(self) -> str:
        return f"native C++ shim ({self.path}, cuBLAS {self.cublas_version})"


def _bind(path: str) -> NativeLibrary:
    cdll = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    version = cdll.refimpl_mm_out_abi_version
    version.restype = ctypes.c_int32
    found = version()
    if found != ABI_VERSION:
        raise NativeUnavailableError(f"{path} has ABI version {found}; this Python side speaks {ABI_VERSION}")
    voidp = ctypes.c_void_p
    call = cdll.refimpl_mm_out_owned
    call.argtypes = [voidp, voidp, voidp, ctypes.c_int32]
    call.restype = ctypes.c_int32
    last = cdll.refimpl_mm_out_last_error
    charpp = ctypes.POINTER(ctypes.c_char_p)
    last.argtypes = [charpp, charpp, charpp, ctypes.POINTER(ctypes.c_int32)]
    last.restype = ctypes.c_int32
    borrowed = cdll.refimpl_mm_out_borrowed
    borrowed.argtypes = [voidp, voidp, voidp, ctypes.c_int32]
    borrowed.restype = ctypes.c_int32
    calls = cdll.conformance_mm_out_calls
    calls.restype = ctypes.c_uint64
    abi_calls = cdll.refimpl_mm_out_abi_calls
    abi_calls.restype = ctypes.c_uint64
    routed = getattr(cdll, ROUTED_SYMBOL)  # fails loudly if the build lost the export
    del routed
    cublas = cdll.refimpl_mm_out_cublas_version
    cublas.restype = ctypes.c_int32
    return NativeLibrary(path, cdll, call, borrowed, last, calls, abi_calls, int(cublas()))


_LOCK = threading.Lock()
_LIBRARY: NativeLibrary | None = None
_FAILURE: str | None = None


def try_load() -> tuple[NativeLibrary | None, str]:
    """``(library, "")`` or ``(None, reason)``; builds on first use, remembered for the process."""
    global _LIBRARY, _FAILURE
    if _LIBRARY is not None:
        return _LIBRARY, ""
    with _LOCK:
        if _LIBRARY is None and _FAILURE is None:
            built: NativeStatus = build_library()
            if not built.available or built.path is None:
                _FAILURE = built.reason
            else:
                try:
                    _LIBRARY = _bind(built.path)
                except (OSError, AttributeError, NativeUnavailableError) as exc:
                    _FAILURE = f"built {built.path} but could not load it: {exc}"
    return _LIBRARY, _FAILURE or ""


def load() -> NativeLibrary:
    """The loaded library, or ``NativeUnavailableError`` saying why there is none."""
    library, reason = try_load()
    if library is None:
        raise NativeUnavailableError(f"native mm_out shim unavailable: {reason}")
    return library


def status() -> str:
    """One line for run headers: which path runs and why."""
    library, reason = try_load()
    return library.describe() if library is not None else reason


def _raise_error(kind: int, argument: str, rule: str, detail: str, status: int) -> NoReturn:
    """The exception of one record of the library's thread-local error (both entries raise through here)."""
    if kind == _KIND_ARGUMENT:
        raise MmOutArgumentError(argument, rule, detail)
    if kind == _KIND_CUBLAS:
        raise CublasError(argument, int(status), rule)
    raise RuntimeError(f"mm_out (native): {detail or 'failed'} [{argument}: {rule}]")


def _raise_last_error(library: NativeLibrary) -> None:
    argument, rule, detail = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_char_p()
    code = ctypes.c_int32()
    kind = library.last_error(
        ctypes.byref(argument), ctypes.byref(rule), ctypes.byref(detail), ctypes.byref(code)
    )

    def text(value: ctypes.c_char_p) -> str:
        return (value.value or b"").decode("utf-8", "replace")

    _raise_error(kind, text(argument), text(rule), text(detail), int(code.value))


def _check_python_rules(out: object, self_: object, mat2: object) -> None:
    """The two rules only Python can see (present, is-tensor), with mm_out.validate's messages."""
    import torch

    named = (("self", self_), ("mat2", mat2), ("out", out))
    for name, value in named:
        if value is None:
            raise MmOutArgumentError(name, "present", f"{name} is None; mm_out needs a tensor")
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise MmOutArgumentError(
                name, "is-tensor", f"{name} is a {type(value).__name__}, not a torch.Tensor"
            )


def _make_entry(library: NativeLibrary) -> Callable[[Any, Any, Any], None]:
    """The per-call function, with everything it touches bound to locals (host time is the point)."""
    import torch

    tensor_type = torch.Tensor
    alloc = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    call = library.call_owned

    def pointer(handle: object) -> int | None:
        return handle if isinstance(handle, int) else get_pointer(handle, None)

    def entry(out: Any, self_: Any, mat2: Any) -> None:
        if not (type(out) is tensor_type and type(self_) is tensor_type and type(mat2) is tensor_type):
            _check_python_rules(out, self_, mat2)  # subclasses pass on to the native checks
        mask = out.is_neg() | (self_.is_neg() << 1) | (mat2.is_neg() << 2)
        x, y, z = alloc([out, self_, mat2])
        # Ownership of the three handles passes to the library, which deletes them on every path.
        if call(pointer(x), pointer(y), pointer(z), mask):
            _raise_last_error(library)

    return entry


def load_entry_module(path: str) -> ModuleType:
    """Import the extension module built at ``path`` (a cache entry: any file name) without touching
    ``sys.modules``; raises ``NativeUnavailableError`` when its contract version is not ours."""
    import importlib.machinery
    import importlib.util

    import torch  # noqa: F401  (the module links libtorch_python: torch._C must be initialised first)

    loader = importlib.machinery.ExtensionFileLoader(ENTRY_MODULE, path)
    spec = importlib.util.spec_from_loader(ENTRY_MODULE, loader, origin=path)
    if spec is None:  # pragma: no cover - spec_from_loader returns None only without a loader
        raise NativeUnavailableError(f"cannot make an import spec for {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    found = module.abi_version()
    if found != ENTRY_ABI_VERSION:
        raise NativeUnavailableError(
            f"{path} speaks entry contract {found}; this Python side speaks {ENTRY_ABI_VERSION}"
        )
    return module


def bind_entry_module(module: ModuleType, entry_address: int, last_error_address: int) -> None:
    """Point the extension at a library's C entries (``refimpl_mm_out_borrowed``-shaped and
    ``refimpl_mm_out_last_error``-shaped) and at the Python pre-check and error raiser."""
    module.bind(entry_address, last_error_address, _check_python_rules, _raise_error)


def _address(function: object) -> int:
    return int(ctypes.cast(function, ctypes.c_void_p).value or 0)


def _extension_entry(library: NativeLibrary) -> tuple[Callable[[Any, Any, Any], None] | None, str]:
    """``(module.mm_out, description)`` or ``(None, why the ctypes fallback runs)``."""
    built = build_entry()
    if not built.available or built.path is None:
        return None, built.reason
    try:
        module = load_entry_module(built.path)
        bind_entry_module(module, _address(library.call_borrowed), _address(library.last_error))
    except (ImportError, OSError, AttributeError, NativeUnavailableError) as exc:
        return None, f"built {built.path} but could not load it: {type(exc).__name__}: {exc}"
    return module.mm_out, f"extension {built.path}"


_ENTRY: Callable[[Any, Any, Any], None] | None = None
_ENTRY_STATUS: tuple[str, str] | None = None
_ENTRY_LOCK = threading.Lock()
#: ``entry_status()`` kinds.
EXTENSION, CTYPES = "extension", "ctypes"


def fast_entry() -> Callable[[Any, Any, Any], None]:
    """The per-call function ``(out, self, mat2)`` (``NativeUnavailableError`` when it cannot run here):
    the extension module's builtin ``mm_out``, or the ctypes fallback when the extension is unavailable."""
    global _ENTRY, _ENTRY_STATUS
    if _ENTRY is not None:
        return _ENTRY
    library = load()
    with _ENTRY_LOCK:
        if _ENTRY is None:
            entry, why = _extension_entry(library)
            if entry is not None:
                _ENTRY_STATUS = (EXTENSION, why)
            else:
                entry = _make_entry(library)
                _ENTRY_STATUS = (CTYPES, f"extension unavailable: {why}")
            _ENTRY = entry
    return _ENTRY


def entry_status() -> tuple[str, str]:
    """``("extension" | "ctypes", why)`` of the Python entry (choosing it on first use; the library must
    load, else ``NativeUnavailableError``)."""
    fast_entry()
    assert _ENTRY_STATUS is not None
    return _ENTRY_STATUS


def mm_out(out: Any, self_: Any, mat2: Any, /) -> None:
    """``out = self_ @ mat2`` through the native shim (``NativeUnavailableError`` when it cannot run here)."""
    fast_entry()(out, self_, mat2)


def call_counts() -> dict[str, int] | None:
    """Calls served so far (all entries, and the ABI entry compiled programs use); None when not loaded."""
    library = _LIBRARY
    if library is None:
        return None
    return {"calls": int(library.calls()), "abi_calls": int(library.abi_calls())}
