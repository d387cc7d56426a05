"""The reference ``aoti_torch_cuda_mm_out``: ``out = self @ mat2`` with one ``cublasGemmEx`` call.

Every check runs before anything is allocated, copied or written, so ``out`` is untouched on any error;
each error names the argument and the rule (``errors.RULES`` lists them in checking order). The work
goes on the caller's current stream with this thread's handle for the device; nothing synchronises and
nothing is locked, so threads and devices run concurrently.

Fast path: a call whose types, dtypes, shapes, strides and devices match one that already passed every
check (``call_cache``) re-checks only what can differ between such calls (addresses, negative-view
bits, the current device) and goes straight to cuBLAS; anything else takes the full path, which is also
where every error is raised. It exists because the checks cost more host time than the launch itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from reference_impl.shims import cublas_library
from reference_impl.shims.call_cache import (
    CallCache,
    FastCall,
    Key,
    call_key,
    extent_bytes,
    has_negative_view,
    may_overlap,
)
from reference_impl.shims.errors import MmOutArgumentError
from reference_impl.shims.gemm_plan import GemmPlan, operand_rows, plan_gemm, runs_meet_range

#: torch dtype → cudaDataType_t; compute is CUBLAS_COMPUTE_32F for all three.
CUDA_DATA_TYPES: dict[torch.dtype, int] = {
    torch.float32: cublas_library.CUDA_R_32F,
    torch.float16: cublas_library.CUDA_R_16F,
    torch.bfloat16: cublas_library.CUDA_R_16BF,
}


def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _check_no_overlap(out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, plan: GemmPlan) -> None:
    """cuBLAS writes ``out`` while it reads the operands: an overlap would corrupt the result."""
    if out.device.type == "meta":  # no memory, and every meta tensor reports address 0
        return
    itemsize = out.element_size()
    lo = out.data_ptr()
    hi = lo + out.numel() * itemsize
    for name, tensor in (("self", self_), ("mat2", mat2)):
        rows = operand_rows(plan, name)
        if rows is None or tensor.device != out.device:
            continue  # a copied operand is read from its scratch, which cannot overlap out
        count, length, pitch = rows
        if runs_meet_range(tensor.data_ptr(), count, length * itemsize, pitch * itemsize, lo, hi):
            raise MmOutArgumentError(
                "out",
                "no-overlap",
                f"out shares memory with {name}; cuBLAS would overwrite {name} while reading it",
            )


def validate(out: object, self_: object, mat2: object) -> tuple[int, int, int, GemmPlan | None]:
    """Check every rule in order; return ``(M, N, K, plan)``, with no plan when cuBLAS has nothing to do.

    Pure inspection of the arguments: it allocates nothing and never touches a tensor's data.
    """
    self_, mat2, out = _tensors(self_, mat2, out)
    tensors = (("self", self_), ("mat2", mat2), ("out", out))
    _check_kinds(tensors)
    M, N, K = _check_agreement(self_, mat2, out)
    plan = None
    if M and N and K:  # only a real product reaches cuBLAS and its limits
        plan = plan_gemm(M, N, K, (self_.stride(0), self_.stride(1)), (mat2.stride(0), mat2.stride(1)))
        _check_no_overlap(out, self_, mat2, plan)
    _check_devices(tensors, out)
    return M, N, K, plan


def _tensors(self_: object, mat2: object, out: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rules ``present`` (none is None) then ``is-tensor``, over all three arguments in turn."""
    named = (("self", self_), ("mat2", mat2), ("out", out))
    for name, value in named:
        if value is None:
            raise MmOutArgumentError(name, "present", f"{name} is None; mm_out needs a tensor")
    checked: list[torch.Tensor] = []
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise MmOutArgumentError(
                name, "is-tensor", f"{name} is a {type(value).__name__}, not a torch.Tensor"
            )
        checked.append(value)
    return checked[0], checked[1], checked[2]


def _check_kinds(tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Rules ``strided-layout``, ``rank-2`` and ``supported-dtype``, each over all three in turn."""
    for name, t in tensors:
        if t.layout != torch.strided:
            raise MmOutArgumentError(
                name, "strided-layout", f"{name} has layout {t.layout}; mm_out needs torch.strided"
            )
    for name, t in tensors:
        if t.dim() != 2:
            raise MmOutArgumentError(
                name, "rank-2", f"{name} has {t.dim()} dimensions (shape {_shape(t)}); mm_out needs 2"
            )
    for name, t in tensors:
        if t.dtype not in CUDA_DATA_TYPES:
            raise MmOutArgumentError(
                name,
                "supported-dtype",
                f"{name} has dtype {t.dtype}; mm_out supports torch.float32, torch.float16, torch.bfloat16",
            )


def _check_agreement(self_: torch.Tensor, mat2: torch.Tensor, out: torch.Tensor) -> tuple[int, int, int]:
    """Rules ``same-dtype``, ``inner-dimension``, ``out-shape``, ``out-contiguous``; returns ``(M, N, K)``."""
    if mat2.dtype != self_.dtype:
        raise MmOutArgumentError(
            "mat2", "same-dtype", f"mat2 has dtype {mat2.dtype} but self has {self_.dtype}"
        )
    if out.dtype != self_.dtype:
        raise MmOutArgumentError(
            "out", "same-dtype", f"out has dtype {out.dtype} but self and mat2 have {self_.dtype}"
        )
    M, K = self_.shape
    K2, N = mat2.shape
    if K2 != K:
        raise MmOutArgumentError(
            "mat2",
            "inner-dimension",
            f"mat2 has {K2} rows (shape {_shape(mat2)}) but self has {K} columns (shape {_shape(self_)})",
        )
    if tuple(out.shape) != (M, N):
        raise MmOutArgumentError(
            "out", "out-shape", f"out has shape {_shape(out)} but self @ mat2 has shape {[M, N]}"
        )
    if not out.is_contiguous():
        raise MmOutArgumentError(
            "out",
            "out-contiguous",
            f"out has strides {tuple(out.stride())} for shape {_shape(out)}; "
            f"mm_out needs row-major contiguous strides ({N}, 1)",
        )
    return M, N, K


def _check_devices(tensors: Sequence[tuple[str, torch.Tensor]], out: torch.Tensor) -> None:
    """Rules ``cuda-device`` (each of the three), ``same-device`` (self and mat2 as out) and
    ``device-index`` (out's device is one of the visible ones)."""
    for name, t in tensors:
        if t.device.type != "cuda":
            raise MmOutArgumentError(
                name, "cuda-device", f"{name} is on {t.device}; mm_out needs CUDA tensors"
            )
    for name, t in tensors[:2]:
        if t.device != out.device:
            raise MmOutArgumentError(
                name, "same-device", f"{name} is on {t.device} but out is on {out.device}"
            )
    index = out.device.index
    visible = torch.cuda.device_count()
    if index is None or not 0 <= index < visible:
        raise MmOutArgumentError(
            "out", "device-index", f"out is on {out.device} but {visible} CUDA device(s) are visible"
        )


def _scratch(t: torch.Tensor) -> torch.Tensor:
    """A row-major contiguous copy on the current stream; copy_ also materialises a negative view."""
    scratch = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    scratch.copy_(t)
    return scratch


def gemm_alpha(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> float:
    """alpha that makes raw-memory GEMM honour negative views (``torch._neg_view``) without copying.

    A negative view's value is minus its memory, so each one among the operands read and ``out`` flips
    the sign of what cuBLAS must write.
    """
    negatives = sum(t.is_neg() for t in (a, b, out))
    return -1.0 if negatives % 2 else 1.0


CALLS = CallCache()


def _public_raw_stream(device_index: int) -> int:
    return torch.cuda.current_stream(device_index).cuda_stream


# torch's CUDA build binds both directly (inductor's generated code calls the stream one); the public
# wrappers build a Stream object or re-check lazy init per call, which is most of their cost.
_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_current_raw_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", _public_raw_stream)


def _enqueue_gemm(
    plan: GemmPlan, device_index: int, a: int, b: int, c: int, data_type: int, alpha: float
) -> None:
    """One cublasGemmEx on the current stream with this thread's handle (``device_index`` is current)."""
    library = cublas_library.load_cublas()
    owner = cublas_library.thread_handle(library, device_index)
    owner.bind_stream(_current_raw_stream(device_index))
    library.gemm_ex(
        owner.handle,
        plan.transa,
        plan.transb,
        plan.m,
        plan.n,
        plan.k,
        a,
        plan.lda,
        b,
        plan.ldb,
        c,
        plan.ldc,
        data_type,
        alpha=alpha,
    )


def _try_fast(out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, call: FastCall) -> bool:
    """Run a call of a validated key if nothing per-call rules it out; False: take the full path."""
    if has_negative_view(out, self_, mat2) or _current_device() != call.device_index:
        return False
    if may_overlap(out, self_, mat2, call):
        return False
    _enqueue_gemm(
        call.plan, call.device_index, mat2.data_ptr(), self_.data_ptr(), out.data_ptr(), call.data_type, 1.0
    )
    return True


def mm_out(out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
    """``out = self_ @ mat2`` on the caller's current stream; returns once the work is enqueued."""
    key = call_key(out, self_, mat2)
    if key is not None:
        call = CALLS.get(key)
        if call is not None and _try_fast(out, self_, mat2, call):
            return
    _mm_out_checked(out, self_, mat2, key)


def _mm_out_checked(out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, key: Key | None) -> None:
    """The full path: every check, then scratch copies where the layout needs them, then cuBLAS."""
    M, N, _, plan = validate(out, self_, mat2)
    if M == 0 or N == 0:
        return
    device = out.device
    with torch.no_grad(), torch.cuda.device(device):
        if plan is None:  # K == 0: an empty sum, as torch.mm
            out.zero_()
            return
        # Loaded only now, so a missing library fails after every check and before out is written.
        cublas_library.load_cublas()
        a = _scratch(mat2) if plan.copy_mat2 else mat2
        b = _scratch(self_) if plan.copy_self else self_
        data_type = CUDA_DATA_TYPES[out.dtype]
        _enqueue_gemm(
            plan, device.index, a.data_ptr(), b.data_ptr(), out.data_ptr(), data_type, gemm_alpha(a, b, out)
        )
        # The scratches (a, b) live until here, after the kernel is enqueued: the caching allocator
        # only reuses their memory for work queued later on this same stream, so no sync is needed.
        del a, b
    if key is not None and not (plan.copy_mat2 or plan.copy_self):
        # Passed every check and needs no scratch: later calls of this key may take the fast path.
        CALLS.put(
            key,
            FastCall(
                plan=plan,
                data_type=data_type,
                device_index=device.index,
                out_bytes=extent_bytes(out),
                self_bytes=extent_bytes(self_),
                mat2_bytes=extent_bytes(mat2),
            ),
        )
