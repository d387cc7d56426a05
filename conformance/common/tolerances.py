"""Per-dtype numerical tolerances: the one place the suite decides what "close enough" means.

A matrix product C = A·B of K terms, accumulated in float32 and rounded once to the output dtype, satisfies
elementwise

    |C - ref| <= output_roundoff · |ref|  +  accumulation(K) · (|A|·|B|)  +  atol

where ``ref`` is the float64 product of the same (already rounded) inputs and ``|A|·|B|`` the float64
product of magnitudes (the condition of each dot product). The accumulation term allows 4·√K float32
roundoffs per unit of magnitude: far above what blocked float32 summation does, far below what float16
accumulation (≈K·2⁻¹¹) or TF32 inputs (2⁻¹¹ per product) would do — those are bugs this must catch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FLOAT32_ROUNDOFF = 2.0**-24


@dataclass(frozen=True)
class Tolerance:
    dtype: torch.dtype
    output_roundoff: float  # unit roundoff of the output dtype: the result is rounded once to it
    atol: float  # half the subnormal spacing: rounding near zero is absolute, not relative

    def accumulation(self, k: int) -> float:
        """Allowed float32 accumulation error per unit of |A|·|B| for a K-term dot product."""
        return 4.0 * math.sqrt(max(k, 1)) * FLOAT32_ROUNDOFF


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(torch.float32, output_roundoff=2.0**-24, atol=2.0**-150),
    torch.float16: Tolerance(torch.float16, output_roundoff=2.0**-11, atol=2.0**-25),
    torch.bfloat16: Tolerance(torch.bfloat16, output_roundoff=2.0**-8, atol=2.0**-134),
}

DTYPES_BY_NAME: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


# ===================================================================================== whole-model tolerances
# A different kind of bound from ``TOLERANCES`` above: for a whole lowered model (the zoo's multi-method
# models), each output is compared norm-wise with eager PyTorch run in float64 on the same, already rounded
# weights and inputs:
#
#     ||got - ref||₂  <=  MODEL_TOLERANCES[dtype] · ||ref||₂
#
# Why these numbers. A handful of layers (LayerNorm, GELU, SDPA, softmax, a few linears) each round to the
# working dtype, so the norm-wise error is a small multiple of the dtype's unit roundoff u: measured with
# eager PyTorch on the asr and llm models, float32 ≈ 3e-7 (u = 6e-8), float16 ≈ 1e-3 (u = 4.9e-4),
# bfloat16 ≈ 8e-3 (u = 3.9e-3). The bounds leave ≥ 5× headroom for a compiler that fuses differently (it
# rounds less often, or in another order), yet they are far below what a real bug gives: a wrong or stale
# output, a missed copy, a misread layout or garbage in a KV cache is O(1) relative error; a float16
# accumulation in a float32 model is ≳ 1e-3. float32's 1e-4 is loose on purpose (300× the measurement): it
# does not attempt to detect TF32, which the mm_out chapter checks exactly.
MODEL_TOLERANCES: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 4e-2,
}
