"""PyTorch's own AOTInductor runtime behind the suite's plug-in protocol: ``torch_aoti:BACKEND`` and
``torch_aoti:CHECKED``.

An adapter, not a backend of its own: programs are ``.pt2`` packages from ``torch._inductor``'s
``aot_compile`` + ``package_aoti``, run by ``torch._inductor.package.load_package`` (``backend.py`` says what
is implemented and why the rest is not). Two objects, one per input-check mode of the generated code:

* ``BACKEND`` — the environment as it is (a deployment's default: ``AOTI_RUNTIME_CHECK_INPUTS`` unset, no
  input checks); its ``name``/``version`` say which mode the environment gave at load.
* ``CHECKED`` — sets ``AOTI_RUNTIME_CHECK_INPUTS=1`` in ``os.environ`` when loaded, so every model that first
  runs afterwards checks its inputs' dtype, sizes, strides and device (pytorch#151828).

Each compiled model reads the variable once, at its first run (a ``static`` getenv), so one process runs one
mode: loading ``CHECKED`` after a model ran without checks raises ``RuntimeError``. ``nox -s
conformance_torch_aoti`` runs the two modes in two processes, into two result files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch_aoti.backend import TorchAotiBackend

__all__ = ["BACKEND", "CHECKED"]

_backends: dict[str, TorchAotiBackend] = {}


def _load(name: str) -> TorchAotiBackend:
    from torch_aoti import backend

    if name == "CHECKED":
        if backend.first_run_mode() is False:
            raise RuntimeError(
                f"torch_aoti:CHECKED: a model already ran in this process without {backend.CHECK_ENV}; "
                "compiled models read it once, so run the checked mode in a process of its own"
            )
        os.environ[backend.CHECK_ENV] = "1"  # before any model of this mode runs (read at its first run)
    return backend.TorchAotiBackend(checked=backend.checks_on())


def __getattr__(name: str) -> object:
    # Module-level __getattr__ (PEP 562): CHECKED changes the environment only when the suite loads it.
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _backends:
        _backends[name] = _load(name)
    return _backends[name]
