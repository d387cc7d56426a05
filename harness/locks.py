"""Per-GPU exclusive locks across processes (pytest-xdist workers, parallel bench runs) and threads.

NVML's PCIe byte counters are device-wide: two measurements on one GPU at once would count each other's
traffic. ``gpu_lock(uuid)`` serialises them with an ``fcntl.flock`` on one file per GPU UUID. The lock is
re-entrant within a thread (a bench that holds it may call a meter that takes it again) and exclusive
between threads of one process, since flock alone would not order two threads sharing one open file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import settings

LOCK_DIR_ENV = settings.LOCK_DIR.name
_POLL_S = 0.01


def lock_dir() -> Path:
    """Shared by every process of one user on one host (override with $CONFORMANCE_LOCK_DIR)."""
    configured = os.environ.get(LOCK_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"aoti-conformance-locks-{os.getuid()}"


def lock_path(uuid: str, directory: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", uuid) or "unknown"
    return (directory or lock_dir()) / f"gpu-{safe}.lock"


class LockTimeout(TimeoutError):
    """Another process held the GPU lock for longer than the caller was willing to wait."""


class _HeldLock:
    """This process's view of one lock file: a thread lock, the open file, and the re-entry depth."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.thread_lock = threading.RLock()
        self.fd: int | None = None
        self.depth = 0


_registry: dict[Path, _HeldLock] = {}
_registry_guard = threading.Lock()


def _held(path: Path) -> _HeldLock:
    with _registry_guard:
        return _registry.setdefault(path, _HeldLock(path))


@contextlib.contextmanager
def gpu_lock(uuid: str, timeout_s: float | None = None, directory: Path | None = None) -> Iterator[Path]:
    """Hold the exclusive lock of GPU ``uuid``; wait at most ``timeout_s`` (None: forever)."""
    held = _held(lock_path(uuid, directory))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if not held.thread_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
        raise LockTimeout(f"GPU {uuid}: another thread of this process held {held.path} for {timeout_s} s")
    try:
        if held.depth == 0:
            held.fd = _flock(held.path, deadline, uuid)
        held.depth += 1
        try:
            yield held.path
        finally:
            held.depth -= 1
            if held.depth == 0 and held.fd is not None:
                fcntl.flock(held.fd, fcntl.LOCK_UN)
                os.close(held.fd)
                held.fd = None
    finally:
        held.thread_lock.release()


def _flock(path: Path, deadline: float | None, uuid: str) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"GPU {uuid}: lock {path} is held by another process ({_holder(path)})"
                    ) from None
                time.sleep(_POLL_S)
        # Who holds it, for the timeout message of the next waiter; purely informational.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _holder(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip() or "holder unknown"
    except OSError:
        return "holder unknown"
