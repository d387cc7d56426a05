"""Torch's CPU vector-ISA build checks, once per machine instead of once per process.

Every process that compiles with inductor first asks which vector ISAs (AVX2, AVX-512, VNNI, AMX, AMX-FP16)
both the CPU and the C++ compiler support: for each one the CPU advertises, ``VecISA.check_build``
dry-compiles a test library and loads it in a child interpreter, under one file lock per check. On torch
2.11 that child imports torch (3-5 s), and AMX asks two more checks after AVX-512's. Every pre-lowering
process and suite worker paid them on a fresh machine, one after another on the lock: on two H200s (a CPU
with AMX) 28 of 55 processes waited there at once, 95 s into a cold run (issue 31).

A check's answer depends only on the machine (the CPU's flags, the kernel), the compiler, torch, the
interpreter, the ISA's compile flags and the test code. So inside ``probed_once`` each answer is read from
a record under the cache root; the first process to need one runs torch's own check (under a lock, so
concurrent first processes wait for one check) and records it. Inductor's own logic (which ISAs to ask,
in which order, AMX's extra checks, what it picks) runs unchanged: only the build-and-load result is
shared. Where torch's internals moved (no ``VecISA.check_build``), or inductor is told the answer
(``cpp.vec_isa_ok``), nothing is patched and inductor does what it always did.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from reference_impl.artifact_cache import default_cache_dir

_RECORD_DIR = "toolchain"


def _compiler() -> str:
    from torch._inductor.cpp_builder import get_cpp_compiler

    return get_cpp_compiler()


@functools.cache
def _machine() -> list[str]:
    """What every answer on this machine depends on, compiler aside: torch, the interpreter that loads the
    test libraries, the kernel (AMX needs its permission) and the CPU (model and flags, as torch reads them:
    a CI cache restored on another runner must not reuse them)."""
    parts = [torch.__version__, torch.__file__, sys.executable, platform.machine(), platform.release()]
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                parts.append(" ".join(sorted(line.split(":", 1)[-1].split())))
                if line.startswith("flags"):
                    break
    return parts


def _compiler_identity(compiler: str) -> list[str]:
    parts = [compiler]
    with contextlib.suppress(OSError):
        stat = Path(shutil.which(compiler) or compiler).resolve().stat()
        parts.append(f"{stat.st_size}:{stat.st_mtime_ns}")
    return parts


def _isa_flags(isa: Any) -> str:
    """The ISA's compile flags now (AMX adds ``-mamx-fp16`` for one check and takes it back after)."""
    flags = getattr(isa, "build_arch_flags", None)
    return str(flags() if callable(flags) else getattr(isa, "_arch_flags", ""))


def record_path(isa: Any, code: str, root: Path | None = None) -> Path:
    """Where this machine's answer to ``isa.check_build(code)`` is kept."""
    parts = [*_machine(), *_compiler_identity(_compiler()), str(isa), _isa_flags(isa), code]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return (root or default_cache_dir()) / _RECORD_DIR / f"vec-isa-{digest}.json"


def shared_check(isa: Any, code: str, check: Callable[[], bool], root: Path | None = None) -> bool:
    """``check()``'s answer for ``isa`` and ``code``: recorded for this machine, or run (once: concurrent
    callers wait on the record's lock, then read it) and recorded."""
    path = record_path(isa, code, root)
    answer = _read(path)
    if answer is not None:
        return answer
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        answer = _read(path)
        if answer is None:
            answer = bool(check())
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"isa": str(isa), "flags": _isa_flags(isa), "ok": answer}, indent=1))
            os.replace(tmp, path)
    return answer


def _read(path: Path) -> bool | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = data.get("ok") if isinstance(data, dict) else None
    if not isinstance(ok, bool):
        return None
    with contextlib.suppress(OSError):  # marked used: a kept cache is pruned of what no recent run read
        os.utime(path)
    return ok


_patch_lock = threading.Lock()
_patch_depth = 0


@contextlib.contextmanager
def probed_once() -> Iterator[None]:
    """Inside: inductor's vector-ISA build checks are answered from this machine's record (run once and
    recorded where missing). Enter it inside any ``cpp.cxx`` patch: the answers are the compiler's.
    Re-entrant and thread-safe: the first in patches ``VecISA.check_build``, the last out restores it."""
    global _patch_depth
    from torch._inductor import config

    try:
        from torch._inductor.cpu_vec_isa import VecISA

        original = VecISA.__dict__["check_build"]
    except (ImportError, KeyError):  # a torch whose internals moved: inductor's own checks, as before
        original = None
    if original is None or config.cpp.vec_isa_ok is not None:
        yield
        return
    with _patch_lock:
        if _patch_depth == 0:
            torch_check = original

            def check_build(self: Any, code: str) -> bool:
                return shared_check(self, code, lambda: torch_check(self, code))

            check_build.torch_check = torch_check  # type: ignore[attr-defined]
            VecISA.check_build = check_build  # type: ignore[method-assign]
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                VecISA.check_build = VecISA.check_build.torch_check  # type: ignore[attr-defined]


def warm_in_background() -> threading.Thread:
    """Ask inductor's vector-ISA questions now, in a daemon thread, recording the answers for the machine.

    On a fresh machine inductor's answers are a chain of about ten checks (3-8 s each on torch 2.11), each
    asked only once the one before passed, and every process's first compile waits for the chain. So the
    thread first learns which checks the chain would ask if all passed (``_plan``, in a throwaway
    interpreter) and runs them side by side, as many at once as the machine has cores free
    (``CoreRoom``), then lets inductor ask for real: it finds its answers recorded. A check the chain
    would not have asked costs only its time. A process that will compile soon and has little else to
    do (the toolchain preflight's child) starts it first thing. Errors are left to the compile that asks
    the same questions (it reports them).
    """

    def ask() -> None:
        from torch._inductor.cpu_vec_isa import valid_vec_isa_list

        with contextlib.suppress(Exception):
            _speculate(_plan())
        with contextlib.suppress(Exception), probed_once():
            valid_vec_isa_list()

    thread = threading.Thread(target=ask, name="vec-isa-warm", daemon=True)
    thread.start()
    return thread


def _ask_optimistically() -> list[list[str]]:
    """(class, flags, code) of every check inductor's chain asks on this machine when each one passes. It
    changes inductor's per-process state (cached answers, flags): run it only in a throwaway interpreter."""
    from torch._inductor import config, cpu_vec_isa

    asked: list[list[str]] = []

    def optimistic(self: Any, code: str) -> bool:
        asked.append([type(self).__name__, _isa_flags(self), code])
        return True

    cpu_vec_isa.VecISA.check_build = optimistic  # type: ignore[method-assign]
    with config.patch({"cpp.vec_isa_ok": None}):
        cpu_vec_isa.valid_vec_isa_list()
    return asked


def _plan(timeout_s: float = 180.0) -> list[list[str]]:
    """``_ask_optimistically`` in a child interpreter (this module's ``--plan``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-m", __name__, "--plan"], capture_output=True, text=True,
                          env=env, timeout=timeout_s, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Where Linux says how many tasks are runnable right now (the fourth field: runnable/total).
LOADAVG = Path("/proc/loadavg")
#: Seconds between two looks for a free core.
ROOM_POLL_S = 0.05
#: Seconds a started check gets to show up as runnable before the next one is let in on the count.
ROOM_SETTLE_S = 0.2
#: The longest a check waits for a free core while none of the others runs: the chain must go on.
ROOM_WAIT_S = 5.0


def runnable_now(loadavg: Path = LOADAVG) -> int | None:
    """The machine's runnable tasks right now, less the reader; None where it cannot be read."""
    try:
        return max(0, int(loadavg.read_text().split()[3].partition("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return None


class CoreRoom:
    """Lets checks start only while the machine has a core free: fewer runnable tasks than ``limit`` (its
    cores less one in eight, what a burst of the suite's case workers may take at once). Side by side
    beside a run's twelve busy case workers, ten checks put 24 runnable tasks on 16 cores (issue 31). A
    check waits at most ``wait_s`` while none of its siblings runs, so the chain goes on on a full
    machine. Where the count cannot be read, every check starts at once, as before."""

    def __init__(self, limit: int | None = None, count: Callable[[], int | None] = runnable_now,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wait_s: float = ROOM_WAIT_S) -> None:  # fmt: skip
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.limit = limit if limit is not None else max(1, cores - max(1, cores // 8))
        self.count, self.clock, self.sleep, self.wait_s = count, clock, sleep, wait_s
        self.running = 0
        self._lock = threading.Lock()
        self._admit = threading.Lock()  # one admission at a time: each sees the one before it

    @contextlib.contextmanager
    def core(self) -> Iterator[None]:
        """Hold a core for the block: entered once the machine has one free."""
        with self._admit:
            since = self.clock()
            while True:
                busy = self.count()
                if busy is None or busy < self.limit:
                    break
                with self._lock:
                    alone = self.running == 0
                if alone and self.clock() - since >= self.wait_s:
                    break
                self.sleep(ROOM_POLL_S)
            with self._lock:
                self.running += 1
            if busy is not None:
                self.sleep(ROOM_SETTLE_S)  # its compiler shows in the next count
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1


def _speculate(plan: list[list[str]], room: CoreRoom | None = None) -> None:
    """Run the checks of ``plan`` side by side, as ``room`` lets them start (default: a ``CoreRoom`` of
    this machine's), each recorded as the chain's own would be (same ISA name, flags and code); one whose
    instance cannot be rebuilt with those flags is left to the chain."""
    from torch._inductor import cpu_vec_isa

    current = cpu_vec_isa.VecISA.__dict__["check_build"]
    torch_check = getattr(current, "torch_check", current)  # torch's own, also while probed_once patches
    room = room or CoreRoom()

    def one(name: str, flags: str, code: str) -> None:
        isa = getattr(cpu_vec_isa, name)()
        isa._arch_flags = flags
        if hasattr(isa, "_is_avx512_bf16_supported"):  # else build_arch_flags would add its flag again
            isa._is_avx512_bf16_supported = False
        if _isa_flags(isa) == flags and _read(record_path(isa, code)) is None:  # recorded: no core needed
            with room.core():
                shared_check(isa, code, lambda: torch_check(isa, code))

    with ThreadPoolExecutor(max(1, len(plan))) as pool:
        list(pool.map(lambda step: one(*step), plan))


if __name__ == "__main__" and sys.argv[1:] == ["--plan"]:
    print(json.dumps(_ask_optimistically()))
