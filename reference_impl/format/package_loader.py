"""Load AOTInductor packages fast: torch's C++ loader without ``aoti_load_package``'s first-load cost.

``torch._inductor.aoti_load_package`` calls ``get_device_information()`` only to log a mismatch warning, and
that imports inductor and runs a compile-and-load probe per CPU vector ISA: ~10 compiler subprocesses and
28-40 s on the first load in every fresh process of the GPU image (SPEC §3). The loader itself,
``AOTIModelPackageLoader``, needs none of it (findings: reference_impl/lowering/NOTES.md).

In the format floor because both wings load the package a blob carries the same way: the runtime's ``init``
and the lowering's toolchain preflight and load probe (what the preflight proves, the runtime does).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["FastAOTIModel", "load_package_fast"]


class FastAOTIModel:
    """A loaded AOTInductor package: ``run(list of tensors) -> list of tensors``, or call it."""

    def __init__(self, loader: Any, path: str) -> None:
        self.loader = loader
        self.path = path

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """Flat tensor inputs in, flat tensor outputs out (the package's calling convention)."""
        return list(self.loader.run(list(inputs)))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils import _pytree as pytree

        _, out_spec_text = self.loader.get_call_spec()
        flat = pytree.tree_flatten((args, kwargs))[0]
        outputs = self.loader.boxed_run([x for x in flat if isinstance(x, torch.Tensor)])
        return pytree.tree_unflatten(outputs, pytree.treespec_loads(out_spec_text))

    def get_metadata(self) -> dict[str, str]:
        return dict(self.loader.get_metadata())


def load_package_fast(
    path: str | os.PathLike[str],
    *,
    model_name: str = "model",
    device_index: int = -1,
    run_single_threaded: bool = False,
    num_runners: int = 1,
) -> FastAOTIModel:
    """Load a ``.pt2`` package with torch's C++ loader, without importing inductor or probing the CPU ISA.

    Same loader as ``torch._inductor.aoti_load_package`` (``AOTIModelPackageLoader``), minus that function's
    ``get_device_information`` call, which only feeds a mismatch *warning* but costs an inductor import and a
    compile-and-dlopen probe per CPU vector ISA on the first load of each process.
    """
    import torch

    ctor = torch._C._aoti.AOTIModelPackageLoader
    path = os.fspath(path)
    try:
        loader = ctor(path, model_name, run_single_threaded, num_runners, device_index)
    except TypeError:  # older signatures: (path, name, single_threaded, num_runners) / (path, name)
        try:
            loader = ctor(path, model_name, run_single_threaded, num_runners)
        except TypeError:
            loader = ctor(path, model_name)
    return FastAOTIModel(loader, path)
