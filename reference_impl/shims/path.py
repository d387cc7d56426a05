"""Which ``mm_out`` runs behind the backend's protocol entry: the native C++ shim or the Python/ctypes one.

``$REFIMPL_MM_OUT_PATH``: ``auto`` (default: native when it builds and loads here, else Python, with the
reason), ``native`` (native or an error saying why not) or ``python`` (the ctypes fallback, kept and tested:
``tests/test_mm_out_validation.py``, ``tests/test_mm_out_fast_path.py``). Both enforce the same rules with
the same messages; the native one releases the GIL for the whole call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["PATH_ENV_VAR", "describe_path", "mm_out_entry", "selected_path"]

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


def describe_path() -> str:
    path, why = selected_path()
    name = "native C++ (aoti_torch_cuda_mm_out ABI, GIL released)" if path == "native" else "Python/ctypes"
    return f"mm_out path: {name} — {why}"


def mm_out_entry() -> Callable[[Any, Any, Any], None]:
    """The function ``(out, self, mat2) -> None`` of the selected path."""
    path, _ = selected_path()
    if path == "native":
        from reference_impl.shims.native.library import fast_entry

        return fast_entry()
    from reference_impl.shims.mm_out import mm_out

    return mm_out
