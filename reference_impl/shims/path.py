"""Which ``mm_out`` runs behind the backend's protocol entry: the native C++ shim or the Python/ctypes one.

``$REFIMPL_MM_OUT_PATH``: ``auto`` (default: native when it builds and loads here, else Python, with the
reason), ``native`` (native or an error saying why not) or ``python`` (the ctypes fallback, kept and tested:
``tests/reference_impl/test_mm_out_validation.py``, ``tests/reference_impl/test_mm_out_fast_path.py``). Both
enforce the same rules with the same messages. The native path's Python entry is one C call that releases the
GIL once (the extension module of ``native/entry.cpp``), or, only when that module cannot be built or loaded
here, the ctypes fallback entry (``$REFIMPL_NATIVE_ENTRY_DISABLE=1`` forces it, for comparisons);
``describe_path`` says which.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "NATIVE_CTYPES",
    "NATIVE_EXTENSION",
    "PATH_ENV_VAR",
    "describe_path",
    "mm_out_entry",
    "selected_path",
]

PATH_ENV_VAR = "REFIMPL_MM_OUT_PATH"
_CHOICES = ("auto", "native", "python")


def _requested() -> str:
    value = os.environ.get(PATH_ENV_VAR, "auto").strip().lower() or "auto"
    if value not in _CHOICES:
        raise ValueError(f"{PATH_ENV_VAR}={value!r}: choose one of {', '.join(_CHOICES)}")
    return value


def selected_path() -> tuple[str, str]:
    """``("native" | "python", why)``."""
    requested = _requested()
    if requested == "python":
        return "python", f"{PATH_ENV_VAR}=python"
    from reference_impl.shims.native.library import try_load

    library, reason = try_load()
    if library is not None:
        return "native", library.describe()
    if requested == "native":
        from reference_impl.shims.native.library import NativeUnavailableError

        raise NativeUnavailableError(f"{PATH_ENV_VAR}=native but the native shim is unavailable: {reason}")
    return "python", f"native shim unavailable: {reason}"


#: How ``describe_path`` names each entry.
NATIVE_EXTENSION = "native C++ (single call, GIL released once)"
NATIVE_CTYPES = "native C++ through the ctypes fallback entry (GIL released per call, Python work per call)"


def describe_path() -> str:
    path, why = selected_path()
    if path != "native":
        return f"mm_out path: Python/ctypes — {why}"
    from reference_impl.shims.native.library import EXTENSION, entry_status

    kind, entry_why = entry_status()
    name = NATIVE_EXTENSION if kind == EXTENSION else NATIVE_CTYPES
    return f"mm_out path: {name} — {why}; entry: {entry_why}"


def mm_out_entry() -> Callable[[Any, Any, Any], None]:
    """The function ``(out, self, mat2) -> None`` of the selected path."""
    path, _ = selected_path()
    if path == "native":
        from reference_impl.shims.native.library import fast_entry

        return fast_entry()
    from reference_impl.shims.mm_out import mm_out

    return mm_out
