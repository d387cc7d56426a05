"""Fallback-kernel inventory: which ATen kernels an AOTInductor package calls outside its own generated code.

AOTInductor generates kernels for what it can (C++ loops on CPU, Triton on CUDA) and calls everything else
through the C-shim ABI: ``aoti_torch_cuda_mm_out(...)``, ``aoti_torch_cpu_addmm_out(...)``, ... A backend that
does not link libtorch (ExecuTorch's CUDA backend) must provide each of those symbols itself, so preprocess
lists them and refuses a method that calls one the backend does not provide.

The inventory is read from the generated C++ in the package (``*.wrapper.cpp`` and friends inside the
``.pt2`` zip), not from inductor internals: the source is what the compiled ``.so`` will call, and reading it
works the same across torch versions and for cached artifacts compiled in another process.

Classification (see ``NOTES.md`` for the policy discussion):

* **op kernels** — the backend's responsibility. Names declared in torch's generated C-shim headers
  (``aoti_torch/generated/c_shim_{cpu,cuda,aten,...}.h``), the handful of ATen-op shims in ``c/shim.h``
  (``aoti_torch_mm_out``, ``aoti_torch_convolution``, ...), the device-specific op shims of ``c/shim_cpu.h``
  / ``c/shim_xpu.h`` (mkldnn, quantized), and the two generic escape hatches
  (``aoti_torch_proxy_executor_call_function``, ``aoti_torch_call_dispatcher``). A name matching
  ``aoti_torch_<device>_...`` that no header declares is treated as an op kernel too (fail closed).
* **runtime shims** — the AOTI runtime ABI every AOTI backend implements to run any model at all (tensor
  creation and metadata, dtype/device constants, guards, streams, grad mode, ...). Always acceptable;
  recorded for information.

Nothing here keeps mutable module-level state: every call builds fresh sets (upstream kept one module-level
set of missing kernels, so one failing method poisoned every later lowering in the process).
"""

from __future__ import annotations

import functools
import io
import json
import re
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from reference_impl.format.cpp_source import strip_cpp_comments, without_string_literals

__all__ = [
    "DISPATCHER",
    "LIBTORCH_FREE_CUDA_KERNELS",
    "PROXY_EXECUTOR",
    "FallbackInventoryError",
    "KernelInventory",
    "UnsupportedKernelsError",
    "calls_in_cpp",
    "check_provided",
    "classify",
    "inventory_from_sources",
    "provided_by_torch_runtime",
    "scan_package",
]

PROXY_EXECUTOR = "aoti_torch_proxy_executor_call_function"
"""Generic fallback for ops without a C shim: needs a proxy executor that calls the ATen dispatcher."""

DISPATCHER = "aoti_torch_call_dispatcher"
"""Generic runtime-lookup fallback: calls an op by name through the ATen dispatcher."""

LIBTORCH_FREE_CUDA_KERNELS: frozenset[str] = frozenset({"aoti_torch_cuda_mm_out"})
"""The op kernels the reference implements itself for a libtorch-free CUDA runtime (the cuBLAS ``mm_out`` shim
of SPEC §1c). Pass as ``provided_kernels`` to lower the way a backend without libtorch must."""

# ATen-op shims declared in c/shim.h (not in the generated headers): they run ATen kernels, so a backend
# without libtorch has to implement them like any generated op shim.
_SHIM_H_OP_KERNELS: frozenset[str] = frozenset(
    {
        "aoti_torch__embedding_bag",
        "aoti_torch__fft_c2c",
        "aoti_torch__mm_plus_mm_out",
        "aoti_torch__scaled_dot_product_efficient_attention",
        "aoti_torch__scaled_dot_product_flash_attention",
        "aoti_torch__scaled_dot_product_flash_attention_v2",
        "aoti_torch__scaled_mm",
        "aoti_torch__scaled_mm_v2",
        "aoti_torch_addmm_out",
        "aoti_torch_bmm_out",
        "aoti_torch_convolution",
        "aoti_torch_index_put_out",
        "aoti_torch_mm_out",
        "aoti_torch_nonzero",
        "aoti_torch_repeat_interleave_Tensor",
        "aoti_torch_scatter_out",
        "aoti_torch_scatter_reduce_out",
        "aoti_torch_zero_",
        PROXY_EXECUTOR,
        DISPATCHER,
    }
)
# Device-prefixed names in c/shim*.h that are runtime plumbing, not ops.
_DEVICE_PREFIXED_RUNTIME = re.compile(
    r"aoti_torch_(cuda_guard_set_index|cuda_caching_allocator_raw_\w+|xpu_guard_set_index|mps_\w+)$"
)
_DEVICE_PREFIX = re.compile(r"aoti_torch_(cpu|cuda|xpu|mps|aten)_\w+$")
_OP_DEVICE_PREFIX = re.compile(r"aoti_torch_(cpu|xpu)_\w+$")  # c/shim_cpu.h, c/shim_xpu.h: mkldnn/quant ops
_CALL = re.compile(r"\b(aoti_torch_[A-Za-z0-9_]+)\s*\(")
_DECL = re.compile(r"\bAOTI_TORCH_EXPORT\b[^;(]*?\b(aoti_torch_[A-Za-z0-9_]+)\s*\(")
_DISPATCHER_CALL = re.compile(r'\baoti_torch_call_dispatcher\s*\(\s*"([^"]*)"\s*,\s*"([^"]*)"')
_SOURCE_SUFFIXES = (".cpp", ".cc", ".cu", ".h", ".hpp")
_NON_EXTERN_JSON = ("_metadata.json", "_compile_flags.json", "_linker_flags.json", "weights_config.json")


class UnsupportedKernelsError(ValueError):
    """A method calls fallback kernels the backend does not provide; ``kernels`` is the sorted list."""

    def __init__(self, kernels: Iterable[str], *, method_name: str | None = None, device: str | None = None):
        self.kernels: tuple[str, ...] = tuple(sorted(set(kernels)))
        self.method_name = method_name
        self.device = device
        where = f"method {method_name!r}" if method_name is not None else "the program"
        target = f" for device {device!r}" if device else ""
        super().__init__(
            f"{where}{target} calls {len(self.kernels)} fallback kernel(s) the backend does not provide: "
            f"{', '.join(self.kernels)}; implement them in the backend's shim layer, pass them in "
            "provided_kernels, or change the model so inductor generates the computation itself"
        )


class FallbackInventoryError(ValueError):
    """The package holds no generated C++ to read the inventory from (cannot prove what it calls)."""


@dataclass(frozen=True)
class KernelInventory:
    """What one package's generated code calls, sorted: op kernels, runtime shims, and detail."""

    kernels: tuple[str, ...]
    runtime_shims: tuple[str, ...]
    sources: tuple[str, ...] = ()
    # Ops reached through the generic fallbacks (proxy executor / dispatcher), as "namespace::op[.overload]".
    dynamic_ops: tuple[str, ...] = ()
    extra: Mapping[str, object] = field(default_factory=dict)

    def missing(self, provided: Iterable[str]) -> tuple[str, ...]:
        """Sorted op kernels not in ``provided``."""
        have = frozenset(provided)
        return tuple(k for k in self.kernels if k not in have)


def calls_in_cpp(text: str) -> set[str]:
    """Every ``aoti_torch_*`` function called (or declared with a call-like syntax) in C++ ``text``."""
    code = without_string_literals(strip_cpp_comments(text))
    return set(_CALL.findall(code))


def _dispatcher_ops(text: str) -> set[str]:
    code = strip_cpp_comments(text)
    return {f"{op}.{overload}" if overload else op for op, overload in _DISPATCHER_CALL.findall(code)}


# --- what torch's headers declare -----------------------------------------------------------------------


def _torch_include_dir() -> Path | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return None
    path = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "inductor" / "aoti_torch"
    return path if path.is_dir() else None


def _declared(paths: Iterable[Path]) -> frozenset[str]:
    names: set[str] = set()
    for path in paths:
        try:
            names.update(_DECL.findall(path.read_text(errors="replace")))
        except OSError:
            continue
    return frozenset(names)


@functools.cache
def _header_sets() -> tuple[frozenset[str], frozenset[str]]:
    """(op shims from generated/c_shim_*.h, everything declared in c/*.h) of the installed torch.

    Cached: the installed headers do not change while a process runs, and the result is immutable.
    """
    root = _torch_include_dir()
    if root is None:
        return frozenset(), frozenset()
    generated = _declared(sorted((root / "generated").glob("c_shim_*.h")))
    runtime_api = _declared(sorted((root / "c").glob("*.h")))
    return generated, runtime_api


def classify(names: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split ``aoti_torch_*`` names into (sorted op kernels, sorted runtime shims)."""
    generated, runtime_api = _header_sets()
    kernels: set[str] = set()
    runtime: set[str] = set()
    for name in set(names):
        if name in generated or name in _SHIM_H_OP_KERNELS:
            kernels.add(name)
        elif name in runtime_api:
            is_op = _OP_DEVICE_PREFIX.match(name) and not _DEVICE_PREFIXED_RUNTIME.match(name)
            (kernels if is_op else runtime).add(name)
        elif _DEVICE_PREFIX.match(name) and not _DEVICE_PREFIXED_RUNTIME.match(name):
            kernels.add(name)  # unknown to this torch but shaped like an op shim: fail closed
        else:
            runtime.add(name)
    return tuple(sorted(kernels)), tuple(sorted(runtime))


@functools.cache
def provided_by_torch_runtime(device: str) -> frozenset[str]:
    """The default provided set: op kernels torch's own AOTI runtime exports for ``device``.

    That is every generated C shim for the device type (``aoti_torch_<device>_*``) and the device-generic
    ones (``aoti_torch_aten_*``), plus the ATen-op shims of ``c/shim.h`` and, for the CPU, ``c/shim_cpu.h``.
    The proxy executor, the dispatcher lookup and names this torch does not declare are *not* included:
    they are the backend's own responsibility and must be listed explicitly.
    """
    device_type = str(device).split(":", 1)[0]
    generated, runtime_api = _header_sets()
    prefixes = (f"aoti_torch_{device_type}_", "aoti_torch_aten_")
    provided = {name for name in generated if name.startswith(prefixes)}
    provided |= {name for name in runtime_api if name.startswith(f"aoti_torch_{device_type}_")}
    provided |= _SHIM_H_OP_KERNELS - {PROXY_EXECUTOR, DISPATCHER}
    kernels, _ = classify(provided)
    return frozenset(kernels)


# --- reading packages -----------------------------------------------------------------------------------


def _extern_json_ops(text: str) -> set[str]:
    """Op targets of a proxy-executor extern-kernel JSON (``{"nodes": [{"node": {"target": ...}}]}``)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return set()
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    ops: set[str] = set()
    for entry in nodes if isinstance(nodes, list) else ():
        node = entry.get("node") if isinstance(entry, dict) else None
        target = node.get("target") if isinstance(node, dict) else None
        if isinstance(target, str):
            ops.add(target)
    return ops


def inventory_from_sources(
    sources: Mapping[str, str], extern_json: Mapping[str, str] | None = None
) -> KernelInventory:
    """The inventory of generated C++ ``sources`` (name → text); fresh sets on every call."""
    called: set[str] = set()
    dynamic: set[str] = set()
    for text in sources.values():
        called |= calls_in_cpp(text)
        dynamic |= _dispatcher_ops(text)
    if PROXY_EXECUTOR in called:
        for text in (extern_json or {}).values():
            dynamic |= _extern_json_ops(text)
    kernels, runtime = classify(called)
    return KernelInventory(
        kernels=kernels,
        runtime_shims=runtime,
        sources=tuple(sorted(sources)),
        dynamic_ops=tuple(sorted(dynamic)),
    )


def scan_package(package: bytes | str | Path) -> KernelInventory:
    """The inventory of an AOTInductor ``.pt2`` package (its bytes or a path)."""
    raw = Path(package).read_bytes() if isinstance(package, (str, Path)) else bytes(package)
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile as error:
        raise FallbackInventoryError(
            f"artifact is not an AOTInductor .pt2 package (not a zip: {error})"
        ) from None
    sources: dict[str, str] = {}
    extern_json: dict[str, str] = {}
    with archive:
        for name in archive.namelist():
            if "/aotinductor/" not in f"/{name}":
                continue
            if name.endswith(_SOURCE_SUFFIXES):
                sources[name] = archive.read(name).decode("utf-8", errors="replace")
            elif name.endswith(".json") and not name.endswith(_NON_EXTERN_JSON):
                extern_json[name] = archive.read(name).decode("utf-8", errors="replace")
    if not any(name.endswith((".cpp", ".cc", ".cu")) for name in sources):
        raise FallbackInventoryError(
            "the package holds no generated C++ source under data/aotinductor/, so the kernels it calls "
            "cannot be listed; refusing rather than guessing"
        )
    return inventory_from_sources(sources, extern_json)


def check_provided(
    inventory: KernelInventory,
    provided: Iterable[str],
    *,
    method_name: str | None = None,
    device: str | None = None,
) -> None:
    """Raise ``UnsupportedKernelsError`` (sorted) if ``inventory`` calls kernels not in ``provided``."""
    missing = inventory.missing(provided)
    if missing:
        raise UnsupportedKernelsError(missing, method_name=method_name, device=device)
