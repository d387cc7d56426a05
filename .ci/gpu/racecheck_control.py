"""Control for a racecheck hazard inside a cuBLAS kernel: the same product through torch.mm (libtorch's own
cuBLAS call) or through our shim, one process each, so compute-sanitizer's report can be compared.
Usage: compute-sanitizer --tool racecheck python3 .ci/gpu/racecheck_control.py {torch|ours}."""

import sys

import torch

from reference_impl import BACKEND

which = sys.argv[1]
for dtype in (torch.float16, torch.bfloat16):
    for layout in ("row", "col"):
        a = torch.ones(1, 2048, dtype=dtype, device="cuda")
        b = torch.ones(2048, 256, dtype=dtype, device="cuda")
        if layout == "col":
            b = torch.ones(256, 2048, dtype=dtype, device="cuda").t()
        out = torch.full((1, 256), float("nan"), dtype=dtype, device="cuda")
        if which == "torch":
            torch.mm(a, b, out=out)
        else:
            BACKEND.mm_out(out, a, b)
        torch.cuda.synchronize()
        print(f"{which} {dtype} {layout}: exact={bool((out == 2048).all())}", flush=True)
