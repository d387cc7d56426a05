"""Build the native cuBLAS ``mm_out`` shim (``mm_out.cpp``) into a shared library, cached by content.

One plain compiler invocation (no CMake, no ``torch.utils.cpp_extension``: the library has one source file,
no Python bindings and no CUDA kernels, so the extension machinery would add a Python-module build, ninja
and a longer key for nothing)::

    $CXX -std=c++17 -O2 -shared -fPIC -fvisibility=hidden -Wall -Wextra -Werror -DUSE_CUDA
         -isystem <torch include> -isystem <CUDA include dirs> mm_out.cpp -o lib.so
         -L<torch lib> -ltorch_cpu -ltorch_cuda -lc10 <libcublas.so.N> <libcudart.so.N> -Wl,-rpath,...

It links torch's own libraries only for the AOTI C shim (``aoti_torch_*``); the source reads tensors through
that ABI alone, so a runtime without libtorch can build the same file against its own shim provider.

Toolchain: ``$REFIMPL_NATIVE_CXX``, else ``$CXX``, else ``/usr/bin/g++``, else ``g++`` on PATH. Headers and
libraries: the libcublas / libcudart already mapped into this process (torch's), the nvidia pip wheels
(``nvidia/cu13/{include,lib}`` or ``nvidia/{cublas,cuda_runtime,...}/{include,lib}``), ``$CUDA_HOME``,
``$CUDA_PATH``, torch's ``CUDA_HOME``, ``/usr/local/cuda``.

Cache: ``ArtifactCache`` under ``<default_cache_dir()>/native`` (``$CONFORMANCE_CACHE_DIR`` or
``~/.cache/aoti-conformance``), keyed by SHA-256 over the source's hash, the compiler's identity
(path, real path, ``--version``), the flags, and every include dir and library path with the size and
mtime of the files used. Concurrent builders serialise on the key's lock; the library is loaded straight
from the cache entry. On a machine without CUDA the build is skipped and ``NativeStatus`` says why.

The Python entry (``entry.cpp``, ``build_entry``): a plain CPython extension module, one more compiler call
of the same kind, cached the same way under its own key (which also covers the Python version and
``EXT_SUFFIX``). It includes Python.h and torch's ``python_variable.h`` only (about 9 s to compile on two
cores; ``torch.utils.cpp_extension`` with ``torch/extension.h`` took 30 s for an empty module), needs no CUDA
header, and is linked against libtorch_python, libtorch_cpu and libc10.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_impl.artifact_cache import (
    ArtifactCache,
    compiler_identity,
    default_cache_dir,
    make_key,
)

__all__ = [
    "CXX_ENV_VAR",
    "DISABLE_ENV_VAR",
    "ENTRY_DISABLE_ENV_VAR",
    "ENTRY_FLAGS",
    "ENTRY_MODULE",
    "ENTRY_SOURCE",
    "FLAGS",
    "SOURCE",
    "BuildPlan",
    "NativeBuildError",
    "NativeStatus",
    "build_entry",
    "build_library",
    "entry_key",
    "library_key",
    "native_cache",
    "plan_build",
    "plan_entry_build",
    "resolve_compiler",
    "source_digest",
]

SOURCE = Path(__file__).with_name("mm_out.cpp")
CXX_ENV_VAR = "REFIMPL_NATIVE_CXX"
#: Set to 1 to never build or load the native shim (the Python/ctypes fallback runs instead).
DISABLE_ENV_VAR = "REFIMPL_NATIVE_MM_OUT_DISABLE"
KEY_SCHEMA = 1
LIBRARY_SONAME = "librefimpl_mm_out.so"

#: The Python entry: a CPython extension module (entry.cpp) calling the library's C entry in one call.
ENTRY_SOURCE = Path(__file__).with_name("entry.cpp")
ENTRY_MODULE = "_refimpl_mm_out_entry"
#: Set to 1 to keep the library but call it through the ctypes fallback entry instead of the extension.
ENTRY_DISABLE_ENV_VAR = "REFIMPL_NATIVE_ENTRY_DISABLE"
ENTRY_KEY_SCHEMA = 1
#: Headers the entry includes: torch's (THPVariable_Unpack, the AOTI handle type) and Python's.
ENTRY_HEADERS: tuple[str, ...] = (
    "Python.h",
    "torch/csrc/autograd/python_variable.h",
    "torch/csrc/inductor/aoti_torch/c/shim.h",
    "torch/csrc/inductor/aoti_torch/utils.h",
)

#: Compile flags (the key covers them). -Werror: the source compiles warning-free against real headers;
#: third-party headers come in with -isystem so their warnings do not count.
FLAGS: tuple[str, ...] = (
    "-std=c++17",
    "-O2",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-DUSE_CUDA",
)
#: The entry's flags: no CUDA (it never touches CUDA: the library does), torch's C++ ABI.
ENTRY_FLAGS: tuple[str, ...] = tuple(f for f in FLAGS if f != "-DUSE_CUDA")
#: Headers the source includes directly or that CUDA's headers pull in; each must be found somewhere.
REQUIRED_HEADERS: tuple[str, ...] = (
    "cublas_v2.h",
    "cuda_runtime_api.h",
    "crt/host_defines.h",
    "nv/target",
)
_LIB = {"cublas": re.compile(r"^libcublas\.so(\.\d+)*$"), "cudart": re.compile(r"^libcudart\.so(\.\d+)*$")}


class NativeBuildError(RuntimeError):
    """The native shim could not be built; the message says what was missing or what the compiler said."""


@dataclass(frozen=True)
class NativeStatus:
    """Whether the native shim is usable here: ``available`` with its ``path``, or the ``reason`` why not."""

    available: bool
    reason: str = ""
    path: str | None = None
    key: str | None = None
    cache_hit: bool | None = None
    build_seconds: float = 0.0


@dataclass(frozen=True)
class BuildPlan:
    """Everything one build uses; ``command(output)`` is the exact compiler command line."""

    compiler: str
    source: Path
    include_dirs: tuple[str, ...]
    torch_lib_dir: str
    libraries: tuple[str, ...]  # full paths of libcublas and libcudart
    flags: tuple[str, ...] = FLAGS
    torch_libraries: tuple[str, ...] = ("torch_cpu", "torch_cuda", "c10")
    notes: tuple[str, ...] = field(default=())
    soname: str = LIBRARY_SONAME
    #: A Python extension leaves the interpreter's symbols undefined (they come from the process).
    no_undefined: bool = True

    def command(self, output: str) -> list[str]:
        rpaths = list(dict.fromkeys([self.torch_lib_dir, *(os.path.dirname(p) for p in self.libraries)]))
        return [
            self.compiler,
            *self.flags,
            *(arg for d in self.include_dirs for arg in ("-isystem", d)),
            str(self.source),
            "-o",
            output,
            f"-Wl,-soname,{self.soname}",
            f"-L{self.torch_lib_dir}",
            *(f"-l{name}" for name in self.torch_libraries),
            *self.libraries,
            *(f"-Wl,-rpath,{d}" for d in rpaths),
            *(["-Wl,--no-undefined"] if self.no_undefined else []),
        ]


def source_digest(source: Path = SOURCE) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def resolve_compiler() -> str:
    """``$REFIMPL_NATIVE_CXX``, else ``$CXX``, else ``/usr/bin/g++`` if present, else ``g++`` (absolute)."""
    for candidate in (os.environ.get(CXX_ENV_VAR), os.environ.get("CXX")):
        if candidate and candidate.strip():
            return shutil.which(candidate.strip()) or candidate.strip()
    if os.path.exists("/usr/bin/g++"):
        return "/usr/bin/g++"
    return shutil.which("g++") or "g++"


def _torch_dirs() -> tuple[str, str]:
    import torch

    root = Path(torch.__file__).parent
    return str(root / "include"), str(root / "lib")


def _nvidia_roots() -> list[Path]:
    """Directories of the ``nvidia`` namespace package (pip CUDA wheels)."""
    roots: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        roots.extend(spec.submodule_search_locations)
    candidates = [*sys.path, *site.getsitepackages()]
    roots.extend(str(Path(p) / "nvidia") for p in candidates if p and (Path(p) / "nvidia").is_dir())
    return [Path(p) for p in dict.fromkeys(os.path.realpath(r) for r in roots)]


def _cuda_homes() -> list[Path]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    try:
        from torch.utils import cpp_extension

        homes.append(getattr(cpp_extension, "CUDA_HOME", None))
    except Exception:  # pragma: no cover - cpp_extension import problems only mean one place fewer
        pass
    homes.append("/usr/local/cuda")
    return [Path(h) for h in dict.fromkeys(h for h in homes if h)]


def candidate_include_dirs() -> list[str]:
    """Where CUDA headers may be, in preference order (wheels first: they match torch's libraries)."""
    dirs: list[Path] = []
    for root in _nvidia_roots():
        dirs += sorted(root.glob("cu*/include"))  # CUDA 13 wheels: nvidia/cu13/include
        dirs += sorted(root.glob("cu*/include/cccl"))
        dirs += sorted(p for p in root.glob("*/include") if not p.parent.name.startswith("cu1"))
    for home in _cuda_homes():
        dirs += [home / "include", home / "include" / "cccl"]
        dirs += sorted((home / "targets").glob("*/include"))
    return [str(d) for d in dict.fromkeys(dirs) if d.is_dir()]


def resolve_include_dirs(candidates: Sequence[str], required: Iterable[str] = REQUIRED_HEADERS) -> list[str]:
    """The first candidate dir holding each required header (deduplicated, in candidate order).

    Raises ``NativeBuildError`` naming every header not found and every place searched.
    """
    chosen: list[str] = []
    missing: list[str] = []
    for header in required:
        where = next((d for d in candidates if (Path(d) / header).is_file()), None)
        if where is None:
            missing.append(header)
        elif where not in chosen:
            chosen.append(where)
    if missing:
        raise NativeBuildError(
            f"CUDA headers not found: {', '.join(missing)}; searched: {', '.join(candidates) or 'nothing'} "
            "(install the CUDA wheels torch uses, e.g. nvidia-cuda-runtime, nvidia-cublas, nvidia-cuda-crt, "
            "nvidia-cuda-cccl, or set CUDA_HOME)"
        )
    return sorted(chosen, key=list(candidates).index)


def _mapped(kind: str, maps_file: str = "/proc/self/maps") -> list[str]:
    try:
        lines = Path(maps_file).read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and _LIB[kind].match(os.path.basename(parts[5].strip())):
            found.append(parts[5].strip())
    return list(dict.fromkeys(found))


def find_library(kind: str, cuda_major: str | None) -> str:
    """Full path of libcublas / libcudart: the one mapped into this process first (torch's), else a
    wheel's (torch's CUDA major first), else the toolkit's."""
    mapped = _mapped(kind)
    if mapped:
        return mapped[0]
    candidates: list[Path] = []
    for root in _nvidia_roots():
        candidates += [p for p in sorted(root.glob("*/lib/*")) if _LIB[kind].match(p.name)]
    for home in _cuda_homes():
        for sub in ("lib64", "lib"):
            candidates += [p for p in sorted((home / sub).glob("*")) if _LIB[kind].match(p.name)]
    # A versioned name (libcublas.so.13) is what the loader records; prefer torch's major.
    candidates.sort(
        key=lambda p: (not (cuda_major and p.name.endswith(f".so.{cuda_major}")), p.name.count("."))
    )
    if not candidates:
        raise NativeBuildError(
            f"lib{kind} not found: not mapped in this process, not in the nvidia wheels "
            f"({', '.join(map(str, _nvidia_roots())) or 'none'}), not under "
            f"{', '.join(map(str, _cuda_homes()))}"
        )
    return str(candidates[0])


def plan_build() -> BuildPlan:
    """Find compiler, headers and libraries (raises ``NativeBuildError`` with what is missing)."""
    import torch

    if not torch.version.cuda:
        raise NativeBuildError(f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)")
    if torch.cuda.is_available():
        # Maps torch's libcudart/libcublas, so the build links exactly the libraries torch runs with.
        torch.cuda.init()
        # On failure, discovery below still finds a library or says where it looked.
        with contextlib.suppress(RuntimeError):
            torch.cuda.current_blas_handle()
    compiler = resolve_compiler()
    if not (os.path.exists(compiler) or shutil.which(compiler)):
        raise NativeBuildError(f"C++ compiler {compiler!r} not found (set {CXX_ENV_VAR} or CXX)")
    torch_include, torch_lib = _torch_dirs()
    if not (Path(torch_include) / "torch/csrc/inductor/aoti_torch/c/shim.h").is_file():
        raise NativeBuildError(f"torch's AOTI C shim header is missing under {torch_include}")
    major = torch.version.cuda.split(".")[0]
    includes = resolve_include_dirs(candidate_include_dirs())
    libraries = (find_library("cublas", major), find_library("cudart", major))
    return BuildPlan(
        compiler=compiler,
        source=SOURCE,
        include_dirs=(torch_include, *includes),
        torch_lib_dir=torch_lib,
        libraries=tuple(os.path.realpath(p) for p in libraries),
    )


def _file_stamp(path: str) -> list[object]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns]


def _build_identity(plan: BuildPlan, headers: Iterable[str], libraries: Sequence[str]) -> dict[str, Any]:
    """What a build's output depends on, for its cache key: source, compiler identity, flags, header dirs,
    the named headers and libraries as found (size and mtime), and torch's version."""
    import torch

    return {
        "source_sha256": source_digest(plan.source),
        "compiler": compiler_identity(plan.compiler),
        "flags": list(plan.flags),
        "include_dirs": list(plan.include_dirs),
        "headers": [
            _file_stamp(str(Path(d) / h))
            for h in headers
            for d in plan.include_dirs
            if (Path(d) / h).is_file()
        ],
        "libraries": [_file_stamp(p) for p in libraries],
        "torch": torch.__version__,
    }


def _torch_libraries(plan: BuildPlan) -> list[str]:
    return [str(Path(plan.torch_lib_dir) / f"lib{name}.so") for name in plan.torch_libraries]


def library_key(plan: BuildPlan) -> str:
    """Content key of one build: source, compiler identity, flags, header dirs, libraries."""
    import torch

    identity = _build_identity(plan, REQUIRED_HEADERS, [*plan.libraries, *_torch_libraries(plan)])
    return make_key({"kind": "native-mm-out", "schema": KEY_SCHEMA, **identity, "cuda": torch.version.cuda})


def native_cache() -> ArtifactCache:
    return ArtifactCache(default_cache_dir() / "native")


def _compile(plan: BuildPlan, what: str = "the native mm_out shim") -> bytes:
    with tempfile.TemporaryDirectory(prefix="refimpl-native-") as tmp:
        output = os.path.join(tmp, plan.soname)
        command = plan.command(output)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            text = (done.stderr or done.stdout).strip()
            raise NativeBuildError(
                f"compiling {what} failed (exit {done.returncode}):\n  {' '.join(command)}\n"
                + "\n".join(text.splitlines()[-40:])
            )
        return Path(output).read_bytes()


_LOCK = threading.Lock()
_STATUS: NativeStatus | None = None


def build_library(*, cache: ArtifactCache | None = None, force: bool = False) -> NativeStatus:
    """Build (or find in the cache) the native shim; never raises: the status says why it is missing.

    The result is remembered for the process (``force`` re-plans and rebuilds if needed).
    """
    global _STATUS
    with _LOCK:
        if _STATUS is not None and not force:
            return _STATUS
        _STATUS = _build(cache)
        return _STATUS


def _build(cache: ArtifactCache | None) -> NativeStatus:
    if os.environ.get(DISABLE_ENV_VAR, "").strip() not in ("", "0"):
        return NativeStatus(False, f"disabled by {DISABLE_ENV_VAR}={os.environ[DISABLE_ENV_VAR]}")
    import torch

    if not torch.version.cuda:
        return NativeStatus(
            False, f"not built: torch {torch.__version__} is a CPU build (no CUDA, no cuBLAS)"
        )
    if not torch.cuda.is_available():
        return NativeStatus(False, f"not built: torch {torch.__version__} sees no CUDA device")
    return _cached_build(cache, plan_build, library_key, "native mm_out shim")


def _cached_build(
    cache: ArtifactCache | None,
    plan_of: Callable[[], BuildPlan],
    key_of: Callable[[BuildPlan], str],
    what: str,
) -> NativeStatus:
    """Plan, key and compile (or find in the cache) one native library; a failure is the status's reason."""
    import torch

    try:
        plan = plan_of()
        key = key_of(plan)
        result = (cache or native_cache()).get_or_build(
            key,
            lambda: _compile(plan, f"the {what}"),
            describe={"what": what, "command": plan.command("<out>"), "torch": torch.__version__},
        )
    except NativeBuildError as exc:
        return NativeStatus(False, f"not built: {exc}")
    except (OSError, subprocess.SubprocessError) as exc:
        return NativeStatus(False, f"not built: {type(exc).__name__}: {exc}")
    return NativeStatus(True, "", str(result.path), key, result.hit, result.build_seconds)


# ------------------------------------------------------------------------------------ the Python entry


def _python_include_dirs() -> list[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    return list(dict.fromkeys(p for p in (paths.get("include"), paths.get("platinclude")) if p))


def plan_entry_build(source: Path = ENTRY_SOURCE) -> BuildPlan:
    """The extension module's build: Python's and torch's headers only (no CUDA), linked against
    libtorch_python (``THPVariableClass``), libtorch_cpu and libc10. Works on CPU torch too."""
    import torch

    compiler = resolve_compiler()
    if not (os.path.exists(compiler) or shutil.which(compiler)):
        raise NativeBuildError(f"C++ compiler {compiler!r} not found (set {CXX_ENV_VAR} or CXX)")
    torch_include, torch_lib = _torch_dirs()
    include_dirs = [
        torch_include,
        str(Path(torch_include) / "torch/csrc/api/include"),
        *_python_include_dirs(),
    ]
    missing = [h for h in ENTRY_HEADERS if not any((Path(d) / h).is_file() for d in include_dirs)]
    if missing:
        raise NativeBuildError(
            f"headers for the Python entry not found: {', '.join(missing)}; "
            f"searched: {', '.join(include_dirs)}"
            + (
                " (install this Python's development headers, e.g. python3-dev)"
                if "Python.h" in missing
                else ""
            )
        )
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return BuildPlan(
        compiler=compiler,
        source=source,
        include_dirs=tuple(include_dirs),
        torch_lib_dir=torch_lib,
        libraries=(),
        flags=(*ENTRY_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}"),
        torch_libraries=("torch_python", "torch_cpu", "c10"),
        soname=f"{ENTRY_MODULE}.so",
        no_undefined=False,
    )


def entry_key(plan: BuildPlan) -> str:
    """Content key of the entry's build: source, compiler, flags, headers, libraries, torch and Python."""
    import sysconfig

    return make_key(
        {
            "kind": "native-mm-out-entry",
            "schema": ENTRY_KEY_SCHEMA,
            "module": ENTRY_MODULE,
            **_build_identity(plan, ENTRY_HEADERS, _torch_libraries(plan)),
            "python": [sys.version, sysconfig.get_config_var("EXT_SUFFIX")],
        }
    )


_ENTRY_LOCK = threading.Lock()
_ENTRY_STATUS: NativeStatus | None = None


def build_entry(*, cache: ArtifactCache | None = None, force: bool = False) -> NativeStatus:
    """Build (or find in the cache) the Python entry module; never raises: the status says why it is
    missing. Needs no CUDA (the tests build it on CPU torch); remembered for the process unless ``force``
    or a ``cache`` is given."""
    global _ENTRY_STATUS
    if cache is not None:
        return _build_entry(cache)
    with _ENTRY_LOCK:
        if _ENTRY_STATUS is None or force:
            _ENTRY_STATUS = _build_entry(None)
        return _ENTRY_STATUS


def _build_entry(cache: ArtifactCache | None) -> NativeStatus:
    if os.environ.get(ENTRY_DISABLE_ENV_VAR, "").strip() not in ("", "0"):
        return NativeStatus(False, f"disabled by {ENTRY_DISABLE_ENV_VAR}={os.environ[ENTRY_DISABLE_ENV_VAR]}")

    return _cached_build(cache, plan_entry_build, entry_key, "native mm_out Python entry")
