"""Every tolerance in ``conformance.common.tolerances``, per dtype: the check that applies it passes on the
last representable value inside the bound and fails on the next one; and the bound catches what it exists to
catch (float16 accumulation, TF32 inputs) while letting a float32-accumulated product through."""

from __future__ import annotations

import math
import re

import pytest
import torch

from conformance.common import tolerances
from conformance.common.checks import CheckFailure, assert_matmul_close, assert_model_output_close
from conformance.common.tolerances import DTYPES_BY_NAME, FLOAT32_ROUNDOFF, MODEL_TOLERANCES, TOLERANCES
from tests.meta.boundary import straddle
from tests.meta.registry import covers

RULE, CALL = "meta/tol", "mm_out(out, a, b)"


def matmul_bound(dtype: torch.dtype, ref: float, magnitude: float, k: int) -> float:
    """The documented bound (tolerances.py), term by term in the order the check adds them."""
    tol = TOLERANCES[dtype]
    return tol.output_roundoff * abs(ref) + tol.accumulation(k) * magnitude + tol.atol


# (name, a row, b column): float64 products and sums of these are exact, so only the bound decides.
MATMUL_CASES = {
    "relative, K=1": ([1.0], [1.5]),  # ref 1.5: output roundoff + one accumulation term
    "cancelling, K=2": ([1.0, 1.0], [8.0, -8.0]),  # ref 0: accumulation(K) of |A|·|B| alone
    "cancelling, K=64": ([1.0] * 64, [1.0, -1.0] * 32),
    "cancelling, K=4096": ([0.25] * 4096, [1.0, -1.0] * 2048),
    "zero, K=3": ([0.0] * 3, [1.0] * 3),  # ref 0 and magnitude 0: atol alone (below the least subnormal)
}


@covers(tolerances.TOLERANCES, tolerances.Tolerance)
@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul_tolerance_holds_exactly_at_its_bound(dtype: torch.dtype, case: str) -> None:
    row, column = MATMUL_CASES[case]
    a = torch.tensor([row], dtype=dtype)
    b = torch.tensor(column, dtype=dtype)[:, None]
    ref = sum(x * y for x, y in zip(row, column, strict=True))
    magnitude = sum(abs(x * y) for x, y in zip(row, column, strict=True))
    inside, past = straddle(ref, matmul_bound(dtype, ref, magnitude, len(row)), dtype)
    assert_matmul_close(RULE, CALL, inside.reshape(1, 1), a, b)
    with pytest.raises(
        CheckFailure, match=re.escape(f"[{RULE}] {CALL}: 1 of 1 elements outside the {dtype} tolerance")
    ):
        assert_matmul_close(RULE, CALL, past.reshape(1, 1), a, b)
    if ref == 0:  # the bound is on |error|: just past on the negative side fails too
        with pytest.raises(CheckFailure):
            assert_matmul_close(RULE, CALL, -past.reshape(1, 1), a, b)


@covers(tolerances.MODEL_TOLERANCES)
@pytest.mark.parametrize("dtype", list(MODEL_TOLERANCES), ids=str)
def test_model_tolerance_holds_at_its_bound(dtype: torch.dtype) -> None:
    got = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=dtype)
    bound = MODEL_TOLERANCES[dtype]

    def ref_at(relative_error: float) -> torch.Tensor:
        # ref = got·(1 - t) gives ||got - ref|| / ||ref|| = t / (1 - t) = relative_error.
        t = relative_error / (1 + relative_error)
        return got.double() * (1 - t)

    assert_model_output_close(RULE, CALL, got, ref_at(bound * (1 - 1e-6)))
    message = re.escape(f"[{RULE}] {CALL}: relative L2 error ") + f".* exceeds {bound:g} \\({dtype}\\)$"
    with pytest.raises(CheckFailure, match=message):
        assert_model_output_close(RULE, CALL, got, ref_at(bound * (1 + 1e-6)))


@covers(tolerances.FLOAT32_ROUNDOFF, tolerances.TOLERANCES, tolerances.Tolerance)
@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
def test_matmul_tolerance_fields_mean_what_they_say(dtype: torch.dtype) -> None:
    """output_roundoff is the dtype's unit roundoff, atol half its subnormal spacing, and accumulation
    4·√K float32 roundoffs (K < 1 counts as 1)."""
    tol, info = TOLERANCES[dtype], torch.finfo(dtype)
    assert tol.dtype == dtype
    assert tol.output_roundoff == info.eps / 2
    assert tol.atol == info.smallest_normal * info.eps / 2
    assert torch.finfo(torch.float32).eps / 2 == FLOAT32_ROUNDOFF
    for k in (1, 2, 100, 4096):
        assert tol.accumulation(k) == pytest.approx(4 * math.sqrt(k) * FLOAT32_ROUNDOFF, rel=1e-15)
    assert tol.accumulation(0) == tol.accumulation(1)


@covers(tolerances.DTYPES_BY_NAME, tolerances.MODEL_TOLERANCES)
def test_every_dtype_the_suite_runs_has_both_tolerances() -> None:
    assert set(DTYPES_BY_NAME.values()) == set(TOLERANCES) == set(MODEL_TOLERANCES)
    assert all(str(dtype) == f"torch.{name}" for name, dtype in DTYPES_BY_NAME.items())
    # Coarser dtypes get looser bounds, each above the dtype's unit roundoff and far below an O(1) bug.
    by_precision = sorted(MODEL_TOLERANCES, key=lambda d: torch.finfo(d).eps)
    assert [MODEL_TOLERANCES[d] for d in by_precision] == sorted(MODEL_TOLERANCES.values())
    assert all(torch.finfo(d).eps / 2 < MODEL_TOLERANCES[d] < 0.1 for d in MODEL_TOLERANCES)


# ---------------------------------------------------------------------------------------------- its power


def tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10-bit mantissa (to nearest), as a tensor core reads its inputs."""
    bits = x.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def float16_accumulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with every partial sum rounded to float16: what a kernel accumulating in half gives."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
    for k in range(a.shape[1]):
        acc = (acc.float() + a[:, k : k + 1].float() * b[k : k + 1, :].float()).half()
    return acc


@covers(tolerances.TOLERANCES)
@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
def test_a_float32_accumulated_product_passes_even_at_large_k(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 4096, generator=gen).to(dtype)
    b = torch.randn(4096, 16, generator=gen).to(dtype)
    assert_matmul_close(RULE, CALL, (a.float() @ b.float()).to(dtype), a, b)


@covers(tolerances.TOLERANCES)
def test_tf32_inputs_fail_the_float32_tolerance() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
    with pytest.raises(CheckFailure, match=re.escape("outside the torch.float32 tolerance")):
        assert_matmul_close(RULE, CALL, (tf32(a).double() @ tf32(b).double()).float(), a, b)


@covers(tolerances.TOLERANCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_float16_accumulation_fails(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(8, 256, generator=gen).to(dtype)
    b = torch.rand(256, 8, generator=gen).to(dtype)
    with pytest.raises(CheckFailure, match=re.escape(f"outside the {dtype} tolerance")):
        assert_matmul_close(RULE, CALL, float16_accumulated(a, b).to(dtype), a, b)
