"""Errors of the cuBLAS ``mm_out`` shim.

Contract violations are ``ValueError`` (invalid argument) and name the argument and the rule it broke;
library failures are ``RuntimeError`` (internal), as ``conformance/protocol.py`` requires.
"""

from __future__ import annotations

#: Every rule ``mm_out`` enforces, by id, in the order it checks them, with the rule in words.
RULES: dict[str, str] = {
    "present": "every argument is given (not None)",
    "is-tensor": "every argument is a torch.Tensor",
    "strided-layout": "every tensor has the strided (dense) layout",
    "rank-2": "every tensor has exactly two dimensions",
    "supported-dtype": "the dtype is float32, float16 or bfloat16",
    "same-dtype": "self, mat2 and out share one dtype",
    "inner-dimension": "mat2.size(0) equals self.size(1)",
    "out-shape": "out has shape [self.size(0), mat2.size(1)]",
    "out-contiguous": "out is row-major contiguous",
    "size-limit": "every size cuBLAS sees fits in a 32-bit signed int",
    "no-overlap": "out shares no memory with self or mat2",
    "cuda-device": "every tensor is on a CUDA device",
    "same-device": "every tensor is on the same CUDA device",
    "device-index": "the device index names a visible CUDA device",
}


class MmOutArgumentError(ValueError):
    """An invalid argument to ``mm_out``: names the argument (``out``, ``self``, ``mat2``) and the rule."""

    def __init__(self, argument: str, rule: str, detail: str) -> None:
        self.argument = argument
        self.rule = rule
        self.detail = detail
        super().__init__(f"mm_out: argument '{argument}' breaks rule '{rule}': {detail}")

    def __reduce__(self) -> tuple[type[MmOutArgumentError], tuple[str, str, str]]:
        # The default reduce would replay args=(message,) into a three-argument __init__ (pickling, xdist).
        return (type(self), (self.argument, self.rule, self.detail))


class CublasError(RuntimeError):
    """A cuBLAS call returned a status other than CUBLAS_STATUS_SUCCESS."""

    def __init__(self, function: str, status: int, status_name: str) -> None:
        self.function = function
        self.status = status
        self.status_name = status_name
        super().__init__(f"cuBLAS call {function} failed with {status_name} (status {status})")

    def __reduce__(self) -> tuple[type[CublasError], tuple[str, int, str]]:
        return (type(self), (self.function, self.status, self.status_name))


class CublasNotFoundError(RuntimeError):
    """No usable libcublas was found; the message lists every place searched and every failed load."""

    def __init__(self, searched: tuple[str, ...], failures: tuple[str, ...] = ()) -> None:
        self.searched = searched
        self.failures = failures
        lines = ["cannot find a usable libcublas; searched:"]
        lines += [f"  - {place}" for place in searched]
        if failures:
            lines.append("candidates that failed to load:")
            lines += [f"  - {failure}" for failure in failures]
        lines.append(
            "install a CUDA build of torch (its nvidia-cublas wheel provides libcublas) or set CUDA_HOME"
        )
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[type[CublasNotFoundError], tuple[tuple[str, ...], tuple[str, ...]]]:
        return (type(self), (self.searched, self.failures))
