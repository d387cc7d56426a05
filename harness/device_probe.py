"""After each case: is the device still usable, and was the case's failure a CUDA out-of-memory?

A kernel that stores out of bounds leaves a *sticky* error: every later CUDA call in that process fails
with it, so without a check every case after the faulty one fails too, each a false alarm. ``cuda_probe``
synchronises every device this process holds a context on, once per case: that surfaces an error of the
case's own kernels before the next case starts (a fault can only be reported once the kernel ran) and
costs one ``cudaDeviceSynchronize`` on an idle device, where the case already waited for its results.
It never creates a CUDA context: a process that did not use CUDA (a CPU chapter) pays nothing.

``python -m harness.device_probe --bench N`` times the probe on this machine's first GPU.

A probe is any ``() -> str | None`` (the error, or None when healthy); the watchdog takes another one with
``--device-probe MODULE:FUNCTION``, e.g. for a self-test on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time
from collections.abc import Callable, Sequence

Probe = Callable[[], "str | None"]
DEFAULT_PROBE = "harness.device_probe:cuda_probe"
#: The repro line of a device fault: the case under compute-sanitizer's memcheck, which names the kernel,
#: the address and the thread that faulted.
SANITIZER = "compute-sanitizer --tool memcheck"


def load_probe(spec: str) -> Probe | None:
    """``MODULE:FUNCTION`` (``none`` for no probe) -> the probe; a ValueError names a bad spec."""
    if spec.strip().lower() == "none":
        return None
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"--device-probe {spec!r}: want MODULE:FUNCTION or none")
    try:
        probe = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--device-probe {spec!r}: {exc}") from exc
    if not callable(probe):
        raise ValueError(f"--device-probe {spec!r}: {attr} is not callable")
    return probe


def _torch():  # type: ignore[no-untyped-def]
    """torch when this process imported it (the probe never imports it, nor starts CUDA)."""
    return sys.modules.get("torch")


def _devices_in_use(torch) -> list[int]:  # type: ignore[no-untyped-def]
    cuda = torch.cuda
    if not cuda.is_initialized():
        return []
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    count = cuda.device_count()
    return [i for i in range(count) if has_context is None or has_context(i)]


def cuda_probe() -> str | None:
    """None when every device this process uses is healthy, else the CUDA error (torch's text)."""
    torch = _torch()
    if torch is None:
        return None
    try:
        for index in _devices_in_use(torch):
            torch.cuda.synchronize(index)
    except Exception as exc:  # torch raises AcceleratorError / RuntimeError for a sticky error
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA out-of-memory, as torch raises it (``torch.OutOfMemoryError``) or reports it in a message."""
    torch = _torch()
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return "CUDA out of memory" in str(exc) or "cudaErrorMemoryAllocation" in str(exc)


def release_after_failure() -> None:
    """Drop what pytest keeps of the last failure (``sys.last_*`` hold its traceback, whose frames hold
    the case's tensors) so that an out-of-memory case's memory goes back before the next case."""
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)


def memory_held_after_oom() -> int:
    """After an out-of-memory case: collect its garbage, return the cached blocks to the driver, and give
    the bytes still allocated by this process (what the next case would find taken)."""
    release_after_failure()
    gc.collect()
    torch = _torch()
    if torch is None or not torch.cuda.is_initialized():
        return 0
    torch.cuda.empty_cache()
    return sum(torch.cuda.memory_allocated(i) for i in _devices_in_use(torch))


def sanitizer_repro(repro: str) -> str:
    """``repro`` (``python -m pytest 'case' ...``) under compute-sanitizer, ready to paste."""
    return f"{SANITIZER} {repro}" if repro else SANITIZER


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def bench(runs: int) -> str:
    """The probe's cost on this machine's first GPU: idle, and right after a small kernel."""
    import torch

    if not torch.cuda.is_available():
        return "device probe bench: no CUDA device"
    x = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()

    def timed(before: Callable[[], object]) -> list[float]:
        times = []
        for _ in range(runs):
            before()
            start = time.perf_counter()
            assert cuda_probe() is None
            times.append(time.perf_counter() - start)
        return sorted(times)

    idle = timed(lambda: None)
    after_kernel = timed(lambda: x.add_(1))
    med = lambda t: t[len(t) // 2] * 1e6  # noqa: E731
    p99 = lambda t: t[min(len(t) - 1, len(t) * 99 // 100)] * 1e6  # noqa: E731
    return (
        f"device probe ({torch.cuda.get_device_name(0)}, {runs} runs): idle median {med(idle):.1f} µs "
        f"(p99 {p99(idle):.1f}); after a small kernel median {med(after_kernel):.1f} µs "
        f"(p99 {p99(after_kernel):.1f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bench", type=int, default=1000, metavar="N", help="probe N times (default 1000)")
    args = parser.parse_args(argv)
    print(bench(args.bench))
    return 0


if __name__ == "__main__":
    sys.exit(main())
