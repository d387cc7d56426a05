"""The reference cuBLAS shims: ``mm_out`` (what AOTInductor code calls as ``aoti_torch_cuda_mm_out``).

Importing this package never loads libcublas; the first computation does.
"""

from reference_impl.shims.errors import CublasError, CublasNotFoundError, MmOutArgumentError
from reference_impl.shims.mm_out import mm_out

__all__ = ["CublasError", "CublasNotFoundError", "MmOutArgumentError", "mm_out"]
