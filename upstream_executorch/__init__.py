"""Upstream ExecuTorch, from PyPI, behind the suite's plug-in protocol (``upstream_executorch:BACKEND``).

An adapter, not a backend of its own: every verdict and every program comes from upstream's code, run
unchanged. It implements

* part ``view_pass`` — upstream's ``ReplaceViewCopyWithViewPass`` (``backends/aoti/passes``);
* part ``lowering`` for ``cuda`` only — ``torch.export`` → ``to_edge_transform_and_lower`` with
  ``CudaPartitioner`` → ``to_executorch``, with export-time device placement (``PropagateDeviceConfig``);

and deliberately *not* part ``runtime``: the PyPI wheel is a CPU build whose runtime registers no
``CudaBackend`` delegate (see ``backend.py``), so nothing in it can run the programs it lowers.

Importing this package never imports executorch (nor fails without it); loading ``BACKEND`` checks that
executorch and the three packages its AOT path needs are installed and says how to get them if not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from upstream_executorch.backend import ExecutorchBackend

__all__ = ["BACKEND"]

_backend: ExecutorchBackend | None = None


def __getattr__(name: str) -> object:
    # Module-level __getattr__ (PEP 562): the import check runs when the suite loads BACKEND, not when the
    # package is imported, so a missing executorch is a clear ImportError at that point.
    global _backend
    if name != "BACKEND":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _backend is None:
        from upstream_executorch.backend import ExecutorchBackend, require_executorch

        _backend = ExecutorchBackend(require_executorch())
    return _backend
