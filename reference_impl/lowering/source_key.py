"""The source key of a method: what decides its lowering, known *before* ``torch.export`` runs.

The artifact key (``preprocess.artifact_key``) is taken from the exported graph, so finding a warm artifact
costs an export: 1-4 s per method of a small Hugging Face model, most of a warm case's time. The source key
is taken from what export reads instead:

* the code: for every class in the module tree (and every class, function and module its methods name in
  their globals), its top-level package. An installed distribution counts by name and version; a package
  from a source tree (this repository, editable installs) by the SHA-256 of all its ``.py`` files;
* the state: every parameter and buffer (names, dtypes, shapes, strides, bytes; tied weights as aliases)
  and every other attribute of every submodule (config objects by their ``to_dict``);
* the example inputs (shapes, dtypes, strides, bytes), ``dynamic_shapes`` (each ``Dim``'s name and
  bounds), the method name and compile specs, and torch's global switches that change a trace (default
  dtype, grad mode, matmul precision) and inductor's environment variables.

Anything that cannot be fingerprinted soundly — a module hook, an attribute of an unknown type, a class
without a source file, a package without a version — makes the key ``None``, and preprocess exports as it
always did. A key is only ever a shortcut to the same result: the entry it names was written by a full
preprocess of an identical source (see ``preprocess``).
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import os
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference_impl.artifact_cache import value_digest

__all__ = ["Unfingerprintable", "package_identity", "source_fingerprint"]

_SITE_DIRS = ("site-packages", "dist-packages")
# Module state that is not the module's meaning: children and tensors are fingerprinted on their own.
_SKIPPED_ATTRIBUTES = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
# Variables that may change what inductor generates. Not: where caches live, or how many processes
# compile (the suite runs its pre-lowering and its case phases with different pool sizes), or where
# Triton's tools are: torch sets TRITON_PTXAS_PATH and TRITON_LIBDEVICE_PATH itself on a process's first
# Triton compile, so counting them keyed a method by the process's history (a warm run's case workers,
# which compile nothing, missed every memo a cold run's compiling workers stored). None of these changes
# the trace the memo stands for, and the artifact key, which decides the compile, reads no variable.
_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCH_COMPILE", "TORCHDYNAMO_", "INDUCTOR_", "TRITON_")
_ENV_IGNORED = frozenset({"TORCHINDUCTOR_COMPILE_THREADS"})


def _env_counts(name: str) -> bool:
    """Whether environment variable ``name`` enters the source key (see ``_ENV_PREFIXES``)."""
    if not name.startswith(_ENV_PREFIXES) or name in _ENV_IGNORED or name.endswith("CACHE_DIR"):
        return False
    return not (name.startswith("TRITON_") and name.endswith("_PATH"))


class Unfingerprintable(Exception):
    """Some part of the source has no sound fingerprint; the caller exports instead."""


@functools.cache
def _distribution_of() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


@functools.cache
def _installed_identity(top: str, location: Path) -> str | None:
    """``dist==version`` of the distributions that install top-level package ``top`` (found at
    ``location``), once per process as ``_tree_digest`` is; None where no distribution does. A regular
    package whose distribution has its name and records its ``__init__.py`` is that distribution's, read
    from its own record: mapping every installed distribution (``packages_distributions``) cost each
    process half a second on a first lowering. Anything else (a namespace package, another name) is mapped."""
    if location.name == "__init__.py":
        try:
            dist = importlib.metadata.distribution(top)
        except importlib.metadata.PackageNotFoundError:
            dist = None
        if dist is not None and _records(dist, f"{top}/__init__.py"):
            return f"{dist.metadata['Name']}=={dist.version}"
    dists = sorted(set(_distribution_of().get(top, ())))
    return ",".join(f"{d}=={importlib.metadata.version(d)}" for d in dists) or None


def _records(dist: importlib.metadata.Distribution, path: str) -> bool:
    """Whether ``dist``'s ``RECORD`` lists ``path``, read as text: ``dist.files`` makes a path of every
    file it lists and, since Python 3.12, looks each up on disk (thousands for transformers: about 1 s of
    each case worker of a warm run on an H200, ``examples/runs/2026-11-29-warm-tails-H200/``). A
    distribution without a ``RECORD`` (an egg's metadata) is read through ``dist.files``."""
    record = dist.read_text("RECORD")
    if record is None:
        return path in {str(f) for f in dist.files or ()}
    return any(row and row[0] == path for row in csv.reader(record.splitlines()))


@functools.cache
def _tree_digest(root: str) -> str:
    """SHA-256 over the relative paths and bytes of every ``.py`` file under ``root`` (a file or folder)."""
    path = Path(root)
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path.parent)).encode())
        digest.update(b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def package_identity(top: str) -> str | None:
    """How the code of top-level package ``top`` is identified: ``None`` for the standard library and torch
    (the toolchain fingerprint has the Python and torch versions), ``dist==version`` for an installed
    distribution, ``sha256:<digest>`` of the sources for a package from a source tree."""
    if top in sys.stdlib_module_names or top in {"builtins", "torch"}:
        return None
    module = sys.modules.get(top)
    file = getattr(module, "__file__", None)
    if not file:
        raise Unfingerprintable(f"package {top!r} has no source file")
    location = Path(file).resolve()
    if any(part in _SITE_DIRS for part in location.parts):
        identity = _installed_identity(top, location)
        if identity is None:
            raise Unfingerprintable(f"installed package {top!r} belongs to no distribution")
        return identity
    root = location.parent if location.name == "__init__.py" else location
    return f"sha256:{_tree_digest(str(root))}"


class _Walker:
    """Collects the packages whose code a module tree can reach by name, and stable values of its state."""

    def __init__(self) -> None:
        self.packages: set[str] = set()

    def code(self, obj: Any) -> str:
        """``module.qualname`` of a class or function, noting its package."""
        module = getattr(obj, "__module__", None)
        name = getattr(obj, "__qualname__", None)
        if not module or not name or module == "__main__":
            raise Unfingerprintable(f"{obj!r} has no importable name")
        self.packages.add(module.split(".")[0])
        return f"{module}.{name}"

    def classes(self, module: nn.Module) -> list[str]:
        names = []
        for cls in type(module).__mro__:
            if cls in (nn.Module, object):
                break
            names.append(self.code(cls))
            for member in vars(cls).values():
                function = getattr(member, "__func__", member)
                for value in getattr(function, "__globals__", {}).values():
                    self._named(value)
        return names

    def _named(self, value: Any) -> None:
        if isinstance(value, types.ModuleType):
            self.packages.add(value.__name__.split(".")[0])
        elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            module = getattr(value, "__module__", None)
            if module and module != "__main__":
                self.packages.add(module.split(".")[0])

    def value(self, value: Any) -> Any:
        """A JSON-ready stable form of an attribute value, or ``Unfingerprintable``."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, torch.Tensor):
            return {"tensor": value_digest(value), "requires_grad": value.requires_grad}
        if isinstance(value, (list, tuple)):
            return [type(value).__name__, [self.value(v) for v in value]]
        if isinstance(value, dict):
            return {str(k): self.value(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
        if isinstance(value, (set, frozenset)):
            return ["set", sorted(repr(self.value(v)) for v in value)]
        if isinstance(value, (torch.dtype, torch.device, torch.Size, torch.memory_format, enum.Enum)):
            return repr(value)
        if isinstance(value, torch.export.Dim):
            return {"dim": value.__name__, "min": value.min, "max": value.max}
        if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            return {"code": self.code(value)}
        if isinstance(value, functools.partial):
            return {
                "partial": self.value(value.func),
                "args": self.value(value.args),
                "kw": self.value(value.keywords),
            }
        if dataclasses.is_dataclass(value):
            fields = {f.name: self.value(getattr(value, f.name)) for f in dataclasses.fields(value)}
            return {"class": self.code(type(value)), "fields": fields}
        to_dict = getattr(value, "to_dict", None)
        if callable(to_dict):  # configuration objects (transformers' PretrainedConfig and kin)
            return {"class": self.code(type(value)), "dict": self.value(to_dict())}
        raise Unfingerprintable(f"attribute of type {type(value).__name__} has no stable fingerprint")


def _tensors(module: nn.Module) -> dict[str, Any]:
    """Every parameter and buffer by name; a tensor seen before under another name is an alias."""
    first_name: dict[int, str] = {}
    out: dict[str, Any] = {}
    for kind, named in (
        ("parameter", module.named_parameters(remove_duplicate=False)),
        ("buffer", module.named_buffers(remove_duplicate=False)),
    ):
        for name, tensor in named:
            seen = first_name.setdefault(id(tensor), name)
            if seen != name:
                out[name] = {"alias_of": seen}
                continue
            out[name] = {kind: value_digest(tensor), "requires_grad": tensor.requires_grad}
    return out


def _module_state(walker: _Walker, module: nn.Module) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        attributes: dict[str, Any] = {}
        for key, value in vars(sub).items():
            if key in _SKIPPED_ATTRIBUTES:
                continue
            if "hook" in key:
                if value:  # hooks run arbitrary code around forward
                    raise Unfingerprintable(f"module {name or '<root>'!r} has {key}")
                continue
            attributes[key] = walker.value(value)
        state[name] = {"classes": walker.classes(sub), "attributes": attributes}
    return state


def _global_switches() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if _env_counts(k)}
    return {
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "env": dict(sorted(env.items())),
    }


def source_fingerprint(
    module: nn.Module,
    example_inputs: Iterable[Any],
    *,
    dynamic_shapes: Any = None,
    extra_packages: Iterable[str] = (),
) -> dict[str, Any] | None:
    """Everything ``torch.export`` reads from this call's source (module doc), or None where any part
    cannot be fingerprinted. ``extra_packages``: top-level packages whose code also decides the result
    (the lowering's own, ``reference_impl``)."""
    walker = _Walker()
    try:
        state = _module_state(walker, module)
        tensors = _tensors(module)
        inputs = walker.value(tuple(example_inputs))
        shapes = walker.value(dynamic_shapes)
        packages = {top: package_identity(top) for top in sorted(walker.packages | set(extra_packages))}
    except Unfingerprintable:
        return None
    return {
        "modules": state,
        "tensors": tensors,
        "inputs": inputs,
        "dynamic_shapes": shapes,
        "packages": {top: ident for top, ident in packages.items() if ident is not None},
        "switches": _global_switches(),
    }
