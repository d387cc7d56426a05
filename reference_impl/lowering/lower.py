"""``lower_program``: every method of a model → one program file (the backend protocol's ``lower``).

Each method is preprocessed on its own (``preprocess.py``: edge graph, view-copy pass, AOTInductor package
through the artifact cache, fallback-kernel check) and the blobs are packed into one program
(``program.py``: a manifest with format version, methods, content hashes, torch/CUDA versions and target
device, then the per-method blobs keyed by method name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from reference_impl.format.compile_spec import validate_method_name
from reference_impl.format.errors import EmptyProgramError
from reference_impl.format.placement import MethodPlacement
from reference_impl.format.program import Program, build_program, program_from_bytes, program_to_bytes
from reference_impl.lowering.preprocess import CacheArg, PreprocessResult, preprocess, resolve_device

__all__ = ["LoweredProgram", "lower_program", "lower_program_detailed"]


@dataclass(frozen=True)
class LoweredProgram:
    """The program file and each method's preprocess result (kernels, pass report, cache hit, timings)."""

    data: bytes = field(repr=False)
    results: Mapping[str, PreprocessResult]

    @property
    def program(self) -> Program:
        return program_from_bytes(self.data)


def _check_methods(methods: object) -> dict[str, tuple[nn.Module, tuple[Any, ...]]]:
    if not isinstance(methods, Mapping):
        raise ValueError(
            f"methods must map method names to (module, example inputs), got {type(methods).__name__}"
        )
    if not methods:
        raise EmptyProgramError("methods is empty; a program needs at least one method")
    checked: dict[str, tuple[nn.Module, tuple[Any, ...]]] = {}
    for name, entry in methods.items():
        validate_method_name(name, what="method name")
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"method {name!r}: expected a (module, example inputs) pair, got {entry!r:.80}")
        module, inputs = entry
        if not isinstance(module, nn.Module):
            raise ValueError(
                f"method {name!r}: module must be a torch.nn.Module, got {type(module).__name__}"
            )
        if not isinstance(inputs, (tuple, list)):
            raise ValueError(f"method {name!r}: example inputs must be a tuple, got {type(inputs).__name__}")
        checked[name] = (module, tuple(inputs))
    return checked


def lower_program_detailed(
    methods: Mapping[str, tuple[nn.Module, tuple[Any, ...]]],
    *,
    device: str,
    cache: CacheArg = None,
    provided_kernels: Iterable[str] | None = None,
    dynamic_shapes: Mapping[str, Any] | None = None,
    view_pass: bool = True,
    inductor_configs: Mapping[str, Any] | None = None,
    cxx: str | None = None,
    placement: Mapping[str, MethodPlacement] | None = None,
    native_mm_out: bool | None = None,
) -> LoweredProgram:
    """Like ``lower_program``, returning the per-method results too."""
    checked = _check_methods(methods)
    target = resolve_device(device)
    placements = dict(placement or {})
    stray = sorted(set(placements) - set(checked))
    if stray:
        raise ValueError(f"placement names methods that are not lowered: {stray}; methods: {list(checked)}")
    shapes = dict(dynamic_shapes or {})
    unknown = sorted(set(shapes) - set(checked))
    if unknown:
        raise ValueError(
            f"dynamic_shapes names methods that are not lowered: {unknown}; methods: {list(checked)}"
        )
    provided = None if provided_kernels is None else frozenset(provided_kernels)
    results: dict[str, PreprocessResult] = {}
    for name, (module, inputs) in checked.items():
        results[name] = preprocess(
            module,
            inputs,
            method_name=name,
            device=target,
            provided_kernels=provided,
            view_pass=view_pass,
            dynamic_shapes=shapes.get(name),
            inductor_configs=inductor_configs,
            cxx=cxx,
            cache=cache,
            placement=placements.get(name),
            native_mm_out=native_mm_out,
        )
    program = build_program(
        ((name, result.blob) for name, result in results.items()),
        device=target.type,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
    )
    return LoweredProgram(program_to_bytes(program), MappingProxyType(results))


def lower_program(
    methods: Mapping[str, tuple[nn.Module, tuple[Any, ...]]],
    *,
    device: str,
    cache: CacheArg = None,
    provided_kernels: Iterable[str] | None = None,
    dynamic_shapes: Mapping[str, Any] | None = None,
    view_pass: bool = True,
    inductor_configs: Mapping[str, Any] | None = None,
    cxx: str | None = None,
    placement: Mapping[str, MethodPlacement] | None = None,
    native_mm_out: bool | None = None,
) -> bytes:
    """Lower every method for ``device`` ("cpu" or "cuda[:N]") into one program file.

    ``methods`` maps a method name to ``(module, example inputs)``. Raises ``ValueError`` subclasses naming
    what cannot be lowered (bad names or entries, unsupported fallback kernels, non-delegable nodes).
    ``cache``: None = the default artifact cache, False = none, or an ``ArtifactCache``. ``placement``:
    each method's export-time device placement (``placement.resolve_placement``).
    """
    return lower_program_detailed(
        methods,
        device=device,
        cache=cache,
        provided_kernels=provided_kernels,
        dynamic_shapes=dynamic_shapes,
        view_pass=view_pass,
        inductor_configs=inductor_configs,
        cxx=cxx,
        placement=placement,
        native_mm_out=native_mm_out,
    ).data
