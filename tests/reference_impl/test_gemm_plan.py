"""The GEMM plan, checked by running it through a numpy emulation of column-major ``cublasGemmEx``.

The emulator reads flat buffers exactly as cuBLAS would (through op and leading dimension), rejects the
arguments cuBLAS rejects, and refuses to read outside the buffer. Layout bugs (a swapped operand, a wrong
transpose flag, an ld off by one, a stride of a size-1 dimension trusted) show up as wrong numbers or as
an illegal argument; ``test_emulator_catches_broken_plans`` proves it does notice.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import numpy as np
import pytest
import torch

from reference_impl.shims.errors import MmOutArgumentError
from reference_impl.shims.gemm_plan import (
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    INT32_MAX,
    GemmPlan,
    operand_rows,
    plan_gemm,
    runs_meet_range,
)


class IllegalArgument(Exception):
    """What cuBLAS would answer with CUBLAS_STATUS_INVALID_VALUE (or a read out of bounds)."""


def _gather(flat: np.ndarray, index: np.ndarray) -> np.ndarray:
    if index.size and (index.min() < 0 or index.max() >= flat.size):
        raise IllegalArgument(f"read outside the buffer: indices {index.min()}..{index.max()} of {flat.size}")
    return flat[index]


def emulate_gemm_ex(
    plan: GemmPlan, a_flat: np.ndarray, b_flat: np.ndarray, c_flat: np.ndarray, *, alpha: float = 1.0
) -> None:
    """Column-major ``C = alpha·op(A)·op(B) + 0·C`` over flat buffers, with cuBLAS's argument checks."""
    m, n, k = plan.m, plan.n, plan.k
    for name, value in dataclasses.asdict(plan).items():
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= INT32_MAX:
            raise IllegalArgument(f"{name}={value} is not a non-negative 32-bit int")
    if plan.transa not in (CUBLAS_OP_N, CUBLAS_OP_T) or plan.transb not in (CUBLAS_OP_N, CUBLAS_OP_T):
        raise IllegalArgument("bad op")
    if plan.lda < max(1, m if plan.transa == CUBLAS_OP_N else k):
        raise IllegalArgument(f"lda={plan.lda} too small")
    if plan.ldb < max(1, k if plan.transb == CUBLAS_OP_N else n):
        raise IllegalArgument(f"ldb={plan.ldb} too small")
    if plan.ldc < max(1, m):
        raise IllegalArgument(f"ldc={plan.ldc} too small")
    if m == 0 or n == 0:
        return
    i = np.arange(m)[:, None]
    l_row = np.arange(k)[None, :]
    # op(A) is m × k: A stored column-major m × k (op N) or k × m (op T).
    a_index = i + l_row * plan.lda if plan.transa == CUBLAS_OP_N else l_row + i * plan.lda
    op_a = _gather(a_flat, a_index)
    l_col = np.arange(k)[:, None]
    j = np.arange(n)[None, :]
    # op(B) is k × n: B stored column-major k × n (op N) or n × k (op T).
    b_index = l_col + j * plan.ldb if plan.transb == CUBLAS_OP_N else j + l_col * plan.ldb
    op_b = _gather(b_flat, b_index)
    c_index = np.arange(m)[:, None] + np.arange(n)[None, :] * plan.ldc
    if c_index.max() >= c_flat.size:
        raise IllegalArgument("write outside the output buffer")
    c_flat[c_index] = alpha * (op_a @ op_b)


# --------------------------------------------------------------------------------------------------
# Operand layouts: each builds a [rows, cols] float64 CPU tensor of small integers (exact arithmetic)
# that is a view into a larger storage, the way real callers hand them over.

Layout = Callable[[int, int, np.random.Generator], torch.Tensor]


def _ints(gen: np.random.Generator, *shape: int) -> torch.Tensor:
    return torch.from_numpy(gen.integers(-8, 9, size=shape).astype(np.float64))


def _strided(rows: int, cols: int, stride: tuple[int, int], gen: np.random.Generator) -> torch.Tensor:
    """A view with exactly ``stride`` (any stride, also on size-1 dims) into a random storage, offset 3."""
    extent = 3 + sum((size - 1) * s for size, s in zip((rows, cols), stride, strict=True) if size > 0) + 1
    storage = _ints(gen, max(extent, 4))
    return storage.as_strided((rows, cols), stride, 3)


LAYOUTS: dict[str, Layout] = {
    "row-major": lambda r, c, g: _ints(g, r, c),
    "row-major-padded": lambda r, c, g: _ints(g, r, c + 3)[:, :c],
    "transposed": lambda r, c, g: _ints(g, c, r).t(),
    "transposed-padded": lambda r, c, g: _ints(g, c, r + 2)[:, :r].t(),
    "column-step": lambda r, c, g: _ints(g, r, 2 * c)[:, ::2],
    "both-steps": lambda r, c, g: _ints(g, 2 * r, 3 * c)[::2, ::3],
    "broadcast-rows": lambda r, c, g: _ints(g, 1, c).expand(r, c),
    "broadcast-cols": lambda r, c, g: _ints(g, r, 1).expand(r, c),
    # torch leaves the stride of a size-1 dimension arbitrary: odd, zero, or past int32.
    "size1-odd-strides": lambda r, c, g: _strided(r, c, (7 if r == 1 else c, 1 if c > 1 else 13), g),
    "size1-zero-strides": lambda r, c, g: _strided(r, c, (0 if r == 1 else 1, 0 if c == 1 else max(r, 1)), g),
    "size1-huge-strides": lambda r, c, g: _strided(
        r, c, (2**40 if r == 1 else c, 1) if c > 1 or r == 1 else (1, 2**33), g
    ),
    "tight-column-major": lambda r, c, g: _strided(r, c, (1, r), g),
}

SIZES = (1, 2, 3, 5, 7)
SHAPES = [*itertools.product(SIZES, repeat=3), (13, 1, 11), (1, 17, 1), (11, 13, 1), (2, 1, 19)]


def flat_operand(t: torch.Tensor, copy: bool) -> np.ndarray:
    """The flat buffer cuBLAS reads for an operand: its storage from its first element, or a dense copy."""
    if copy:
        return np.asarray(t.tolist(), dtype=np.float64).reshape(-1)  # a row-major contiguous scratch
    storage = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    return storage.numpy()[t.storage_offset() :]


def run_plan(plan: GemmPlan, self_: torch.Tensor, mat2: torch.Tensor) -> np.ndarray:
    M, N = self_.shape[0], mat2.shape[1]
    c = np.full(M * N, np.nan)
    emulate_gemm_ex(plan, flat_operand(mat2, plan.copy_mat2), flat_operand(self_, plan.copy_self), c)
    return c.reshape(M, N)


def plan_for(self_: torch.Tensor, mat2: torch.Tensor) -> GemmPlan:
    (M, K), N = self_.shape, mat2.shape[1]
    return plan_gemm(M, N, K, tuple(self_.stride()), tuple(mat2.stride()))  # type: ignore[arg-type]


@pytest.mark.parametrize("self_layout", list(LAYOUTS))
@pytest.mark.parametrize("mat2_layout", list(LAYOUTS))
def test_plan_computes_self_at_mat2(self_layout: str, mat2_layout: str) -> None:
    gen = np.random.default_rng(abs(hash((self_layout, mat2_layout))) % 2**32)
    for M, N, K in SHAPES:
        self_ = LAYOUTS[self_layout](M, K, gen)
        mat2 = LAYOUTS[mat2_layout](K, N, gen)
        assert self_.shape == (M, K)
        assert mat2.shape == (K, N)
        plan = plan_for(self_, mat2)
        got = run_plan(plan, self_, mat2)
        expected = self_.numpy() @ mat2.numpy()
        assert np.array_equal(got, expected), (M, N, K, plan)


@pytest.mark.parametrize(
    ("layout", "copies"),
    [
        ("row-major", False),
        ("row-major-padded", False),
        ("transposed", False),
        ("transposed-padded", False),
        ("tight-column-major", False),
        ("column-step", True),
        ("both-steps", True),
        ("broadcast-rows", True),
        ("broadcast-cols", True),
    ],
)
def test_copies_only_what_cublas_cannot_read_in_place(layout: str, copies: bool) -> None:
    gen = np.random.default_rng(0)
    self_ = LAYOUTS[layout](5, 7, gen)
    mat2 = LAYOUTS[layout](7, 3, gen)
    plan = plan_for(self_, mat2)
    assert (plan.copy_self, plan.copy_mat2) == (copies, copies)


@pytest.mark.parametrize("length", [2, 5])
@pytest.mark.parametrize("step", [1, 2, 9])
@pytest.mark.parametrize("ignored", [0, 1, 7, 2**40])
def test_vectors_are_read_in_place_whatever_their_strides(length: int, step: int, ignored: int) -> None:
    """A [1, n] or [n, 1] operand is a strided vector: op and ld always fit it, so it is never copied."""
    gen = np.random.default_rng(4)
    for M, N, K in [(1, length, 3), (length, 1, 3), (1, 4, length), (3, length, 1), (length, 4, 1)]:
        self_ = _strided(M, K, (step, ignored) if K == 1 else (ignored, step) if M == 1 else (K, 1), gen)
        mat2 = _strided(K, N, (step, ignored) if N == 1 else (ignored, step) if K == 1 else (N, 1), gen)
        plan = plan_for(self_, mat2)
        assert (plan.copy_self, plan.copy_mat2) == (False, False), (M, N, K, plan)
        assert np.array_equal(run_plan(plan, self_, mat2), self_.numpy() @ mat2.numpy())


def test_contiguous_operands_are_the_textbook_swap() -> None:
    # out[M, N] = self[M, K] @ mat2[K, N] is, column-major, C(N×M) = mat2ᵀ(N×K) · selfᵀ(K×M).
    plan = plan_gemm(4, 6, 5, (5, 1), (6, 1))
    assert plan == GemmPlan(
        transa=CUBLAS_OP_N, transb=CUBLAS_OP_N, m=6, n=4, k=5, lda=6, ldb=5, ldc=6,
        copy_mat2=False, copy_self=False,
    )  # fmt: skip


def test_linear_weight_transpose_uses_op_t() -> None:
    # F.linear(x, W) calls mm(x, W.t()) with W [N, K] contiguous: mat2 strides (1, K).
    plan = plan_gemm(4, 6, 5, (5, 1), (1, 5))
    assert (plan.transa, plan.lda, plan.copy_mat2) == (CUBLAS_OP_T, 5, False)
    plan = plan_gemm(4, 6, 5, (1, 4), (6, 1))  # self a transposed view
    assert (plan.transb, plan.ldb, plan.copy_self) == (CUBLAS_OP_T, 4, False)


@pytest.mark.parametrize("zero", ["M", "N", "K"])
def test_zero_sizes_still_give_legal_leading_dimensions(zero: str) -> None:
    sizes = {"M": 3, "N": 4, "K": 5, zero: 0}
    plan = plan_gemm(sizes["M"], sizes["N"], sizes["K"], (0, 0), (0, 0))
    emulate_gemm_ex(plan, np.zeros(1), np.zeros(1), np.zeros(max(1, sizes["M"] * sizes["N"])))
    assert min(plan.lda, plan.ldb, plan.ldc) >= 1


@pytest.mark.parametrize(
    ("sizes", "argument", "what"),
    [
        ((2**31, 1, 1), "self", "(M)"),
        ((1, 2**31, 1), "mat2", "(N)"),
        ((1, 1, 2**31), "self", "(K)"),
    ],
)
def test_sizes_past_int32_are_an_invalid_argument(
    sizes: tuple[int, int, int], argument: str, what: str
) -> None:
    M, N, K = sizes
    with pytest.raises(MmOutArgumentError) as info:
        plan_gemm(M, N, K, (K, 1), (N, 1))
    assert (info.value.argument, info.value.rule) == (argument, "size-limit")
    assert what in str(info.value)
    assert str(2**31) in str(info.value)
    plan_gemm(INT32_MAX, 1, 1, (1, 1), (1, 1))  # the largest legal size is fine


def test_a_leading_dimension_past_int32_is_copied_not_truncated() -> None:
    plan = plan_gemm(2, 3, 4, (2**31, 1), (1, 2**32))
    assert plan.copy_self
    assert plan.copy_mat2
    assert (plan.ldb, plan.lda) == (4, 3)


def _mutations(plan: GemmPlan, self_: torch.Tensor, mat2: torch.Tensor) -> list[GemmPlan]:
    flip = {CUBLAS_OP_N: CUBLAS_OP_T, CUBLAS_OP_T: CUBLAS_OP_N}
    bad = [
        dataclasses.replace(plan, transa=flip[plan.transa]),
        dataclasses.replace(plan, transb=flip[plan.transb]),
        dataclasses.replace(plan, lda=plan.lda + 1),
        dataclasses.replace(plan, ldb=plan.ldb + 1),
        dataclasses.replace(plan, lda=plan.lda - 1),
        dataclasses.replace(plan, m=plan.n, n=plan.m),
    ]
    # Copying a tensor that is already row-major contiguous changes nothing, so only flip the others.
    if not self_.is_contiguous():
        bad.append(dataclasses.replace(plan, copy_self=not plan.copy_self))
    if not mat2.is_contiguous():
        bad.append(dataclasses.replace(plan, copy_mat2=not plan.copy_mat2))
    return bad


@pytest.mark.parametrize(
    ("self_layout", "mat2_layout"),
    [("row-major", "transposed"), ("transposed", "row-major-padded"), ("row-major-padded", "row-major")],
)
def test_emulator_catches_broken_plans(self_layout: str, mat2_layout: str) -> None:
    """The emulation check can fail: every small corruption of a correct plan is noticed."""
    mutations = 0
    gen = np.random.default_rng(1)
    self_ = LAYOUTS[self_layout](5, 7, gen)
    mat2 = LAYOUTS[mat2_layout](7, 3, gen)
    expected = self_.numpy() @ mat2.numpy()
    good = plan_for(self_, mat2)
    assert np.array_equal(run_plan(good, self_, mat2), expected)
    for bad in _mutations(good, self_, mat2):
        try:
            got = run_plan(bad, self_, mat2)
        except (IllegalArgument, ValueError):
            mutations += 1
            continue  # cuBLAS would reject it, or the shapes no longer fit: noticed
        assert not np.array_equal(got, expected), bad
        mutations += 1
    assert mutations >= 6


# --------------------------------------------------------------------------------------------------
# Memory footprint of in-place operands (used by the no-overlap rule)


def test_operand_rows_cover_exactly_the_elements_of_the_operand() -> None:
    gen = np.random.default_rng(2)
    for layout in LAYOUTS:
        for M, N, K in SHAPES[::7]:
            self_ = LAYOUTS[layout](M, K, gen)
            mat2 = LAYOUTS[layout](K, N, gen)
            plan = plan_for(self_, mat2)
            for name, t in (("self", self_), ("mat2", mat2)):
                rows = operand_rows(plan, name)
                if rows is None:
                    continue
                count, length, pitch = rows
                covered = {i * pitch + j for i in range(count) for j in range(length)}
                actual = {
                    r * t.stride(0) + c * t.stride(1) for r in range(t.shape[0]) for c in range(t.shape[1])
                }
                assert covered == actual, (layout, name, M, N, K, rows)


def test_copied_operands_have_no_footprint() -> None:
    plan = plan_gemm(3, 4, 5, (10, 2), (0, 1))
    assert plan.copy_self
    assert plan.copy_mat2
    assert operand_rows(plan, "self") is None
    assert operand_rows(plan, "mat2") is None
    with pytest.raises(ValueError, match="operand"):
        operand_rows(plan, "out")


def test_runs_meet_range_matches_brute_force() -> None:
    gen = np.random.default_rng(3)
    for _ in range(4000):
        start, count, length, pitch = (int(x) for x in gen.integers(0, 12, size=4))
        lo = int(gen.integers(0, 40))
        hi = lo + int(gen.integers(0, 12))
        cells = {start + i * pitch + j for i in range(count) for j in range(length)}
        expected = any(lo <= x < hi for x in cells)
        assert runs_meet_range(start, count, length, pitch, lo, hi) == expected, (
            start, count, length, pitch, lo, hi,
        )  # fmt: skip
