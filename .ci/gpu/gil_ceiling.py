"""Issue 13: how far CPython threads can scale a call that holds the GIL for almost nothing.

Each call goes through ctypes into a C function that spins for ``--spin-us`` microseconds (about what one
cublasGemmEx call costs the host: ~11 us) with the GIL released, like the native entry of our mm_out. No
GPU, no torch: what 1, 2, 4 and 8 threads reach here bounds what any Python-level mm_out can reach, because
every call must take the GIL back once. Compare with .ci/gpu/thread_ceiling.cpp (the same number of
calls from C++ threads).

    python3 .ci/gpu/gil_ceiling.py [--spin-us 11] [--calls 20000]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

SPIN_C = r"""
#include <time.h>
void spin(long ns) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  do { clock_gettime(CLOCK_MONOTONIC, &b); }
  while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < ns);
}
"""


def build() -> ctypes.CDLL:
    folder = Path(tempfile.mkdtemp(prefix="gil-ceiling-"))
    (folder / "spin.c").write_text(SPIN_C)
    cc = sysconfig.get_config_var("CC") or "cc"
    subprocess.run([*cc.split()[:1], "-O2", "-shared", "-fPIC", str(folder / "spin.c"), "-o",
                    str(folder / "spin.so")], check=True)  # fmt: skip
    library = ctypes.CDLL(str(folder / "spin.so"))  # CDLL: the GIL is released during each call
    library.spin.argtypes = [ctypes.c_long]
    return library


def rate(call, threads: int, calls: int) -> float:
    start_line, finish_line = threading.Barrier(threads + 1), threading.Barrier(threads + 1)

    def work() -> None:
        start_line.wait()
        for _ in range(calls):
            call()
        finish_line.wait()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    finish_line.wait()
    seconds = time.perf_counter() - began
    for thread in pool:
        thread.join()
    return threads * calls / seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spin-us", type=float, default=11.0)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    spin = build().spin
    ns = int(args.spin_us * 1000)

    def call() -> None:
        spin(ns)

    print(f"python {sys.version.split()[0]}: ctypes call spinning {args.spin_us:g} us with the GIL released, "
          f"{args.calls} calls per thread, median of {args.repeats}")  # fmt: skip
    one = None
    for threads in (1, 2, 4, 8):
        rates = sorted(rate(call, threads, args.calls) for _ in range(args.repeats))
        median = statistics.median(rates)
        one = one or median
        print(f"threads {threads}: median {median:,.0f} calls/s (best {rates[-1]:,.0f}), {median / one:.2f}x "
              "one thread")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
