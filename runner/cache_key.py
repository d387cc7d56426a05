"""``python -m runner.cache_key [--backend module:attr] [--backend-path DIR] [--json]``: the key under which
a CI system caches the artifact directory (``$CONFORMANCE_CACHE_DIR``) between runs.

The artifact cache is content-addressed (``reference_impl/artifact_cache.py``): a restored cache
can only miss, never hand out a wrong program. What the key decides is which saved cache a job restores and
when a new one is saved (a CI cache is immutable once saved under its key). So it covers what decides the
compiled programs, and nothing that changes from one checkout to the next (no paths, no timestamps): the
backend (its spec and every file of its package), the model zoo's sources (``conformance/models``), torch's
version (``$CONFORMANCE_TORCH``, the pin the front door installs, where this Python has no torch), the C++
compiler (``$CXX`` or ``g++``, by its ``--version``), and the Python and CPU architecture the programs are
built for.

Standard library only, and the backend package is located, never imported (``harness`` does not import a
backend: ``tests/project/test_import_graph.py``): it runs with any Python, before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import settings
from harness.backend_loader import backend_path, backend_spec

#: Bumped when what the key covers changes, so old caches are not restored under the new meaning.
KEY_VERSION = 1
ROOT = Path(__file__).resolve().parents[1]
#: The model zoo: most programs a run compiles are its models (and the metamorphic chapter's variants).
ZOO = ROOT / "conformance" / "models"
#: The front door's torch pin (noxfile.py's TORCH_SPEC), used where this interpreter has no torch.
TORCH_PIN_ENV = settings.TORCH.name
TORCH_PIN_DEFAULT = "torch==2.13.0"


def tree_digest(roots: Sequence[Path]) -> str:
    """SHA-256 over every file under ``roots`` (relative name and bytes; ``__pycache__`` left out): the
    same sources give the same digest wherever they are checked out and whenever they were written."""
    digest = hashlib.sha256()
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def backend_roots(spec: str, search: Sequence[str]) -> list[Path]:
    """Where the package of backend ``module:attr`` lives (``search`` first, as ``--backend-path`` is),
    found without importing it; empty when it is not found."""
    top = spec.partition(":")[0].split(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, list(search)) if search else None
    found = found or importlib.util.find_spec(top)  # a top-level name: located, not executed
    if found is None:
        return []
    if found.submodule_search_locations:
        return sorted(Path(p) for p in found.submodule_search_locations)
    return [Path(found.origin)] if found.origin else []


def torch_version() -> str:
    """The installed torch's version (its CUDA build included, e.g. ``2.13.0+cu128``), read from its
    metadata without importing it; else the pin the front door would install."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "pin: " + (os.environ.get(TORCH_PIN_ENV, "").strip() or TORCH_PIN_DEFAULT)


def compiler_version() -> str:
    """The first line of ``$CXX --version`` (inductor's compiler; ``g++`` when unset), or why there is
    none."""
    cxx = os.environ.get("CXX", "").strip() or "g++"
    path = shutil.which(cxx)
    if path is None:
        return f"{cxx}: not found"
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60, env={**os.environ, "LC_ALL": "C"}
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{cxx}: cannot run ({exc})"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0] if lines else f"{cxx}: no version output (exit {done.returncode})"


def key_parts(spec: str, search: Sequence[str], zoo: Path = ZOO) -> dict[str, Any]:
    """Everything the key covers, readable (``--json`` prints it, so a cache miss can be explained)."""
    roots = backend_roots(spec, search)
    return {
        "key_version": KEY_VERSION,
        "backend": spec,
        "backend_files": tree_digest(roots) if roots else "package not found",
        "zoo": tree_digest([zoo]),
        "torch": torch_version(),
        "compiler": compiler_version(),
        "python": ".".join(platform.python_version_tuple()[:2]),
        "machine": platform.machine(),
    }


def cache_key(parts: dict[str, Any]) -> str:
    """A short hex digest of ``parts`` (canonical JSON)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.cache_key", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", help="module:attr (default: $CONFORMANCE_BACKEND or the reference)")
    parser.add_argument("--backend-path", action="append", help="directory holding the backend's package")
    parser.add_argument("--json", action="store_true", help="print what the key covers, and the key")
    args = parser.parse_args(argv)
    spec = backend_spec(args.backend)
    parts = key_parts(spec, backend_path(args.backend_path))
    if parts["backend_files"] == "package not found":
        print(
            f"warning: backend {spec!r}: its package was not found, its files are not in the key",
            file=sys.stderr,
        )
    key = cache_key(parts)
    print(json.dumps({**parts, "key": key}, indent=1, sort_keys=True) if args.json else key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
