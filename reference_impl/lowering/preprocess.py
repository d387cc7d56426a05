"""Preprocess one method: edge graph → view pass → partition → AOTInductor package → kernel check → blob.

Steps, in order (SPEC §1a "Preprocess"):

1. move the module and example inputs to the target device (a deep copy when the module lives elsewhere, so
   the caller's module is never moved under its feet);
2. ``to_edge_graph`` (export, core-ATen decomposition, views functionalized into ``*_copy`` ops), then
   ``run_view_copy_pass`` (keeping its report) unless disabled;
3. ``partition``: every delegable node and constant gets the delegation tag; a node that is not delegable
   stops lowering with its name and target;
4. AOTInductor compile and package under ``torch.no_grad()`` with the SDPA MATH kernel forced, through the
   content-addressed artifact cache (a warm run does not recompile);
5. the fallback-kernel inventory of the generated C++, checked against the provided-kernel set of *this call*
   (``UnsupportedKernelsError`` with the sorted missing kernels; nothing is remembered between calls);
6. ``pack_blob`` with ``extra = {"fallback_kernels", "runtime_shims", "view_pass", "io", "placement",
   "delegation"}``.

Before step 1, the **source memo** (``source_key.py``): a key taken from the module's code, state and
inputs, known without exporting. When a full preprocess of an identical source stored its results (artifact
key, view-pass report, I/O spec, delegation) and the artifact is still cached, steps 1-4 are skipped; a warm
lowering of a Hugging Face model drops from seconds of ``torch.export`` to a tenth of a second. Steps 5-6
run on every call. Steps 1-4 run under the memo's lock: processes asking for one source at once trace it
once, the others wait for the memo.

Provided-kernel policy (``provided_kernels``):

* ``None`` (default): the op kernels torch's own AOTI runtime exports for the device
  (``provided_by_torch_runtime``) — the reference runtime loads packages with libtorch, so it has them. The
  proxy executor, the dispatcher lookup and undeclared op shims still fail.
* an iterable of names: exactly those op kernels are provided (runtime shims such as
  ``aoti_torch_empty_strided`` are always fine). ``LIBTORCH_FREE_CUDA_KERNELS`` (``aoti_torch_cuda_mm_out``
  only) is how a backend without libtorch, like ExecuTorch's, must lower.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import os
import pickle
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from reference_impl._version import __version__
from reference_impl.artifact_cache import (
    ArtifactCache,
    default_cache,
    make_key,
    program_fingerprint,
    toolchain_fingerprint,
)
from reference_impl.format.blob import DEVICE_TYPES, pack_blob
from reference_impl.format.compile_spec import CompileSpec, find_method_name, validate_method_name
from reference_impl.format.errors import MethodNameMismatchError
from reference_impl.format.iospec import io_spec_from_exported_program
from reference_impl.format.placement import MethodPlacement
from reference_impl.lowering.edge import materialize_remaining_copies, quiet_pytree_deprecation, to_edge_graph
from reference_impl.lowering.fallback_kernels import (
    KernelInventory,
    UnsupportedKernelsError,
    check_provided,
    provided_by_torch_runtime,
    scan_package,
)
from reference_impl.lowering.partitioner import partition
from reference_impl.lowering.source_key import source_fingerprint
from reference_impl.lowering.view_copy_pass import ViewPassReport, run_view_copy_pass

__all__ = [
    "NotDelegableError",
    "PreprocessResult",
    "UnsupportedKernelsError",
    "artifact_key",
    "compile_artifact",
    "preprocess",
    "resolve_device",
    "view_report_dict",
]

CacheArg = ArtifactCache | Literal[False] | None


class NotDelegableError(ValueError):
    """The method's graph holds nodes the backend cannot take (named, with their targets)."""


@dataclass(frozen=True)
class PreprocessResult:
    """The processed blob of one method and what preprocess learned on the way."""

    blob: bytes = field(repr=False)
    method_name: str
    kernels: tuple[str, ...]
    view_pass_report: ViewPassReport | None
    compile_seconds: float
    cache_hit: bool
    runtime_shims: tuple[str, ...] = ()
    cache_key: str = ""
    device: str = "cpu"


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` of type cpu or cuda (cuda with an explicit index), else ValueError."""
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r} ({error})") from None
    if target.type not in DEVICE_TYPES:
        raise ValueError(f"device type must be one of {list(DEVICE_TYPES)}, got {str(target)!r}")
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(target)!r} requested but torch.cuda.is_available() is False")
        index = torch.cuda.current_device() if target.index is None else target.index
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device {str(target)!r}: there are {torch.cuda.device_count()} CUDA devices")
        target = torch.device("cuda", index)
    return target


def _to_device(module: nn.Module, inputs: tuple[Any, ...], target: torch.device) -> tuple[nn.Module, tuple]:
    tensors = [*module.parameters(), *module.buffers()]
    if any(t.device != target for t in tensors):
        module = copy.deepcopy(module).to(target)
    moved = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(target), tuple(inputs))
    return module, moved


def view_report_dict(report: ViewPassReport | None) -> dict[str, Any]:
    """The view-pass report as JSON-ready data (what the blob header carries)."""
    if report is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "summary": report.summary(),
        "rewrites": [dataclasses.asdict(r) for r in report.rewrites],
        "refusals": [
            {"node": r.node, "op": r.op, "reason": r.reason.value, "detail": r.detail}
            for r in report.refusals
        ],
        "refusal_counts": report.refusal_counts(),
    }


def compile_artifact(
    exported: torch.export.ExportedProgram,
    *,
    device: torch.device,
    inductor_configs: Mapping[str, Any] | None = None,
    cxx: str | None = None,
) -> bytes:
    """AOTInductor-compile ``exported`` into a ``.pt2`` package (SDPA MATH kernel, no grad); its bytes. A
    damaged package (:func:`package_problems`) is compiled again."""
    problems: list[str] = []
    for _attempt in range(PACKAGE_ATTEMPTS):
        data = _compile_package(exported, device, inductor_configs, cxx)
        problems = package_problems(data)
        if not problems:
            return data
    raise RuntimeError(
        f"AOTInductor produced a damaged package {PACKAGE_ATTEMPTS} times ({'; '.join(problems)}); "
        "another process rewriting the same kernel files in the shared inductor cache is the likely cause"
    )


#: Compiles of one program before a damaged package is an error (see :func:`package_problems`).
PACKAGE_ATTEMPTS = 3


def package_problems(data: bytes) -> list[str]:
    """What is damaged in a ``.pt2`` package: an archive that does not open, or a JSON entry that does not
    parse. AOTInductor packages the kernel files it generated into the inductor cache, where every
    process compiling a program with the same kernel writes files of the same names: a package made
    while another process rewrote them carries an empty ``*_metadata.json`` (seen on an H100 when the
    metamorphic variants compiled side by side), and torch's loader then fails on every load. Checked
    before the package is cached, so a damaged one is compiled again instead of served for ever."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = [e for e in archive.infolist() if e.filename.endswith(".json")]
        found = []
        for entry in entries:
            try:
                json.loads(archive.read(entry) or b"<empty>")
            except ValueError:
                found.append(f"{entry.filename} is not JSON ({entry.file_size} bytes)")
        return found
    except (zipfile.BadZipFile, OSError) as exc:
        return [f"not a zip archive: {exc}"]


def _compile_package(
    exported: torch.export.ExportedProgram,
    device: torch.device,
    inductor_configs: Mapping[str, Any] | None,
    cxx: str | None,
) -> bytes:
    from torch._inductor import aoti_compile_and_package
    from torch._inductor import config as inductor_config
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from reference_impl.lowering.vec_isa import probed_once

    patch: dict[str, Any] = {"cpp.cxx": (None, cxx)} if cxx else {}
    device_scope = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(prefix="aoti-preprocess-") as tmp:
        # A fixed file name: the archive's root folder is named after it, so the bytes do not depend on the
        # method name and one artifact serves every method with the same graph.
        path = os.path.join(tmp, "artifact.pt2")
        with (
            torch.no_grad(),
            sdpa_kernel(SDPBackend.MATH),
            inductor_config.patch(patch),
            probed_once(),
            device_scope,
            quiet_pytree_deprecation(),
        ):
            produced = aoti_compile_and_package(
                exported, package_path=path, inductor_configs=dict(inductor_configs or {})
            )
        return Path(produced).read_bytes()


def _device_identity(target: torch.device) -> dict[str, Any]:
    device: dict[str, Any] = {"type": target.type}
    if target.type == "cuda":
        # Generated kernels are specialised to the architecture they were compiled on.
        device["capability"] = list(torch.cuda.get_device_capability(target))
        device["name"] = torch.cuda.get_device_name(target)
    return device


def artifact_key(
    exported: torch.export.ExportedProgram,
    *,
    target: torch.device,
    view_pass: bool = True,
    inductor_configs: Mapping[str, Any] | None = None,
    cxx: str | None = None,
) -> str:
    """The artifact-cache key of compiling ``exported`` (the graph *after* the passes) for ``target``."""
    return make_key(
        {
            "kind": "aoti-package",
            "producer": f"reference_impl {__version__}",
            "program": program_fingerprint(exported),
            "device": _device_identity(target),
            "options": {
                "view_pass": bool(view_pass),
                "inductor_configs": dict(sorted((inductor_configs or {}).items())),
                "sdpa_backend": "MATH",
                "grad_enabled": False,
                # Packages are checked before they are cached (package_problems): entries cached before
                # the check may be damaged, and are never served.
                "package_checked": True,
            },
            "toolchain": toolchain_fingerprint(cxx),
        }
    )


def _resolve_method_name(method_name: str | None, compile_specs: Sequence[CompileSpec]) -> str:
    spec_name = find_method_name(compile_specs)
    if method_name is None:
        return spec_name if spec_name is not None else "forward"
    validate_method_name(method_name)
    if spec_name is not None and spec_name != method_name:
        raise MethodNameMismatchError(
            f"method_name {method_name!r} disagrees with the 'method_name' compile spec {spec_name!r}; "
            "when both are given they must agree"
        )
    return method_name


@dataclass(frozen=True)
class _SourceMemo:
    """What a full preprocess learned of one source before the kernel check: stored under its source key."""

    artifact_key: str
    report: ViewPassReport | None
    io: dict[str, Any]
    delegation: dict[str, Any]
    # The artifact's kernel inventory: scanning the generated C++ costs tens of milliseconds a call, which a
    # warm lower would otherwise pay every time (None: a memo stored before this field; scanned again).
    inventory: KernelInventory | None = None


@dataclass(frozen=True)
class _Source:
    """What one preprocess call traces and compiles: the source memo's key and a full trace both read it."""

    module: nn.Module
    example_inputs: Sequence[Any]
    name: str
    compile_specs: Sequence[CompileSpec]
    target: torch.device
    view_pass: bool
    dynamic_shapes: Any
    inductor_configs: Mapping[str, Any] | None
    cxx: str | None


def _source_key(source: _Source) -> str | None:
    """The cache key of this call's source memo (``source_key.py``), or None where the source has none."""
    fingerprint = source_fingerprint(
        source.module,
        source.example_inputs,
        dynamic_shapes=source.dynamic_shapes,
        extra_packages=("reference_impl",),
    )
    if fingerprint is None:
        return None
    return make_key(
        {
            "kind": "source-memo",
            "source": fingerprint,
            "method_name": source.name,
            "compile_specs": [repr(spec) for spec in source.compile_specs],
            "device": _device_identity(source.target),
            "options": {
                "view_pass": bool(source.view_pass),
                "inductor_configs": dict(sorted((source.inductor_configs or {}).items())),
            },
            "toolchain": toolchain_fingerprint(source.cxx),
        }
    )


class _MemoNotStorable(Exception):
    """A memo that cannot be pickled: raised out of the memo's build so that nothing is stored."""


def _memo_bytes(memo: _SourceMemo) -> bytes:
    try:
        return pickle.dumps(memo)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise _MemoNotStorable(str(exc)) from exc


def _memo_description(name: str) -> dict[str, str]:
    return {"kind": "source-memo", "method_name": name}


def _store_memo(store: ArtifactCache, source_key: str, memo: _SourceMemo, name: str) -> None:
    """Store ``memo`` under ``source_key``; a memo that cannot be pickled is not stored (a shortcut lost,
    nothing else: the lowering itself succeeded)."""
    with contextlib.suppress(_MemoNotStorable):
        store.put(source_key, _memo_bytes(memo), describe=_memo_description(name))


def _traced_from_source_key(store: ArtifactCache, source_key: str) -> tuple[_SourceMemo, bytes] | None:
    """A stored source memo and the artifact it names, or None (no memo, or its artifact is gone)."""
    data = store.load(source_key)
    if data is None:
        return None
    try:
        memo = pickle.loads(data)
    except Exception:  # an entry of an older layout: trace again, and the new memo replaces it
        return None
    if not isinstance(memo, _SourceMemo):
        return None
    artifact = store.load(memo.artifact_key)
    if artifact is None:
        return None
    return memo, artifact


def _trace_and_compile(
    source: _Source, store: ArtifactCache | Literal[False]
) -> tuple[_SourceMemo, bytes, bool, float]:
    """Export, view pass, partition and compile (through the artifact cache): steps 1-4 of the module doc."""
    name, target, view_pass = source.name, source.target, source.view_pass
    inductor_configs, cxx = source.inductor_configs, source.cxx
    module, inputs = _to_device(source.module, tuple(source.example_inputs), target)
    edge = to_edge_graph(module, inputs, dynamic_shapes=source.dynamic_shapes)
    report: ViewPassReport | None = None
    if view_pass:
        edge, report = run_view_copy_pass(edge)
    # Copies the pass kept (or all, without it) become view + clone, which inductor compiles itself.
    materialize_remaining_copies(edge.graph_module)

    parts = partition(edge, method_name=name, compile_specs=source.compile_specs)
    if parts.untagged_nodes:
        nodes = {n.name: n for n in edge.graph_module.graph.nodes}
        listed = ", ".join(f"{n} ({nodes[n].target})" for n in parts.untagged_nodes)
        raise NotDelegableError(f"method {name!r}: these nodes cannot be delegated to AOTInductor: {listed}")

    key = artifact_key(edge, target=target, view_pass=view_pass, inductor_configs=inductor_configs, cxx=cxx)

    def build() -> bytes:
        return compile_artifact(edge, device=target, inductor_configs=inductor_configs, cxx=cxx)

    if store is False:
        start = time.perf_counter()
        artifact, hit = build(), False
        seconds = time.perf_counter() - start
    else:
        result = store.get_or_build(
            key,
            build,
            describe={
                "method_name": name,
                "device": str(target),
                "torch": torch.__version__,
                "view_pass": view_pass,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
        artifact, hit, seconds = result.data, result.hit, result.build_seconds
    io = io_spec_from_exported_program(edge).to_json()
    delegation = {
        "tags": sorted(parts.partition_tags),
        "nodes": len(parts.tagged_nodes),
        "constants": list(parts.tagged_constants),
    }
    return _SourceMemo(key, report, io, delegation, scan_package(artifact)), artifact, hit, seconds


def preprocess(
    module: nn.Module,
    example_inputs: Sequence[Any],
    *,
    method_name: str | None = None,
    device: str | torch.device = "cpu",
    compile_specs: Sequence[CompileSpec] = (),
    provided_kernels: Iterable[str] | None = None,
    view_pass: bool = True,
    dynamic_shapes: Any = None,
    inductor_configs: Mapping[str, Any] | None = None,
    cxx: str | None = None,
    cache: CacheArg = None,
    placement: MethodPlacement | None = None,
    native_mm_out: bool | None = None,
) -> PreprocessResult:
    """Lower one method to a processed blob (see the module doc for the steps and the kernel policy).

    ``method_name`` defaults to the ``method_name`` compile spec, else ``"forward"``. ``cxx`` overrides the
    C++ compiler for this compile (default: inductor's, i.e. ``$CXX`` at import, else ``g++``). ``cache``:
    None for the default cache, False for none, or an ``ArtifactCache``. ``placement``: the method's
    export-time device placement (``placement.py``), recorded in the blob for the runtime; it does not
    change the compiled artifact, so the cache serves every placement from one compile. ``native_mm_out``:
    route the program's ``aoti_torch_cuda_mm_out`` calls to the native shim (``shims/native/routing.py``;
    None: when it is available on a CUDA target) — applied after the cache, so both routes share a compile.
    """
    _check_arguments(module, example_inputs, provided_kernels)
    name = _resolve_method_name(method_name, compile_specs)
    target = resolve_device(device)
    provided = frozenset(
        provided_by_torch_runtime(target.type) if provided_kernels is None else provided_kernels
    )

    source = _Source(
        module,
        example_inputs,
        name,
        compile_specs,
        target,
        view_pass,
        dynamic_shapes,
        inductor_configs,
        cxx,
    )
    memo, artifact, hit, seconds = _memo_and_artifact(source, default_cache() if cache is None else cache)

    inventory: KernelInventory = memo.inventory if memo.inventory is not None else scan_package(artifact)
    check_provided(inventory, provided, method_name=name, device=target.type)
    from reference_impl.shims.native.routing import apply_route

    artifact, mm_out_route = apply_route(artifact, target.type, native_mm_out)
    blob = _pack(artifact, name, target, inventory, memo, placement, mm_out_route)
    return PreprocessResult(
        blob=blob,
        method_name=name,
        kernels=inventory.kernels,
        view_pass_report=memo.report,
        compile_seconds=seconds,
        cache_hit=hit,
        runtime_shims=inventory.runtime_shims,
        cache_key=memo.artifact_key,
        device=target.type,
    )


def _check_arguments(module: object, example_inputs: object, provided_kernels: object) -> None:
    """The argument errors ``preprocess`` reports before doing anything (``ValueError`` naming each)."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(example_inputs, (tuple, list)):
        raise ValueError(f"example inputs must be a tuple, got {type(example_inputs).__name__}")
    if isinstance(provided_kernels, (str, bytes)):
        raise ValueError("provided_kernels must be an iterable of kernel names, not a single string")


def _memo_and_artifact(
    source: _Source, store: ArtifactCache | Literal[False]
) -> tuple[_SourceMemo, bytes, bool, float]:
    """(memo, artifact, cache hit, compile seconds): from the source memo where one is stored and its
    artifact is still cached (steps 1-4 skipped), else traced and compiled, and the memo stored.

    One process traces a source at a time: the memo is built under its key's lock, so the other processes
    that ask for the same source meanwhile wait for its memo. Without it, every case worker of a cold run
    that reached a program still compiling exported the model again (seconds of CPU each) only to learn
    which artifact to wait for."""
    source_key = _source_key(source) if store is not False else None
    if not source_key:
        return _trace_and_compile(source, store)
    traced = _traced_from_source_key(store, source_key)  # lock-free: a stored memo is immutable
    if traced is not None:
        return (*traced, True, 0.0)
    assert store is not False  # a source key is taken only with a store
    built: list[tuple[_SourceMemo, bytes, bool, float]] = []

    def trace() -> bytes:
        built.append(_trace_and_compile(source, store))
        return _memo_bytes(built[0][0])

    with contextlib.suppress(_MemoNotStorable):
        store.get_or_build(source_key, trace, describe=_memo_description(source.name))
    if built:
        return built[0]
    traced = _traced_from_source_key(store, source_key)  # another process traced it while we waited
    if traced is not None:
        return (*traced, True, 0.0)
    # A memo whose artifact is gone (the cache was pruned): trace again, and a new memo replaces it.
    memo, artifact, hit, seconds = _trace_and_compile(source, store)
    _store_memo(store, source_key, memo, source.name)
    return memo, artifact, hit, seconds


def _pack(
    artifact: bytes,
    name: str,
    target: torch.device,
    inventory: KernelInventory,
    memo: _SourceMemo,
    placement: MethodPlacement | None,
    mm_out_route: Any,
) -> bytes:
    """Step 6: the processed blob, with what the runtime and the report read in ``extra``."""
    return pack_blob(
        artifact,
        method_name=name,
        device=target.type,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        extra={
            "fallback_kernels": list(inventory.kernels),
            "runtime_shims": list(inventory.runtime_shims),
            "dynamic_ops": list(inventory.dynamic_ops),
            "view_pass": view_report_dict(memo.report),
            # Input/output dtypes and shapes: the package records none, and the runtime checks inputs.
            "io": memo.io,
            "placement": (placement or MethodPlacement()).to_json(),
            "mm_out_route": mm_out_route,
            "delegation": memo.delegation,
        },
    )
