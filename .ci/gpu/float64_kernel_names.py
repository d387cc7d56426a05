"""Print a compute-sanitizer kernel filter (``regex=...``) that matches cuBLAS's float64 GEMM kernels (the
mm_out chapter's references) and none of the kernels the shim launches, or nothing if no such filter exists.

The kernels come from torch.profiler: float64 torch.mm, and the backend's mm_out in every chapter dtype, over
the chapter's shapes and both operand layouts. Only short tokens are used (the filter may match mangled or
demangled names, and the tokens read the same in both). Details go to stderr.
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from reference_impl import BACKEND

TOKENS = ("f64", "dgemm", "d884", "d1688", "dmma", "double")
SHAPES = [(1, 2048, 256), (64, 96, 48), (257, 129, 65), (512, 512, 512), (4096, 4096, 4096)]


def kernels(run) -> set[str]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages() if e.device_type.name == "CUDA"}


def products(dtype: torch.dtype, call) -> None:
    for m, k, n in SHAPES:
        for transposed in (False, True):
            a = torch.randn(m, k, device="cuda").to(dtype)
            b = torch.randn(n, k, device="cuda").to(dtype)
            b = b.t() if transposed else b.reshape(k, n)
            call(torch.empty(m, n, device="cuda", dtype=dtype), a, b)


f64 = kernels(lambda: products(torch.float64, lambda out, a, b: torch.mm(a, b, out=out)))
shim = kernels(lambda: [products(d, BACKEND.mm_out) for d in (torch.float32, torch.float16, torch.bfloat16)])
print("float64 GEMM kernels:", *sorted(f64), sep="\n  ", file=sys.stderr)
print("shim kernels:", *sorted(shim), sep="\n  ", file=sys.stderr)
tokens = [t for t in TOKENS if any(t in k for k in f64) and not any(t in k for k in shim)]
uncovered = [k for k in f64 if not any(t in k for t in tokens)]
print(f"tokens: {tokens}; float64 kernels no token covers: {uncovered}", file=sys.stderr)
if tokens:
    print("regex=" + "|".join(tokens))
