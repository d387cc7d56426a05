"""Print a compute-sanitizer kernel filter (``regex=...``) that matches cuBLAS's float64 GEMM kernels (the
mm_out chapter's references) and none of the kernels the shim launches, or nothing if no such filter exists.

The kernels come from torch.profiler: float64 torch.mm, and the backend's mm_out in every chapter dtype, over
the chapter's own shapes and operand layouts (imported from it). Only short tokens are used (the filter may
match mangled or demangled names, and the tokens read the same in both). Details go to stderr.
"""

import sys
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from conformance.common.tolerances import DTYPES_BY_NAME
from conformance.mm_out.test_mm_out import LARGE_SHAPE, LAYOUT_PAIRS, SHAPES, generator, make_operand
from reference_impl import BACKEND

TOKENS = ("f64", "dgemm", "d884", "d1688", "dmma", "double")
CUDA = torch.device("cuda")


def kernels(run: Callable[[], None]) -> set[str]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages() if e.device_type.name == "CUDA"}


def products(dtype: torch.dtype, call: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]) -> None:
    gen = generator("float64-kernel-names", CUDA)
    for m, k, n in [*SHAPES.values(), LARGE_SHAPE]:
        for layout_self, layout_mat2 in LAYOUT_PAIRS:
            a = make_operand(m, k, layout_self, dtype, gen, CUDA)
            b = make_operand(k, n, layout_mat2, dtype, gen, CUDA)
            call(torch.empty(m, n, device=CUDA, dtype=dtype), a, b)


def shim_products() -> None:
    for dtype in DTYPES_BY_NAME.values():
        products(dtype, BACKEND.mm_out)


f64 = kernels(lambda: products(torch.float64, lambda out, a, b: torch.mm(a, b, out=out)))
shim = kernels(shim_products)
print("float64 GEMM kernels:", *sorted(f64), sep="\n  ", file=sys.stderr)
print("shim kernels:", *sorted(shim), sep="\n  ", file=sys.stderr)
tokens = [t for t in TOKENS if any(t in k for k in f64) and not any(t in k for k in shim)]
uncovered = [k for k in f64 if not any(t in k for t in tokens)]
print(f"tokens: {tokens}; float64 kernels no token covers: {uncovered}", file=sys.stderr)
if tokens:
    print("regex=" + "|".join(tokens))
