"""Find libcublas, bind the few functions the shim calls (ctypes), and keep per-(thread, device) handles.

Why ctypes against torch's own libcublas: zero extra dependencies, and the library torch already mapped
into the process is the one its CUDA build was tested with. ``ctypes.CDLL`` releases the GIL during
each call, so threads really do run cuBLAS concurrently. Nothing here loads at import: the library is
found on the first computation (``load_cublas``) and cached.

Discovery order: (1) a libcublas already mapped into this process (torch's), (2) the nvidia pip wheels
(``nvidia/*/lib``), (3) ``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``, (4) ``ctypes.util.find_library``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib.util
import os
import re
import site
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from reference_impl.shims.errors import CublasError, CublasNotFoundError

# cudaDataType_t
CUDA_R_32F = 0
CUDA_R_16F = 2
CUDA_R_16BF = 14
# cublasComputeType_t: plain fp32 accumulation (not CUBLAS_COMPUTE_32F_FAST_TF32).
CUBLAS_COMPUTE_32F = 68
# cublasGemmAlgo_t
CUBLAS_GEMM_DEFAULT = -1
# cublasMath_t: no TF32 (CUBLAS_TF32_TENSOR_OP_MATH would allow it for fp32).
CUBLAS_DEFAULT_MATH = 0

CUBLAS_STATUS_SUCCESS = 0
#: Status names for libraries that lack cublasGetStatusName (it arrived in cuBLAS 11.4).
CUBLAS_STATUS_NAMES: dict[int, str] = {
    0: "CUBLAS_STATUS_SUCCESS",
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}

#: Workspace given to each (handle, stream): cuBLAS's recommendation for Hopper, and torch's default.
WORKSPACE_BYTES = 32 * 1024 * 1024
#: Streams whose workspace one (thread, device) handle keeps before it frees the least recently used.
MAX_WORKSPACES_PER_HANDLE = 16

#: alpha and beta values the shim passes, as host fp32 scalars built once.
_SCALARS = {value: ctypes.pointer(ctypes.c_float(value)) for value in (1.0, -1.0, 0.0)}

_REQUIRED_FUNCTIONS = (
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasSetMathMode",
    "cublasGemmEx",
)

_LIBCUBLAS_NAME = re.compile(r"^libcublas\.so(\.\d+)*$")  # not libcublasLt


class CublasLibrary:
    """A loaded libcublas with typed bindings; every call's status is checked."""

    def __init__(self, cdll: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._cdll = cdll
        c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
        float_p = ctypes.POINTER(ctypes.c_float)

        self._create = cdll.cublasCreate_v2
        self._create.argtypes = [ctypes.POINTER(c_void_p)]
        self._create.restype = c_int
        self._destroy = cdll.cublasDestroy_v2
        self._destroy.argtypes = [c_void_p]
        self._destroy.restype = c_int
        self._set_stream = cdll.cublasSetStream_v2
        self._set_stream.argtypes = [c_void_p, c_void_p]
        self._set_stream.restype = c_int
        self._set_workspace = cdll.cublasSetWorkspace_v2
        self._set_workspace.argtypes = [c_void_p, c_void_p, ctypes.c_size_t]
        self._set_workspace.restype = c_int
        self._set_math_mode = cdll.cublasSetMathMode
        self._set_math_mode.argtypes = [c_void_p, c_int]
        self._set_math_mode.restype = c_int
        self._gemm_ex = cdll.cublasGemmEx
        self._gemm_ex.argtypes = [
            c_void_p,  # handle
            c_int, c_int,  # transa, transb
            c_int, c_int, c_int,  # m, n, k
            float_p,  # alpha (host, float for CUBLAS_COMPUTE_32F)
            c_void_p, c_int, c_int,  # A, Atype, lda
            c_void_p, c_int, c_int,  # B, Btype, ldb
            float_p,  # beta
            c_void_p, c_int, c_int,  # C, Ctype, ldc
            c_int, c_int,  # computeType, algo
        ]  # fmt: skip
        self._gemm_ex.restype = c_int
        self._status_name: Callable[[int], bytes | None] | None = None
        if hasattr(cdll, "cublasGetStatusName"):
            fn = cdll.cublasGetStatusName
            fn.argtypes = [c_int]
            fn.restype = ctypes.c_char_p
            self._status_name = fn

    def status_name(self, status: int) -> str:
        if self._status_name is not None:
            name = self._status_name(status)
            if name:
                return name.decode("ascii", "replace")
        return CUBLAS_STATUS_NAMES.get(status, f"unknown cuBLAS status {status}")

    def check(self, function: str, status: int) -> None:
        if status != CUBLAS_STATUS_SUCCESS:
            raise CublasError(function, status, self.status_name(status))

    def create_handle(self) -> int:
        """A new handle on the current device (the caller makes the right device current)."""
        handle = ctypes.c_void_p()
        self.check("cublasCreate_v2", self._create(ctypes.byref(handle)))
        if not handle.value:
            raise CublasError("cublasCreate_v2", CUBLAS_STATUS_SUCCESS, "a null handle")
        return handle.value

    def destroy_handle(self, handle: int) -> int:
        """Returns the status rather than raising: it runs from finalisers."""
        return int(self._destroy(handle))

    def set_stream(self, handle: int, stream: int) -> None:
        self.check("cublasSetStream_v2", self._set_stream(handle, stream))

    def set_workspace(self, handle: int, workspace: int, nbytes: int) -> None:
        self.check("cublasSetWorkspace_v2", self._set_workspace(handle, workspace, nbytes))

    def set_math_mode(self, handle: int, mode: int) -> None:
        self.check("cublasSetMathMode", self._set_math_mode(handle, mode))

    def gemm_ex(
        self,
        handle: int,
        transa: int,
        transb: int,
        m: int,
        n: int,
        k: int,
        a: int,
        lda: int,
        b: int,
        ldb: int,
        c: int,
        ldc: int,
        data_type: int,
        alpha: float = 1.0,
    ) -> None:
        """``C = alpha·op(A)·op(B)`` with fp32 compute; ``C`` is never read (beta = 0)."""
        # Host scalars (the default CUBLAS_POINTER_MODE_HOST): cuBLAS reads them before it returns, so
        # the shared read-only constants serve every thread; only an unusual alpha gets its own.
        alpha_p = _SCALARS.get(alpha) or ctypes.pointer(ctypes.c_float(alpha))
        status = self._gemm_ex(
            handle, transa, transb, m, n, k,
            alpha_p, a, data_type, lda,
            b, data_type, ldb,
            _SCALARS[0.0], c, data_type, ldc,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip
        self.check("cublasGemmEx", status)


# ---------------------------------------------------------------------------------------------------
# Discovery


def _default_nvidia_dirs() -> tuple[str, ...]:
    """Directories of the ``nvidia`` namespace package that the pip CUDA wheels install into."""
    dirs: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(str(p) for p in spec.submodule_search_locations)
    roots = [*sys.path, *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        roots.append(site.getusersitepackages())
    dirs.extend(str(Path(root) / "nvidia") for root in roots if root and (Path(root) / "nvidia").is_dir())
    return tuple(dict.fromkeys(os.path.realpath(d) for d in dirs))


def _default_toolkit_dirs() -> tuple[str, ...]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    dirs = [str(Path(root) / sub) for root in roots if root for sub in ("lib64", "lib")]
    return tuple(dict.fromkeys(dirs))


@dataclass(frozen=True)
class SearchLocations:
    """Where discovery looks, in order. Tests point these at empty places to exercise the error path."""

    maps_file: str = "/proc/self/maps"
    nvidia_dirs: tuple[str, ...] = field(default_factory=_default_nvidia_dirs)
    toolkit_dirs: tuple[str, ...] = field(default_factory=_default_toolkit_dirs)
    find_library: Callable[[str], str | None] | None = ctypes.util.find_library


def default_search_locations() -> SearchLocations:
    """The real search locations of this process (tests replace this to exercise the error path)."""
    return SearchLocations()


def _mapped_libraries(maps_file: str) -> list[str]:
    """Paths of the libcublas objects mapped into this process (``/proc/self/maps`` format)."""
    try:
        with open(maps_file, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and _LIBCUBLAS_NAME.match(os.path.basename(parts[5].strip())):
            found.append(parts[5].strip())
    return list(dict.fromkeys(found))


def _torch_cuda_major() -> str | None:
    version = getattr(torch.version, "cuda", None)
    return version.split(".")[0] if version else None


def _libraries_in(directory: Path) -> list[str]:
    try:
        names = sorted(p.name for p in directory.iterdir() if _LIBCUBLAS_NAME.match(p.name))
    except OSError:
        return []
    return [str(directory / name) for name in names]


def find_candidates(locations: SearchLocations) -> tuple[list[str], list[str]]:
    """``(candidates, searched)``: library paths (or sonames) to try in order, and where we looked."""
    candidates: list[str] = []
    searched = [f"libraries already loaded in this process ({locations.maps_file})"]
    candidates += _mapped_libraries(locations.maps_file)

    # Prefer the wheel of torch's CUDA major version (nvidia/cu13/lib/libcublas.so.13 for a cu130 build).
    major = _torch_cuda_major()
    wheel_libs: list[str] = []
    for root in locations.nvidia_dirs:
        for sub in sorted(Path(root).glob("*/lib")):
            wheel_libs += _libraries_in(sub)
    wheel_libs.sort(key=lambda p: not (major and (p.endswith(f".so.{major}") or f"/cu{major}/" in p)))
    candidates += wheel_libs
    searched.append(
        "nvidia pip wheels: "
        + (", ".join(f"{d}/*/lib" for d in locations.nvidia_dirs) or "no 'nvidia' package directory found")
    )

    for directory in locations.toolkit_dirs:
        candidates += _libraries_in(Path(directory))
    searched.append("CUDA toolkit: " + (", ".join(locations.toolkit_dirs) or "no directory given"))

    if locations.find_library is not None:
        soname = locations.find_library("cublas")
        if soname:
            candidates.append(soname)
        searched.append("ctypes.util.find_library('cublas')" + ("" if soname else " (found nothing)"))
    else:
        searched.append("ctypes.util.find_library('cublas') (disabled)")
    return list(dict.fromkeys(candidates)), searched


def _load_from(locations: SearchLocations) -> CublasLibrary:
    candidates, searched = find_candidates(locations)
    failures: list[str] = []
    for candidate in candidates:
        try:
            cdll = ctypes.CDLL(candidate)
        except OSError as exc:
            failures.append(f"{candidate}: {exc}")
            continue
        missing = [name for name in _REQUIRED_FUNCTIONS if not hasattr(cdll, name)]
        if missing:
            failures.append(f"{candidate}: lacks {', '.join(missing)}")
            continue
        return CublasLibrary(cdll, candidate)
    raise CublasNotFoundError(tuple(searched), tuple(failures))


_LIBRARY: CublasLibrary | None = None
# Guards only the one-time load; the compute path takes no lock.
_LOAD_LOCK = threading.Lock()


def load_cublas(locations: SearchLocations | None = None) -> CublasLibrary:
    """The process's libcublas, found and bound on first use and cached (explicit ``locations``: uncached)."""
    global _LIBRARY
    if locations is not None:
        return _load_from(locations)
    library = _LIBRARY
    if library is not None:
        return library
    with _LOAD_LOCK:
        if _LIBRARY is None:
            locations = default_search_locations()
            if not _mapped_libraries(locations.maps_file) and torch.cuda.is_available():
                # A CUDA torch maps its libcublas once CUDA (and cuBLAS) is initialised: reuse that one.
                torch.cuda.init()
                # On failure, discovery below still finds a library or says where it looked.
                with contextlib.suppress(RuntimeError):
                    torch.cuda.current_blas_handle()
            _LIBRARY = _load_from(locations)
        return _LIBRARY


# ---------------------------------------------------------------------------------------------------
# Per-(thread, device) handles


def _destroy_handle(library: CublasLibrary, handle: int) -> None:
    # Runs when a thread's storage is collected. At interpreter shutdown the CUDA context may already be
    # gone, so leave the handle to process teardown (as torch does); a finaliser must never raise.
    if sys.is_finalizing():
        return
    with contextlib.suppress(Exception):
        library.destroy_handle(handle)


class HandleOwner:
    """One cuBLAS handle for one (thread, device), with a workspace per stream it has run on.

    A workspace is used only on the stream it was allocated on, so two streams never share scratch memory
    even when this thread alternates between them; the caching allocator makes its reuse stream-ordered.
    """

    def __init__(self, library: CublasLibrary, device_index: int) -> None:
        self.library = library
        self.device_index = device_index
        self.handle = library.create_handle()  # the caller has made device_index current
        # Registered before anything else can fail, so a half-built owner still frees its handle.
        self._finalizer = weakref.finalize(self, _destroy_handle, library, self.handle)
        self._finalizer.atexit = False
        library.set_math_mode(self.handle, CUBLAS_DEFAULT_MATH)
        self._bound_stream: int | None = None
        self._workspaces: OrderedDict[int, torch.Tensor] = OrderedDict()

    def bind_stream(self, stream: int) -> None:
        """Point the handle at ``stream`` (the caller's current stream, on this owner's device)."""
        if stream == self._bound_stream:
            self._workspaces.move_to_end(stream)
            return
        workspace = self._workspaces.get(stream)
        if workspace is None:
            # Allocated while `stream` is current, so the caching allocator orders its reuse after the
            # work this handle queues there, even after eviction below.
            workspace = torch.empty(
                WORKSPACE_BYTES, dtype=torch.uint8, device=torch.device("cuda", self.device_index)
            )
            self._workspaces[stream] = workspace
            while len(self._workspaces) > MAX_WORKSPACES_PER_HANDLE:
                self._workspaces.popitem(last=False)
        else:
            self._workspaces.move_to_end(stream)
        self._bound_stream = None  # not bound until both calls succeed
        self.library.set_stream(self.handle, stream)
        # cublasSetStream resets the workspace to cuBLAS's default pool, so set ours after it.
        self.library.set_workspace(self.handle, workspace.data_ptr(), workspace.numel())
        self._bound_stream = stream

    def destroy(self) -> None:
        """Destroy the handle now (idempotent); normally the thread's exit does it."""
        self._finalizer()


class _ThreadHandles(threading.local):
    def __init__(self) -> None:
        self.owners: dict[int, HandleOwner] = {}


_THREAD_HANDLES = _ThreadHandles()


def thread_handle(library: CublasLibrary, device_index: int) -> HandleOwner:
    """This thread's handle for ``device_index``, created on first use (``device_index`` must be current)."""
    owners = _THREAD_HANDLES.owners
    owner = owners.get(device_index)
    if owner is None or owner.library is not library:
        owner = HandleOwner(library, device_index)
        owners[device_index] = owner
    return owner
