"""Zoo models lowered through the protocol, once per worker process, shared by the chapters that run them.

Lowering is the expensive step (tens of seconds an AOTInductor compile); chapters ask for a
``LoweredModel`` by (model, dtype, device) and get the same program bytes every time in one process.
Backends that cache their own artifacts (the reference does, by content) make a warm suite fast too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from conformance.common.checks import fail
from conformance.common.parts import require_part
from conformance.common.rules import rule_id
from conformance.common.tolerances import DTYPES_BY_NAME
from conformance.models import ZooModel, get_model
from conformance.protocol import (
    SKIP_COPY_OPTION,
    Backend,
    LoweringBackend,
    RuntimeBackend,
    RuntimeOptionsBackend,
    implements,
    lowering_devices,
)
from harness.pytest_plugin import set_case_params

LOWER = rule_id("lowering/lower")


@dataclass(frozen=True)
class LoweredModel:
    """One lowered program and the eager modules and example inputs it was lowered from."""

    model: ZooModel
    dtype: torch.dtype
    device: str
    program: bytes
    eager: dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]

    @property
    def methods(self) -> list[str]:
        return list(self.eager)


_LOWERED: dict[tuple[object, ...], LoweredModel] = {}


def _options_key(options: Mapping[str, object] | None) -> str:
    return repr(
        sorted((k, sorted(v.items()) if isinstance(v, Mapping) else v) for k, v in (options or {}).items())
    )


def _lower(
    backend: LoweringBackend,
    model: str,
    dtype: torch.dtype,
    device: str,
    options: Mapping[str, object] | None,
) -> LoweredModel:
    key = (id(backend), model, dtype, device, _options_key(options))
    if key not in _LOWERED:
        entry = get_model(model)
        eager = entry.build(dtype, torch.device(device))
        extra = {} if not options else {"options": dict(options)}
        program = backend.lower(_lower_spec(entry, eager), device=device, **extra)
        _LOWERED[key] = LoweredModel(entry, dtype, device, program, eager)
    return _LOWERED[key]


def _lower_spec(
    entry: ZooModel, eager: Mapping[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]
) -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...], object]]:
    """``lower``'s ``methods`` argument for ``eager``: each method's module, inputs and dynamic shapes."""
    return {name: (mod, inputs, entry.dynamic_shapes_for(name)) for name, (mod, inputs) in eager.items()}


def lower_method(backend: LoweringBackend, model: str, dtype: torch.dtype, device: str, method: str) -> bytes:
    """Method ``method`` of zoo model ``model`` alone, lowered by ``backend`` as ``lowered`` lowers it within
    the whole program (the same module, inputs and dynamic shapes; no options): the pre-lowering's unit of
    work for a backend that caches each method apart (protocol attribute ``caches_methods``)."""
    require_lowering_device(backend, device)
    entry = get_model(model)
    spec = _lower_spec(entry, entry.build(dtype, torch.device(device)))
    if method not in spec:
        raise ValueError(
            f"lower_method: argument 'method' is no method of {model!r}: {method!r}; methods: {list(spec)}"
        )
    return backend.lower({method: spec[method]}, device=device)


def require_lowering_device(backend: Backend, device: str) -> None:
    """Skip (never fail) a case whose target device the backend does not lower for."""
    supported = lowering_devices(backend)
    if device not in supported:
        pytest.skip(f"backend {backend.name!r} lowers only for {', '.join(supported)}, not {device!r}")


def lowered(
    backend: LoweringBackend,
    model: str,
    dtype: torch.dtype,
    device: str,
    options: Mapping[str, object] | None = None,
) -> LoweredModel:
    """The zoo model ``model`` in ``dtype``, lowered by ``backend`` for ``device`` ("cpu" or "cuda"), with
    lowering ``options`` (the protocol's ``lower_options``), once per process."""
    require_lowering_device(backend, device)
    return _lower(backend, model, dtype, device, options)


def lower_or_fail(
    backend: LoweringBackend, model: str, dtype: str, device: str, options: Mapping[str, object] | None = None
) -> LoweredModel:
    """``lowered`` for a chapter: a backend that cannot lower the model fails the case, naming it."""
    try:
        return lowered(backend, model, DTYPES_BY_NAME[dtype], device, options)
    except pytest.skip.Exception:
        raise
    except Exception as exc:
        with_options = f", options={dict(options)!r}" if options else ""
        call = f"lower({model}, {dtype}, device={device!r}{with_options})"
        fail(LOWER, call, f"{type(exc).__name__}: {exc}")
    raise AssertionError("unreachable")


def record(request: pytest.FixtureRequest, **values: object) -> None:
    """Figures a case measured, as result-file params (and JUnit properties) for reports and notes."""
    for name, value in values.items():
        request.node.user_properties.append((name, value))
    set_case_params(request.node, values)


@contextlib.contextmanager
def option(backend: Backend, key: str, value: str) -> Iterator[None]:
    """Set a backend option for the block and restore the previous value after it, even on failure.

    A backend without part ``runtime_options`` (deprecated upstream: a current backend has none) copies
    every output, which is what the empty value asks for: the block runs as it is. Any other value needs
    the part: the case is skipped with the reason."""
    if not implements(backend, "runtime_options"):
        if value != "":
            require_part(backend, "runtime_options")
        yield
        return
    previous = backend.get_option(key)
    backend.set_option(key, value)
    try:
        yield
    finally:
        backend.set_option(key, previous)


@contextlib.contextmanager
def option_restored(backend: RuntimeOptionsBackend, key: str = SKIP_COPY_OPTION) -> Iterator[None]:
    """The block may set option ``key`` any way it likes (the runtime_options chapter's cases do, directly):
    afterwards it is what it was before, whatever the block did or broke. A ``get_option`` that fails is
    left for the case to report."""
    try:
        before = backend.get_option(key)
    except Exception:
        yield
        return
    try:
        yield
    finally:
        backend.set_option(key, before)


@contextlib.contextmanager
def handles(backend: RuntimeBackend, program: bytes, *methods: str) -> Iterator[list[object]]:
    """``init`` each method of ``program``; ``destroy`` them all afterwards."""
    made: list[object] = []
    try:
        for method in methods:
            made.append(backend.init(program, method))
        yield made
    finally:
        for handle in made:
            backend.destroy(handle)
