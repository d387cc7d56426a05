"""The backend plug-in protocol: the only way the suite talks to a backend.

A *backend* is any Python object (a module, an instance, a class) reachable as ``module:attr``. The suite
selects it with ``--backend module:attr`` or the environment variable ``CONFORMANCE_BACKEND``; the default
is ``reference_impl:BACKEND``. A backend implements any subset of the parts below; a chapter whose part is
missing is skipped with that reason, never failed. Nothing here needs importing: the protocols are
structural (``typing.Protocol``), so a backend never depends on the suite.

Identity (every backend)
    ``name: str`` and ``version: str`` — shown in the run header and stored in the result file.

Known failures (optional, every backend)
    ``known_failures``: a sequence of mappings ``{"case": glob over the case id, "rule": glob over the
    rule id (optional), "reason": str, "link": str (optional), "crash": bool (optional: the case kills its
    process)}`` (or a callable returning one), added to those of ``--known-failures FILE``. A matching case
    that fails as declared (or, under pytest-xdist, dies as declared) is ``xfailed`` with the reason and
    link; one that passes fails with rule ``known-failures/stale``. Format and matching:
    ``conformance/suite/known_failures.py``.

Errors (every part)
    A contract violation raises an *invalid-argument* error: an instance of ``ValueError`` (a subclass is
    welcome) whose message names the offending argument (``out``, ``self`` or ``mat2`` for ``mm_out``) and
    the rule it broke. A failure of the underlying library (cuBLAS, CUDA) raises ``RuntimeError``. On any
    error, outputs are left untouched. Calling with a missing positional argument is Python's own
    ``TypeError``; passing ``None`` is an invalid-argument error.

Every call (the suite's contract monitor checks these on every call of every chapter)
    A call never writes an argument it only reads: its tensors, a program's bytes, the modules and example
    inputs given to ``lower``. A call that raises leaves the tensors it may write (``outputs=`` of
    ``execute``, ``out`` of ``mm_out``) untouched. A tensor a call returns belongs to the caller: it shares
    no element with an argument the call only read, nor with a tensor an earlier call returned that the
    caller still holds. A call returns what its signature says: ``lower`` non-empty ``bytes``, ``init`` a
    handle (not ``None``), ``execute`` a ``list`` of tensors, ``execute_stats`` a mapping whose
    ``h2d_bytes`` and ``d2h_bytes`` are non-negative ``int`` values, ``get_option`` a ``str``, and
    ``destroy``, ``set_option`` and ``mm_out`` ``None``. An exception a call raises is a ``ValueError``, a
    ``TypeError`` or a ``RuntimeError`` (subclasses welcome), never of another class.

Part ``mm_out`` (chapter ``mm_out``; SPEC §1c)
    ``mm_out(out, self, mat2) -> None`` computes ``out = self @ mat2`` for rank-2 CUDA tensors of one
    dtype (bfloat16, float16 or float32) on one device, on the caller's current CUDA stream, and returns
    once the work is enqueued on that stream (it must not make the caller synchronise to be correct).
    ``self`` and ``mat2`` may be row-major, column-major (a transposed view) or arbitrarily strided;
    ``out`` must be ``[M, N]`` and row-major contiguous, and its old contents are never read. Zero-size
    M, N or K follow ``torch.mm``: an empty product fills ``out`` with zeros. float32 is computed in
    float32 without TF32. The first argument of the Python method is the backend itself, so the
    protocol calls the second operand ``self_``; error messages still call it ``self``.

    Optional, for backends whose compiled programs call their own ``mm_out`` kernel (chapter ``mm_out``,
    case ``test_compiled_program_calls_backend_mm_out``; without them that case is a coverage gap or a skip,
    never a failure): ``mm_out_calls() -> int | None`` — how many calls the backend's own ``mm_out`` kernel
    has served in this process so far (every entry: compiled programs and ``mm_out`` itself; None when that
    kernel is not loaded); ``mm_out_calls_per_execute(handle) -> int | None`` — how many of those calls one
    ``execute`` of an ``init``-ed handle makes, as compiled (None when the handle's program calls another
    implementation, e.g. libtorch's ``aoti_torch_cuda_mm_out``); ``mm_out_path() -> str`` — one line naming
    the implementation behind ``mm_out`` (shown in the run header). The reference backend also takes the
    ``lower`` option ``"native_mm_out": bool`` (route compiled programs' ``mm`` calls to its native shim, or
    keep libtorch's), which the bench uses for its model-level A/B.

Part ``view_pass`` (chapter ``lowering``; SPEC §1a)
    ``view_copy_pass(graph_module) -> ViewPassOutcome`` runs the backend's ReplaceViewCopyWithViewPass on a
    torch.fx ``GraphModule`` (ATen ops, edge-like: views already functionalized into ``*_copy`` ops) and
    returns an object with ``graph_module`` (the result, runnable), ``rewritten`` (names of nodes turned
    into views) and ``refused`` (node name → reason) — copies of ops the backend does not map at all go in
    neither list (the suite reports them as coverage, not as refusals; an optional ``unmapped`` mapping of
    node name → op may say so explicitly). The suite judges the numerics and aliasing of the result; a
    verdict is only wrong where it changes what a caller sees.

Part ``preflight`` (optional; SPEC §3)
    ``preflight(device) -> (ok, message)``: prove the toolchain can build and load an artifact for
    ``device`` without risking the caller (e.g. in a subprocess). The suite calls it once before any case
    runs and stops with ``message`` when ``ok`` is false, instead of crashing mid-run.

Part ``lowering`` (chapter ``lowering``; SPEC §1a)
    ``lower(methods, *, device) -> bytes``: ``methods`` maps a method name to ``(nn.Module, example
    inputs)`` or ``(nn.Module, example inputs, dynamic_shapes)`` (``dynamic_shapes`` as ``torch.export``
    takes it); the backend exports, transforms and compiles every method for ``device`` ("cpu" or "cuda")
    and returns one program file (its format is the backend's own business). Optional keyword ``options``
    (a mapping) carries the lowering options the backend lists in ``lower_options`` (below). A backend that
    cannot lower something raises ``ValueError`` (unsupported kernels, bad names) naming what and why.
    Optional attributes: ``lowering_devices`` (default ``("cpu", "cuda")``), the target devices it lowers
    for — cases for another target are skipped with that reason; ``lower_options`` (default empty), the
    option keys ``lower`` accepts:

    * ``"view_pass": bool`` — ``False`` lowers without the view-copy pass (the bench compares both).
    * ``"skip_h2d_for_method_inputs"`` / ``"skip_d2h_for_method_outputs"`` — **export-time device
      placement** (upstream ExecuTorch's ``PropagateDeviceConfig``, which replaced the runtime option in
      June 2026): each a ``bool`` (every method) or a mapping ``{method name: bool}`` (methods not named:
      ``False``). A method with ``skip_h2d`` takes its inputs on the device (the caller holds device
      tensors; nothing is copied host→device, a host tensor is an invalid-argument error); a method with
      ``skip_d2h`` returns its outputs as ordinary CUDA tensors (nothing copied device→host). An unknown
      method name or a non-bool value is a ``ValueError`` naming the key and the rule, raised before
      anything is compiled. On a CPU target the device is the host, so both are accepted and change
      nothing. A backend that lists both keys implements part ``device_placement``.

    Optional attribute ``caches_methods`` (default ``False``), for speed only (no chapter checks it): true
    where the backend keeps each compiled method in a cache that other processes share, so that ``lower``
    of a program finds there every method that an earlier ``lower`` of that method alone (same module,
    inputs, device and options) compiled. The pre-lowering then compiles a program's methods in processes
    of their own: a cold run's longest compile is one method, not a whole program.

Part ``runtime`` (chapters ``runtime_options``, ``device_placement``, ``multi_method``, ``streams_threads``,
``bad_inputs``; SPEC §1b)
    ``init(program: bytes, method: str) -> handle``; ``execute(handle, inputs, outputs=None) -> list of
    tensors``; ``destroy(handle)``; ``execute_stats(handle) -> {"h2d_bytes": int, "d2h_bytes": int}`` for
    the handle's last execute. Outputs are CPU tensors unless the method keeps them on the device (export-
    time ``skip_d2h_for_method_outputs``, or the runtime option below); then they are ordinary CUDA
    tensors, safe to read on any stream once execute returns. Host copies go through pinned memory. A
    corrupt program, an unknown method, a destroyed handle or wrong inputs raise ``ValueError`` naming the
    argument and the rule.

Part ``runtime_options`` (chapter ``runtime_options``; SPEC §1b — the seed's mechanism, deprecated upstream)
    ``set_option(key, value)`` / ``get_option(key)``: backend-wide, before and after init, effective on the
    next execute. Option ``skip_copy_output_to_cpu_for_method`` names (comma-separated) the methods whose
    outputs stay on the device. Precedence: a method whose output placement was fixed at export time keeps
    that placement; naming a method that was lowered with ``skip_d2h_for_method_outputs`` explicitly
    ``False`` is a conflict that ``lower`` and ``init`` reject with a ``ValueError`` naming both keys.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload, runtime_checkable

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch
    from torch import nn
    from torch.fx import GraphModule
    from typing_extensions import TypeIs


@runtime_checkable
class Backend(Protocol):
    """Identity every backend carries."""

    name: str
    version: str


@runtime_checkable
class MmOutBackend(Backend, Protocol):
    """A backend that provides the cuBLAS ``mm_out`` shim (``aoti_torch_cuda_mm_out``)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None: ...


# The parts' typed protocols: what the sections above specify, as signatures. Arguments are positional-only
# (the suite passes them by position, so a backend may name them as it likes), except where a section
# names keywords. Optional attributes are read with ``getattr`` and a default, so they are not members.


@runtime_checkable
class ViewPassOutcome(Protocol):
    """What ``view_copy_pass`` returns (its optional ``unmapped`` mapping is read with ``getattr``)."""

    graph_module: GraphModule
    rewritten: Sequence[str]
    refused: Mapping[str, str]


@runtime_checkable
class ViewPassBackend(Backend, Protocol):
    """Part ``view_pass``: the backend's ReplaceViewCopyWithViewPass."""

    def view_copy_pass(self, graph_module: GraphModule, /) -> ViewPassOutcome: ...


@runtime_checkable
class PreflightBackend(Backend, Protocol):
    """Part ``preflight``: ``(ok, message)`` for the toolchain on ``device``."""

    def preflight(self, device: str, /) -> tuple[bool, str]: ...


#: One method to lower: ``(nn.Module, example inputs)`` or ``(nn.Module, example inputs, dynamic_shapes)``.
MethodSpec: TypeAlias = "tuple[nn.Module, Sequence[Any]] | tuple[nn.Module, Sequence[Any], Any]"


@runtime_checkable
class LoweringBackend(Backend, Protocol):
    """Part ``lowering``: one program file for every method, for ``device``."""

    def lower(
        self, methods: Mapping[str, MethodSpec], /, *, device: str, options: Mapping[str, object] = ...
    ) -> bytes: ...


@runtime_checkable
class DevicePlacementBackend(LoweringBackend, Protocol):
    """Part ``device_placement``: ``lower`` whose ``lower_options`` list both placement keys."""

    @property
    def lower_options(self) -> Collection[str]: ...


@runtime_checkable
class RuntimeBackend(Backend, Protocol):
    """Part ``runtime``: load a method of a program, run it, release it. A handle is the backend's own."""

    def init(self, program: bytes, method: str, /) -> object: ...

    def execute(
        self, handle: object, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None, /
    ) -> list[torch.Tensor]: ...

    def destroy(self, handle: object, /) -> None: ...

    def execute_stats(self, handle: object, /) -> Mapping[str, int]: ...


@runtime_checkable
class RuntimeOptionsBackend(Backend, Protocol):
    """Part ``runtime_options``: backend-wide string options (``skip_copy_output_to_cpu_for_method``)."""

    def set_option(self, key: str, value: str, /) -> None: ...

    def get_option(self, key: str, /) -> str: ...


#: Protocol part name → the attributes a backend needs for that part. Chapters skip on a missing part.
PARTS: dict[str, tuple[str, ...]] = {
    "mm_out": ("mm_out",),
    "view_pass": ("view_copy_pass",),
    "preflight": ("preflight",),
    "lowering": ("lower",),
    "runtime": ("init", "execute", "destroy", "execute_stats"),
    "runtime_options": ("set_option", "get_option"),
}
#: Protocol part name → its typed protocol (a self-test holds their members to ``PARTS``).
PART_PROTOCOLS: dict[str, type] = {
    "mm_out": MmOutBackend,
    "view_pass": ViewPassBackend,
    "preflight": PreflightBackend,
    "lowering": LoweringBackend,
    "runtime": RuntimeBackend,
    "runtime_options": RuntimeOptionsBackend,
    "device_placement": DevicePlacementBackend,
}
#: Part ``runtime_options``: the one option the protocol names (a method list, comma-separated).
SKIP_COPY_OPTION = "skip_copy_output_to_cpu_for_method"
#: Export-time device placement: the ``lower`` option keys (upstream's ``PropagateDeviceConfig`` fields).
SKIP_H2D = "skip_h2d_for_method_inputs"
SKIP_D2H = "skip_d2h_for_method_outputs"
#: Protocol part name → the ``lower_options`` keys a backend needs for that part (besides ``lower``).
LOWER_OPTION_PARTS: dict[str, tuple[str, ...]] = {"device_placement": (SKIP_H2D, SKIP_D2H)}
DEFAULT_LOWERING_DEVICES = ("cpu", "cuda")


def lowering_devices(backend: object) -> tuple[str, ...]:
    """The target devices ``backend.lower`` supports (protocol attribute ``lowering_devices``); the one
    place the suite reads it (a self-test checks), so a backend without it is one that lowers for both."""
    devices = getattr(backend, "lowering_devices", DEFAULT_LOWERING_DEVICES)
    return devices if isinstance(devices, tuple) else tuple(devices)


def caches_methods(backend: object) -> bool:
    """Whether ``backend`` caches each compiled method apart, across processes (protocol attribute
    ``caches_methods``): the pre-lowering's one question about how to split its work."""
    return getattr(backend, "caches_methods", False) is True


def lower_options(backend: object) -> frozenset[str]:
    """The option keys ``backend.lower(options=...)`` accepts (protocol attribute ``lower_options``)."""
    return frozenset(getattr(backend, "lower_options", ()))


def part_attributes(*parts: str) -> tuple[str, ...]:
    """Every attribute the named protocol parts need, in order, without repeats."""
    return tuple(dict.fromkeys(attr for part in parts for attr in PARTS[part]))


def missing_attributes(backend: object, part: str) -> list[str]:
    """What ``backend`` lacks of protocol part ``part``: attributes, or ``lower_options`` keys (empty when it
    implements the part)."""
    if part in LOWER_OPTION_PARTS:
        lacking = missing_attributes(backend, "lowering")
        keys = lower_options(backend)
        return lacking + [f"lower_options[{k!r}]" for k in LOWER_OPTION_PARTS[part] if k not in keys]
    return [attr for attr in PARTS[part] if not callable(getattr(backend, attr, None))]


# ``implements`` narrows a backend to the part's protocol (as the checks above define "implements").
@overload
def implements(backend: object, part: Literal["mm_out"]) -> TypeIs[MmOutBackend]: ...
@overload
def implements(backend: object, part: Literal["view_pass"]) -> TypeIs[ViewPassBackend]: ...
@overload
def implements(backend: object, part: Literal["preflight"]) -> TypeIs[PreflightBackend]: ...
@overload
def implements(backend: object, part: Literal["lowering"]) -> TypeIs[LoweringBackend]: ...
@overload
def implements(backend: object, part: Literal["runtime"]) -> TypeIs[RuntimeBackend]: ...
@overload
def implements(backend: object, part: Literal["runtime_options"]) -> TypeIs[RuntimeOptionsBackend]: ...
@overload
def implements(backend: object, part: Literal["device_placement"]) -> TypeIs[DevicePlacementBackend]: ...
@overload
def implements(backend: object, part: str) -> bool: ...  # a part named at run time: no narrowing
def implements(backend: object, part: str) -> bool:
    """Whether ``backend`` implements protocol part ``part`` (nothing missing); narrows it to the part's
    typed protocol."""
    return not missing_attributes(backend, part)
