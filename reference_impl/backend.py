"""The reference backend as the suite sees it: one object implementing the plug-in protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__version__ = "0.1.0"


class ReferenceBackend:
    """Implements the protocol of ``conformance/protocol.py`` by delegating to the reference parts."""

    name = "reference_impl"
    version = __version__

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        # Imported on first use so that loading the backend never loads cuBLAS.
        from reference_impl.shims.mm_out import mm_out

        mm_out(out, self_, mat2)


BACKEND = ReferenceBackend()
