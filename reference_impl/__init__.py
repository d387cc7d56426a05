"""The reference AOTInductor-style CUDA backend: lowering, runtime and the cuBLAS ``mm_out`` shim.

``BACKEND`` is the object the conformance suite loads by default (``reference_impl:BACKEND``); ``ORACLE``
the same backend with options of its own, the differential chapter's oracle (``reference_impl:ORACLE``).
"""

from reference_impl.backend import BACKEND, ORACLE, ReferenceBackend

__all__ = ["BACKEND", "ORACLE", "ReferenceBackend"]
