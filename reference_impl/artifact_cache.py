"""A content-addressed cache of compiled artifacts, safe for concurrent pytest-xdist workers.

Key: SHA-256 over a canonical JSON document describing everything that decides the compiled bytes — the
exported program (graph code, signature, every state-dict / constant tensor's bytes, example input shapes,
dtypes and strides, range constraints), the target device, the compile options (the view pass on/off,
inductor configs, SDPA backend, grad mode), and the toolchain (torch and CUDA versions, the resolved C++
compiler path and its ``--version`` output). A warm run finds the artifact and does not recompile.

Layout under the root (``$CONFORMANCE_CACHE_DIR`` or ``~/.cache/aoti-conformance``)::

    v1/<key[:2]>/<key>.bin       the artifact bytes
    v1/<key[:2]>/<key>.sha256    "<hex digest> <size>\\n" of the .bin, written after it
    v1/<key[:2]>/<key>.json      free-form description (what was built, when); informational only
    v1/locks/<key>.lock          per-key fcntl lock file (never deleted: deleting lock files breaks locking)

Entries are written atomically (temp file in the same directory, fsync, ``os.replace``). A reader verifies
size and digest; a corrupt or half-written entry (mismatch, truncation, missing digest) is removed and rebuilt
under the key's lock. Concurrent builders of one key serialise on the lock: the first builds, the others wait
and then read its result, so one key is compiled once.

The same store also holds **source memos** (``preprocess``): keyed by what export reads rather than what it
produces, each names the artifact key of one traced source, so a warm lowering need not export to find it.

This module imports nothing heavy at import time (torch is imported lazily by the keying helpers). It is a
floor of the backend, under its wings: the lowering (preprocess, source keys, the vector-ISA verdict, the
preflight) and the native shim's build (``shims/native/build.py``) both keep their products here, so it
imports no other module of ``reference_impl``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import settings

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX: atomic writes still hold, builds may duplicate
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    import torch

__all__ = [
    "CACHE_ENV_VAR",
    "KEY_SCHEMA_VERSION",
    "ArtifactCache",
    "CacheResult",
    "compiler_identity",
    "default_cache",
    "default_cache_dir",
    "inductor_cache_env",
    "make_key",
    "program_fingerprint",
    "resolve_cxx",
    "toolchain_fingerprint",
    "value_digest",
]

CACHE_ENV_VAR = settings.CACHE_DIR.name
KEY_SCHEMA_VERSION = 1
_LAYOUT = "v1"
_KEY = re.compile(r"[0-9a-f]{64}")


def default_cache_dir() -> Path:
    """``$CONFORMANCE_CACHE_DIR`` as ``settings.CACHE_DIR`` resolves it for every reader (the suite's
    cleaning and stamps name the same directory), else ``~/.cache/aoti-conformance``."""
    return settings.CACHE_DIR.get()


def inductor_cache_env() -> dict[str, str]:
    """Environment that keeps inductor's own cache (``TORCHINDUCTOR_CACHE_DIR``) beside ours, persistently.

    Inductor's default lives in ``/tmp/torchinductor_$USER``, which a fresh CI machine starts without; its CPU
    vector-ISA probe libraries are compiled into it on first use in every process that needs them (NOTES.md).
    Set these variables before torch starts (nox session env, or the CI job) — not from inside a process.
    """
    return {"TORCHINDUCTOR_CACHE_DIR": str(default_cache_dir() / "inductor")}


def default_cache() -> ArtifactCache:
    """A cache at ``default_cache_dir()`` (read from the environment at call time)."""
    return ArtifactCache(default_cache_dir())


@dataclass(frozen=True)
class CacheResult:
    """What ``get_or_build`` returned: the bytes, whether they were cached, and how long a build took."""

    data: bytes
    hit: bool
    key: str
    path: Path | None
    build_seconds: float = 0.0
    replaced_corrupt: bool = False  # an invalid entry was found, removed and rebuilt


class ArtifactCache:
    """Bytes by key on disk. ``get_or_build(key, build)`` is the one entry point most callers need."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, lock_timeout_s: float = 3600.0) -> None:
        self._root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.lock_timeout_s = float(lock_timeout_s)

    def __repr__(self) -> str:
        return f"ArtifactCache({str(self._root)!r})"

    @property
    def root(self) -> Path:
        return self._root

    # -- paths

    @staticmethod
    def check_key(key: str) -> str:
        if not isinstance(key, str) or _KEY.fullmatch(key) is None:
            raise ValueError(f"cache key must be 64 lowercase hex digits (a SHA-256), got {key!r}")
        return key

    def entry_path(self, key: str) -> Path:
        self.check_key(key)
        return self._root / _LAYOUT / key[:2] / f"{key}.bin"

    def digest_path(self, key: str) -> Path:
        return self.entry_path(key).with_suffix(".sha256")

    def description_path(self, key: str) -> Path:
        return self.entry_path(key).with_suffix(".json")

    def lock_path(self, key: str) -> Path:
        self.check_key(key)
        return self._root / _LAYOUT / "locks" / f"{key}.lock"

    # -- reading

    def _read(self, key: str) -> tuple[str, bytes | None]:
        """("valid", data) | ("missing", None) | ("corrupt", None). Never modifies anything."""
        entry, digest_file = self.entry_path(key), self.digest_path(key)
        try:
            data = entry.read_bytes()
        except FileNotFoundError:
            return ("corrupt" if digest_file.exists() else "missing"), None
        try:
            recorded = digest_file.read_text(encoding="ascii").split()
        except (FileNotFoundError, UnicodeDecodeError):
            return "corrupt", None
        if len(recorded) != 2 or not recorded[1].isdigit():
            return "corrupt", None
        hex_digest, size = recorded[0], int(recorded[1])
        if len(data) != size or hashlib.sha256(data).hexdigest() != hex_digest:
            return "corrupt", None
        return "valid", data

    def load(self, key: str) -> bytes | None:
        """The verified bytes of ``key``, or None if missing or invalid (an invalid entry is left as is). A
        valid entry's files are marked used now (their mtime): a cache kept between CI runs is pruned of
        what no recent run used (``python -m harness.caches --prune-unused-runs N``)."""
        state, data = self._read(key)
        if state != "valid":
            return None
        for path in (self.entry_path(key), self.digest_path(key), self.description_path(key)):
            with contextlib.suppress(OSError):  # read-only or vanished: the entry is still good
                os.utime(path)
        return data

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.load(key) is not None

    # -- writing

    def _remove(self, key: str) -> None:
        for path in (self.digest_path(key), self.entry_path(key), self.description_path(key)):
            path.unlink(missing_ok=True)

    @staticmethod
    def _atomic_write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def _write(self, key: str, data: bytes, describe: Mapping[str, Any] | None) -> None:
        # Data first, digest last: a reader that sees the digest sees the complete data it describes.
        self._atomic_write(self.entry_path(key), data)
        digest = f"{hashlib.sha256(data).hexdigest()} {len(data)}\n".encode("ascii")
        self._atomic_write(self.digest_path(key), digest)
        if describe is not None:
            text = json.dumps(dict(describe), sort_keys=True, indent=1, default=repr)
            self._atomic_write(self.description_path(key), text.encode("utf-8"))

    def put(self, key: str, data: bytes, *, describe: Mapping[str, Any] | None = None) -> Path:
        """Store ``data`` under ``key`` (replacing any entry) and return the entry path."""
        data = _as_bytes(data, what="put data")
        with self._locked(key):
            self._remove(key)
            self._write(key, data, describe)
        return self.entry_path(key)

    # -- locking

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        lock_file = self.lock_path(key)
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                deadline = time.monotonic() + self.lock_timeout_s
                delay = 0.01
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as error:
                        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                            raise
                        if time.monotonic() >= deadline:
                            raise TimeoutError(
                                f"waited {self.lock_timeout_s:.0f} s for cache lock {lock_file}; another "
                                "process is still building this artifact (or died holding the lock's fd)"
                            ) from None
                        time.sleep(delay)
                        delay = min(delay * 2, 0.5)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    # -- the entry point

    def get_or_build(
        self,
        key: str,
        build: Callable[[], bytes],
        *,
        describe: Mapping[str, Any] | None = None,
    ) -> CacheResult:
        """The bytes for ``key``: from the cache if a valid entry exists, else ``build()`` (then stored).

        Concurrent callers with one key serialise on a per-key lock; exactly one of them builds.
        A build that raises stores nothing and releases the lock.
        """
        self.check_key(key)
        state, data = self._read(key)  # lock-free fast path: a verified entry is immutable
        if state == "valid":
            return CacheResult(data, True, key, self.entry_path(key))  # type: ignore[arg-type]
        with self._locked(key):
            state, data = self._read(key)
            if state == "valid":  # another process built it while we waited
                return CacheResult(data, True, key, self.entry_path(key))  # type: ignore[arg-type]
            replaced = state == "corrupt"
            if replaced:
                self._remove(key)
            start = time.perf_counter()
            built = _as_bytes(build(), what="build() result")
            seconds = time.perf_counter() - start
            # The build's seconds beside the description: what a cold run spent compiling, entry by entry.
            self._write(key, built, None if describe is None else {**describe, "build_s": round(seconds, 3)})
            return CacheResult(built, False, key, self.entry_path(key), seconds, replaced)


def _as_bytes(value: object, *, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, got {type(value).__name__}")


# --- keys ------------------------------------------------------------------------------------------------


def make_key(document: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``document`` (sorted keys; non-JSON values by ``repr``)."""
    text = json.dumps(
        {"schema": KEY_SCHEMA_VERSION, **document}, sort_keys=True, separators=(",", ":"), default=repr
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _tensor_digest(tensor: torch.Tensor) -> dict[str, Any]:
    import torch

    value = tensor.detach()
    info: dict[str, Any] = {
        "dtype": str(value.dtype),
        "shape": list(value.shape),
        "stride": list(value.stride()) if value.layout == torch.strided else None,
        "device": value.device.type,
    }
    if value.device.type == "meta" or value.layout != torch.strided:
        info["sha256"] = None
        return info
    info["sha256"] = hashlib.sha256(_tensor_bytes(value)).hexdigest()
    return info


def _tensor_bytes(value: torch.Tensor) -> bytes:
    import torch

    if value.numel() == 0:
        return b""
    raw = value.to("cpu").contiguous().reshape(-1).view(torch.uint8)
    try:
        return raw.numpy().tobytes()
    except (ImportError, RuntimeError, TypeError):  # torch built or installed without numpy
        return bytes(raw.clone().untyped_storage())


def value_digest(value: Any) -> Any:
    """A JSON-ready digest of a (nested) value: tensors by dtype, shape, stride, device and bytes."""
    import torch

    if isinstance(value, torch.Tensor):
        return _tensor_digest(value)
    if isinstance(value, (list, tuple)):
        return [value_digest(v) for v in value]
    if isinstance(value, dict):
        return {str(k): value_digest(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def program_fingerprint(exported: torch.export.ExportedProgram) -> dict[str, Any]:
    """Everything of an exported program that decides what AOTInductor generates for it."""
    state = {name: _tensor_digest(t) for name, t in sorted(exported.state_dict.items())}
    constants = {name: value_digest(v) for name, v in sorted(exported.constants.items())}
    example = exported.example_inputs
    return {
        "graph": str(exported.graph_module.code),
        "signature": str(exported.graph_signature),
        "range_constraints": sorted(f"{k}: {v}" for k, v in exported.range_constraints.items()),
        "state_dict": state,
        "constants": constants,
        "example_inputs": value_digest(example) if example is not None else None,
    }


def resolve_cxx(cxx: str | None = None) -> str:
    """The C++ compiler inductor will use: ``cxx``, else ``torch._inductor.config.cpp.cxx`` where inductor
    is imported (it reads ``$CXX`` when first imported), else ``$CXX``, else ``g++``; as an absolute path
    if on PATH."""
    candidate = cxx
    # Only an imported inductor config can differ from $CXX (a process may set it); importing it just to
    # read it cost every warm case worker most of a second that no memo-hit lowering needed.
    config = sys.modules.get("torch._inductor.config") if candidate is None else None
    if config is not None:
        try:
            configured = config.cpp.cxx
            names = configured if isinstance(configured, (list, tuple)) else (configured,)
            candidate = next((c for c in reversed(names) if c), None)
        except Exception:  # pragma: no cover - config layout changed
            candidate = None
    candidate = candidate or os.environ.get("CXX") or "g++"
    return shutil.which(candidate) or candidate


@functools.lru_cache(maxsize=16)
def _version_output(path: str, _stamp: tuple[int, int]) -> tuple[int | None, str]:
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "LC_ALL": "C"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"<cannot run: {error}>"
    return done.returncode, (done.stdout + done.stderr).strip()


def compiler_version(path: str) -> tuple[int | None, str]:
    """``path --version``: exit code (None if it cannot run) and output; cached until the file changes."""
    try:
        stat = os.stat(path)
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = (0, 0)
    return _version_output(path, stamp)


def compiler_identity(cxx: str | None = None) -> dict[str, Any]:
    """Resolved compiler path, its real path, and its ``--version`` exit code and output."""
    path = resolve_cxx(cxx)
    real = os.path.realpath(path) if os.path.exists(path) else None
    returncode, version = compiler_version(path)
    return {"path": path, "realpath": real, "version_rc": returncode, "version": version}


def toolchain_fingerprint(cxx: str | None = None) -> dict[str, Any]:
    """torch build, CUDA version, Python and platform, and the compiler identity."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "compiler": compiler_identity(cxx),
    }
