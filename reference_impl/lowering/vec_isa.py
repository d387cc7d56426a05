"""Torch's CPU vector-ISA probe, once per machine instead of once per process.

Every process that compiles with inductor first checks which vector ISAs (AVX2, AVX-512, VNNI, AMX) both
the CPU and the C++ compiler support: for each one the CPU advertises it dry-compiles a test library, then
loads it in a child interpreter. On torch 2.11 that child imports torch: ten children of 3-4 s each, about
40 s before a process's first compile, and every pre-lowering process and suite worker paid it on a fresh
GPU machine (issue 14: ~15 % of a cold run's CPU time).

The probe's answer depends only on the machine: the CPU's flags, the compiler and torch. So the first
process runs the probes (side by side, one thread per ISA) and records the verdict under the cache root;
later processes read it. Where every ISA the CPU advertises passed, inductor is told so
(``cpp.vec_isa_ok = True``), which gives exactly the list the probes gave. Where any failed, or the verdict
cannot be had (not x86-64, torch internals moved), nothing is set and inductor probes as it always did.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from reference_impl.artifact_cache import default_cache_dir

_VERDICT_DIR = "toolchain"


def _candidates() -> list[Any] | None:
    """The ISAs torch would probe on this CPU (advertised by it), or None where we do not know how."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    try:
        from torch._inductor import cpu_vec_isa
    except ImportError:
        return None
    checker = getattr(cpu_vec_isa, "x86_isa_checker", None)
    supported = getattr(cpu_vec_isa, "supported_vec_isa_list", None)
    if checker is None or supported is None:
        return None
    flags = checker()
    return [isa for isa in supported if all(flag in flags for flag in str(isa).split())]


def _compiler() -> str:
    from torch._inductor.cpp_builder import get_cpp_compiler

    return get_cpp_compiler()


def _fingerprint(candidates: list[Any], compiler: str) -> str:
    """What the verdict depends on: the CPU's advertised ISAs, the compiler (path, size, mtime), torch and
    the interpreter that loads the test libraries."""
    parts: list[str] = [torch.__version__, torch.__file__, sys.executable, compiler]
    parts += [str(isa) for isa in candidates]
    with contextlib.suppress(OSError):
        import shutil

        resolved = shutil.which(compiler) or compiler
        stat = Path(resolved).resolve().stat()
        parts.append(f"{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _probe(candidates: list[Any]) -> list[str]:
    """Torch's own check for each candidate (``bool(isa)``: dry-compile and load), side by side."""
    from torch._inductor import config

    with config.patch({"cpp.vec_isa_ok": None}), ThreadPoolExecutor(max(1, len(candidates))) as pool:
        passed = list(pool.map(bool, candidates))
    return [str(isa) for isa, ok in zip(candidates, passed, strict=True) if ok]


def all_advertised_isas_pass(root: Path | None = None) -> bool:
    """True when every vector ISA this CPU advertises passed torch's probe with the current compiler; the
    verdict is computed once per machine (under a lock, so concurrent first processes wait for one probe)
    and kept in ``<cache root>/toolchain/``. False where it did not, or cannot be known."""
    candidates = _candidates()
    if not candidates:
        return False
    compiler = _compiler()
    directory = (root or default_cache_dir()) / _VERDICT_DIR
    path = directory / f"vec-isa-{_fingerprint(candidates, compiler)}.json"
    verdict = _read(path)
    if verdict is None:
        import fcntl

        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / f"{path.stem}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            verdict = _read(path)
            if verdict is None:
                verdict = {
                    "candidates": [str(isa) for isa in candidates],
                    "passed": _probe(candidates),
                    "compiler": compiler,
                    "torch": torch.__version__,
                }
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(verdict, indent=1))
                os.replace(tmp, path)
    return sorted(verdict["passed"]) == sorted(str(isa) for isa in candidates)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and {"passed", "candidates"} <= set(data) else None


@contextlib.contextmanager
def probed_once() -> Iterator[None]:
    """Inside: inductor skips its per-process ISA probe where this machine's verdict says every advertised
    ISA passes (the same ISA list either way). Enter it inside any ``cpp.cxx`` patch: the verdict is the
    compiler's."""
    from torch._inductor import config

    try:
        ok = config.cpp.vec_isa_ok is None and all_advertised_isas_pass()
    except Exception:  # a torch whose internals moved: inductor's own probe, as before
        ok = False
    with config.patch({"cpp.vec_isa_ok": True}) if ok else contextlib.nullcontext():
        yield
