"""How a process's host threads wait for its GPU: asleep, not spinning on a core.

CUDA's default scheduling (``CU_CTX_SCHED_AUTO``) spins a thread that waits for the GPU (a synchronize, a
copy back to the host) whenever the process has fewer CUDA contexts than the machine has cores: always, for
a case worker. Twelve workers sharing one GPU then hold twelve cores while they wait for each other's time
slices, and the compile processes beside them, the cold run's critical path, get the cores that are left.
``CU_CTX_SCHED_BLOCKING_SYNC`` makes such a thread sleep until the GPU is done: the same calls, the same
results, a wake-up of microseconds later.

The front door asks for it in the phases where many workers share a GPU and nothing is timed
(``$CONFORMANCE_CUDA_SYNC=blocking``, ``runner/plan.py``); the phase that measures on its GPU
alone keeps CUDA's default. It must be set before the process's CUDA context exists: the suite's conftest
calls ``apply_from_env`` where it pins a worker to its GPU.

Uses the driver API through ctypes (``cuDevicePrimaryCtxSetFlags``; the primary context is the one the CUDA
runtime, hence torch, uses), so it needs nothing but the driver; where there is none it does nothing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

import settings

#: ``blocking``: the process's GPU waits sleep (``block_while_waiting``); anything else: CUDA's default.
SYNC_ENV = settings.CUDA_SYNC.name
BLOCKING = "blocking"
#: ``CU_CTX_SCHED_BLOCKING_SYNC`` (cuda.h).
_SCHED_BLOCKING_SYNC = 0x04
_SCHED_MASK = 0x07
_DRIVER = "libcuda.so.1"


def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(_DRIVER)
    except OSError:
        return None


def _primary_flags(driver: ctypes.CDLL, index: int) -> tuple[ctypes.c_int, int] | None:
    """Device ``index`` and its primary context's flags; None where the driver cannot say."""
    device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    if driver.cuDeviceGet(ctypes.byref(device), index) != 0:
        return None
    if driver.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) != 0:
        return None
    return device, flags.value


def block_while_waiting() -> str:
    """Make every visible GPU's primary context block, not spin, while a host thread waits for it; says
    what it did (the count of devices set, or why none was)."""
    driver = _driver()
    if driver is None:
        return f"no CUDA driver ({_DRIVER}): nothing to set"
    if driver.cuInit(0) != 0:
        return "cuInit failed: nothing set"
    count = ctypes.c_int()
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return "cuDeviceGetCount failed: nothing set"
    done = 0
    for index in range(count.value):
        found = _primary_flags(driver, index)
        if found is None:
            continue
        device, flags = found
        wanted = (flags & ~_SCHED_MASK) | _SCHED_BLOCKING_SYNC  # other flags kept
        if driver.cuDevicePrimaryCtxSetFlags(device, ctypes.c_uint(wanted)) == 0:
            done += 1
    return f"blocking sync on {done} of {count.value} device(s)"


def scheduling(index: int = 0) -> int | None:
    """The scheduling bits of device ``index``'s primary context (``CU_CTX_SCHED_*``); None: no driver."""
    driver = _driver()
    if driver is None or driver.cuInit(0) != 0:
        return None
    found = _primary_flags(driver, index)
    return None if found is None else found[1] & _SCHED_MASK


def asks_blocking(env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``$CONFORMANCE_CUDA_SYNC`` asks for GPU waits that sleep."""
    return env.get(SYNC_ENV, "").strip().lower() == BLOCKING


def apply_from_env(env: Mapping[str, str] = os.environ) -> str | None:
    """``block_while_waiting`` where ``$CONFORMANCE_CUDA_SYNC`` asks for it; None where it does not."""
    return block_while_waiting() if asks_blocking(env) else None
