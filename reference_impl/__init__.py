"""The reference AOTInductor-style CUDA backend: lowering, runtime and the cuBLAS ``mm_out`` shim.

``BACKEND`` is the object the conformance suite loads by default (``reference_impl:BACKEND``).
"""

from reference_impl.backend import BACKEND, ReferenceBackend

__all__ = ["BACKEND", "ReferenceBackend"]
