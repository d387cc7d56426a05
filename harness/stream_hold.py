"""Hold a CUDA stream until the host lets it go: a wait in the GPU's front end (the default), or a spin.

A stream-ordering case delays the caller's stream before a call, so that a backend that returns before its
work is done hands back outputs that a consumer on another stream reads unfinished. ``held(stream,
at_most_s)`` does it one of two ways, as ``$CONFORMANCE_STREAM_HOLDS`` says:

* ``front-end`` (the default): the stream waits in the GPU's front end (the driver's
  ``cuStreamWaitValue32`` on a word of pinned host memory; no SM runs, no time slice is spent spinning)
  until the ``with`` block ends, or ``at_most_s`` passed: a backend that waits for the stream inside its
  call, as a correct one must before it hands back GPU outputs, is let go then. The time limit is kept by
  a small process of its own (``_TIMER``), not a thread: a backend may wait inside C without releasing the
  GIL, and a thread of this process could then never run. The stream stays held until the consumer's read
  is queued, however long the host took. Where the driver lacks what it needs (no stream memory
  operations, no registration of host memory), a hold spins.
* ``spin``: a spin kernel of ``at_most_s`` (``torch.cuda._sleep``), as the cases did before. It occupies
  the GPU while it waits: fifteen case workers share one GPU by time slices, and on one H200 the cases'
  900 spins of 25 ms kept the GPU busy for most of a warm run's case window, every other worker's copies
  and syncs waiting behind them; front-end holds took 2-4 s off that phase
  (``examples/runs/2026-11-29-stream-holds-H200/``, ``examples/runs/2026-11-30-front-end-default-H200/``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import settings

#: How a hold was made, as ``held`` yields it.
FRONT_END, SPIN = "front-end wait", "spin kernel"
#: ``cuStreamWaitValue32``'s flag: wait until ``(int32)(*addr - value) >= 0``.
_WAIT_GEQ = 0x0
#: ``cuMemHostRegister``'s flags: portable (every context) and mapped into the device's address space.
_REGISTER_PORTABLE_DEVICEMAP = 0x01 | 0x02
#: A request to the timer: at this ``time.monotonic()`` (the system's clock, shared by processes), store
#: this target unless a later one is stored.
_REQUEST = struct.Struct("<dq")
#: The timer process (standard library only; its arguments: the page's descriptor, ``_REQUEST``'s format):
#: reads requests on stdin, stores each target into the shared word at its time unless a later one is
#: there; ends when stdin closes (this process ended).
_TIMER = r"""
import heapq, mmap, os, select, struct, sys, time
word = memoryview(mmap.mmap(int(sys.argv[1]), mmap.PAGESIZE)).cast("i")
request, pending, buffered = struct.Struct(sys.argv[2]), [], b""
while True:
    wait = max(0.0, pending[0][0] - time.monotonic()) if pending else None
    if select.select([0], [], [], wait)[0]:
        data = os.read(0, 65536)
        if not data:
            break
        buffered += data
        while len(buffered) >= request.size:
            heapq.heappush(pending, request.unpack_from(buffered))
            buffered = buffered[request.size:]
    while pending and pending[0][0] <= time.monotonic():
        target = heapq.heappop(pending)[1]
        if word[0] < target:
            word[0] = target
"""


class _Page:
    """A shared page whose first 32-bit word is the latest target released, and the timer process that
    shares it (``_TIMER``). Targets count up from 1; storing one releases every wait up to it."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(
            prefix="stream-hold-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        try:
            os.unlink(path)  # the descriptor keeps it, for this process and the timer's
            os.ftruncate(fd, mmap.PAGESIZE)
            self._page = mmap.mmap(fd, mmap.PAGESIZE)
            self._timer = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _TIMER, str(fd), _REQUEST.format],
                stdin=subprocess.PIPE,
                pass_fds=(fd,),
            )
        finally:
            os.close(fd)
        self.word = ctypes.c_int32.from_buffer(self._page)
        self._lock = threading.Lock()

    def release_at(self, deadline: float, target: int) -> None:
        """Have the timer store ``target`` at ``deadline`` (``time.monotonic()``); ``OSError`` if it ended."""
        if self._timer.poll() is not None or self._timer.stdin is None:
            raise OSError("the stream-hold timer process ended")
        self._timer.stdin.write(_REQUEST.pack(deadline, target))
        self._timer.stdin.flush()

    def release(self, target: int) -> None:
        """Store ``target`` now, unless a later one is there. The timer process stores too, and no lock
        spans both processes: a timer store that read the word just before this one may lower it again to
        an earlier target. A wait for a target between the two then lasts until the timer stores that
        target at its deadline (its ``at_most_s``; every target's request is sent before its wait is
        queued): a hold that lasts its whole limit, never one that does not end."""
        with self._lock:
            if self.word.value < target:
                self.word.value = target


class _Driver:
    """The driver entry points a hold needs, from ``libcuda`` (the one torch loaded)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")

        def entry(name: str, *argtypes: Any) -> Any:
            function = getattr(lib, f"{name}_v2", None) or getattr(lib, name)
            function.argtypes, function.restype = list(argtypes), ctypes.c_int
            return function

        self.wait = entry(
            "cuStreamWaitValue32", ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint
        )
        self.register = entry("cuMemHostRegister", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
        self.device_pointer = entry(
            "cuMemHostGetDevicePointer", ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint
        )


def _checked(code: int, call: str) -> None:
    if code != 0:
        raise OSError(f"{call} returned CUDA error {code}")


class _Word:
    """The page's word registered with the driver (mapped for the GPU), which held streams wait on; one per
    process."""

    def __init__(self, driver: _Driver) -> None:
        self._driver = driver
        self.page = _Page()
        host = ctypes.addressof(self.page.word)
        _checked(driver.register(host, mmap.PAGESIZE, _REGISTER_PORTABLE_DEVICEMAP), "cuMemHostRegister")
        pointer = ctypes.c_uint64()
        _checked(driver.device_pointer(ctypes.byref(pointer), host, 0), "cuMemHostGetDevicePointer")
        self.address = pointer.value
        self._lock = threading.Lock()
        self._issued = 0

    def hold(self, stream: Any, at_most_s: float) -> int:
        """Queue a wait on ``stream`` that ends by ``at_most_s`` from now at the latest; the target that
        ends it. ``OSError``: the driver or the timer refused."""
        with self._lock:
            self._issued += 1
            target = self._issued
        self.page.release_at(time.monotonic() + at_most_s, target)
        _checked(
            self._driver.wait(stream.cuda_stream, self.address, target, _WAIT_GEQ), "cuStreamWaitValue32"
        )
        return target


@functools.cache
def _word() -> _Word | None:
    """The process's word, or None where holds spin: the setting says so, or the driver cannot hold a
    stream in its front end."""
    if settings.STREAM_HOLDS.get() != "front-end":
        return None
    try:
        return _Word(_Driver())
    except (OSError, AttributeError):
        return None


@functools.cache
def spin_cycles_per_s(device_index: int) -> float:
    """Spin-kernel cycles per second on a device, measured once (its SM clock under a spin load)."""
    import torch

    cycles = 2_000_000
    with torch.cuda.device(device_index):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # the first launch loads the kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / max(start.elapsed_time(end) / 1e3, 1e-6)


@contextlib.contextmanager
def held(stream: Any, at_most_s: float) -> Iterator[str]:
    """Work queued on ``stream`` after this starts runs ``at_most_s`` after it started, or, held in the front
    end, once the block ends if that comes first; yields how: ``SPIN`` (a spin of ``at_most_s`` that the
    block's end cannot cut short) or ``FRONT_END``."""
    import torch

    index = stream.device.index if stream.device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):  # the stream's context current for the driver's calls
        word, target = _word(), None  # target None: the hold spins
        if word is not None:
            with contextlib.suppress(OSError):
                target = word.hold(stream, at_most_s)
        if target is None:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(int(at_most_s * spin_cycles_per_s(index)))
    if word is None or target is None:
        yield SPIN
        return
    try:
        yield FRONT_END
    finally:
        word.page.release(target)
