"""The adapter's cache of compiled packages, by content: one compile per program across processes and runs.

Each case worker lowers the programs it needs; without a cache every worker compiled the shared ones again
(15 workers, 15 compiles of one program at once), and the second check mode compiled them all a second time
(``AOTI_RUNTIME_CHECK_INPUTS`` is read when a model first runs, not when it is compiled, so both modes
share a package). The key is a SHA-256 over what decides the compiled bytes: every method's exported
program (graph code, signature, range constraints, the bytes of its parameters, buffers and constants, the
example inputs' dtypes, shapes and strides), the target device, AOTInductor's options, torch's build and the
C++ compiler. A wrong entry can therefore only come from a key that misses something, never from a stale
file: entries are written whole (a temporary file, then ``os.replace``) and read back only when their
SHA-256 matches. Concurrent builders of one key take a per-key ``fcntl`` lock: the first compiles, the others
wait and read its package.

Layout under ``$CONFORMANCE_CACHE_DIR/torch_aoti/`` (default ``~/.cache/aoti-conformance/torch_aoti``)::

    <key>.pt2      the package
    <key>.sha256   its digest, written after it
    locks/<key>.lock
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import torch

import settings

CACHE_ENV = settings.CACHE_DIR.name
#: Bumped when what the key covers changes.
KEY_VERSION = "torch_aoti/1"


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    return settings.CACHE_DIR.get(env) / "torch_aoti"


def _tensor(value: torch.Tensor) -> dict[str, Any]:
    # Flat first: a 0-dim tensor (a scalar buffer) cannot be viewed as bytes of another element size.
    data = value.detach().cpu().contiguous().reshape(-1)
    raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return {
        "dtype": str(value.dtype),
        "shape": list(value.shape),
        "stride": list(value.stride()),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def _value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _value(v) for k, v in sorted(value.items(), key=lambda item: str(item[0]))}
    return repr(value)


def program_document(exported: torch.export.ExportedProgram) -> dict[str, Any]:
    """What of one exported program decides AOTInductor's output."""
    args, kwargs = exported.example_inputs
    return {
        "graph": str(exported.graph_module.code),
        "signature": str(exported.graph_signature),
        "range_constraints": sorted(f"{k}: {v}" for k, v in exported.range_constraints.items()),
        "state_dict": _value(dict(exported.state_dict)),
        "constants": _value(dict(exported.constants)),
        "example_inputs": _value([list(args), dict(kwargs)]),
    }


@cache
def _compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return f"{cxx}: {done.stdout.splitlines()[0] if done.stdout else done.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{cxx}: {type(exc).__name__}"


def package_key(
    programs: Mapping[str, torch.export.ExportedProgram], device: str, options: Mapping[str, Any]
) -> str:
    document = {
        "version": KEY_VERSION,
        "device": device,
        "options": {str(k): repr(v) for k, v in sorted(options.items())},
        "methods": {name: program_document(ep) for name, ep in programs.items()},
        "torch": [torch.__version__, getattr(torch.version, "git_version", None), torch.version.cuda],
        "python": [platform.python_version(), platform.machine()],
        "compiler": _compiler(),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()


class PackageCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_dir()

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.root / f"{key}.pt2", self.root / f"{key}.sha256"

    def load(self, key: str) -> bytes | None:
        """The package of ``key`` when its file is whole (its digest matches), else None."""
        package, digest = self._paths(key)
        try:
            data, expected = package.read_bytes(), digest.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != expected:
            return None
        for path in (package, digest):  # marked used now: a kept cache is pruned of what no run used
            with contextlib.suppress(OSError):
                os.utime(path)
        return data

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(locks / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        """The package of ``key`` and whether it came from the cache; built (and kept) when missing.
        A build that raises keeps nothing."""
        data = self.load(key)
        if data is not None:
            return data, True
        with self._locked(key):
            data = self.load(key)
            if data is not None:  # another process built it while this one waited
                return data, True
            data = build()
            package, digest = self._paths(key)
            self._write(package, data)
            self._write(digest, hashlib.sha256(data).hexdigest().encode("ascii"))
            return data, False
