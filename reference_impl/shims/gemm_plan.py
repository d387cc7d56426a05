"""Map a row-major ``out[M, N] = self[M, K] @ mat2[K, N]`` onto one column-major ``cublasGemmEx`` call.

Pure arithmetic on sizes and strides (no torch, no CUDA), so every layout rule is testable on a CPU.

cuBLAS is column-major. A row-major ``C = A·B`` has the same memory as the column-major ``Cᵀ = Bᵀ·Aᵀ``,
so cuBLAS computes ``m = N``, ``n = M``, ``k = K`` with its first operand read from ``mat2``'s memory and
its second from ``self``'s. A row-major operand (unit column stride) is already the transposed matrix
cuBLAS wants (``CUBLAS_OP_N``, ``ld`` = row stride); a column-major one (unit row stride, e.g. ``W.t()``)
is read with ``CUBLAS_OP_T`` (``ld`` = column stride); anything else is copied to a contiguous scratch.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference_impl.shims.errors import MmOutArgumentError

CUBLAS_OP_N = 0
CUBLAS_OP_T = 1

#: cublasGemmEx takes every size and leading dimension as a C ``int``.
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class GemmPlan:
    """The arguments of one ``cublasGemmEx`` call (A = mat2's memory, B = self's memory, C = out)."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    #: mat2 must first be copied to a row-major contiguous scratch (``transa``/``lda`` describe the copy).
    copy_mat2: bool
    #: self must first be copied to a row-major contiguous scratch (``transb``/``ldb`` describe the copy).
    copy_self: bool


def _in_place_layout(rows: int, cols: int, stride: tuple[int, int]) -> tuple[int, int] | None:
    """``(op, ld)`` that reads a ``[rows, cols]`` operand where it lies, or None when it must be copied.

    ``CUBLAS_OP_N`` reads it as the column-major ``cols × rows`` matrix (needs ``ld >= max(1, cols)``),
    ``CUBLAS_OP_T`` as the column-major ``rows × cols`` matrix (needs ``ld >= max(1, rows)``). The stride
    of a size-1 (or size-0) dimension is never used to address anything and torch leaves it arbitrary,
    so it is ignored and the smallest legal ``ld`` is chosen instead.
    """
    row_stride, col_stride = stride
    if cols <= 1 or col_stride == 1:  # row-major
        ld = row_stride if rows > 1 else max(1, cols)
        if max(1, cols) <= ld <= INT32_MAX:
            return CUBLAS_OP_N, ld
    if rows <= 1 or row_stride == 1:  # column-major, e.g. a transposed view
        ld = col_stride if cols > 1 else max(1, rows)
        if max(1, rows) <= ld <= INT32_MAX:
            return CUBLAS_OP_T, ld
    # Another stride pattern, overlapping rows (stride 0) or an ld past int32: a contiguous copy has
    # ld = cols, which the size check below already bounds.
    return None


def _check_size(argument: str, what: str, value: int) -> None:
    if value > INT32_MAX:
        raise MmOutArgumentError(
            argument,
            "size-limit",
            f"{what} is {value}, more than cuBLAS accepts ({INT32_MAX}, a 32-bit signed int)",
        )


def plan_gemm(M: int, N: int, K: int, self_stride: tuple[int, int], mat2_stride: tuple[int, int]) -> GemmPlan:
    """Plan ``out[M, N] = self[M, K] @ mat2[K, N]`` for a row-major contiguous ``out``.

    Raises ``MmOutArgumentError`` (rule ``size-limit``) when a size does not fit cuBLAS's ``int``;
    a leading dimension that does not fit is not an error: that operand is copied instead.
    """
    _check_size("self", "self.size(0) (M)", M)
    _check_size("self", "self.size(1) (K)", K)
    _check_size("mat2", "mat2.size(1) (N)", N)
    a_layout = _in_place_layout(K, N, mat2_stride)
    b_layout = _in_place_layout(M, K, self_stride)
    # A contiguous scratch is row-major with row stride = its column count.
    transa, lda = a_layout if a_layout is not None else (CUBLAS_OP_N, max(1, N))
    transb, ldb = b_layout if b_layout is not None else (CUBLAS_OP_N, max(1, K))
    return GemmPlan(
        transa=transa,
        transb=transb,
        m=N,
        n=M,
        k=K,
        lda=lda,
        ldb=ldb,
        ldc=max(1, N),  # out is row-major contiguous: column-major N × M with ld = N
        copy_mat2=a_layout is None,
        copy_self=b_layout is None,
    )


def operand_rows(plan: GemmPlan, operand: str) -> tuple[int, int, int] | None:
    """Where cuBLAS reads an in-place operand: ``(count, length, pitch)`` in elements.

    The operand's elements are ``count`` runs of ``length`` consecutive elements, ``pitch`` apart,
    starting at its first element. None when the plan copies the operand (cuBLAS reads the scratch).
    """
    if operand == "mat2":
        if plan.copy_mat2:
            return None
        # op N: K rows of N elements; op T: N columns of K elements.
        count, length = (plan.k, plan.m) if plan.transa == CUBLAS_OP_N else (plan.m, plan.k)
        return count, length, plan.lda
    if operand == "self":
        if plan.copy_self:
            return None
        # op N: M rows of K elements; op T: K columns of M elements.
        count, length = (plan.n, plan.k) if plan.transb == CUBLAS_OP_N else (plan.k, plan.n)
        return count, length, plan.ldb
    raise ValueError(f"operand must be 'self' or 'mat2', not {operand!r}")


def runs_meet_range(start: int, count: int, length: int, pitch: int, lo: int, hi: int) -> bool:
    """Whether a run ``[start + i*pitch, start + i*pitch + length)``, ``0 <= i < count``, meets ``[lo, hi)``.

    Exact (not a bounding-box test), so an ``out`` that lies in the gaps between another tensor's rows is
    not reported. All quantities are in one unit (bytes, say); ``pitch >= length`` is not required.
    """
    if count <= 0 or length <= 0 or hi <= lo:
        return False
    if count == 1 or pitch == 0:
        return start < hi and start + length > lo
    # Run i meets [lo, hi) iff start + i*pitch < hi and start + i*pitch + length > lo.
    first = max(0, (lo - start - length) // pitch + 1)
    last = min(count - 1, (hi - start - 1) // pitch)
    return first <= last
