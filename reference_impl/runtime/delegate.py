"""Delegate handles: ``init`` a method of a program, ``execute`` it, read ``execute_stats``, ``destroy`` it.

Data movement (CUDA target)
    * A CPU input is copied into the handle's reusable **pinned** staging buffer, then to a fresh device
      tensor with ``copy_(non_blocking=True)``. A CPU input that is already pinned (and laid out as the
      method expects) is copied to the device directly. An input already on the handle's device (the
      encoder's output fed to the decoder, a KV cache kept on the GPU) is used as is, without a copy.
    * Outputs are copied to fresh **pinned** CPU tensors (``non_blocking``, then one synchronisation), unless
      the method keeps them on the device, in which case they are returned as ordinary CUDA tensors.
    * **Export-time placement** (the blob's ``extra["placement"]``, ``format/placement.py``) comes first:
      a method lowered with ``skip_h2d_for_method_inputs`` takes device inputs only (a host tensor is an
      ``InputError``: nothing is copied host→device); one lowered with ``skip_d2h_for_method_outputs``
      ``True`` / ``False`` keeps its outputs on the device / copies them out, whatever the runtime option
      says. Only a method whose output placement was not fixed at export time follows the legacy option
      ``skip_copy_output_to_cpu_for_method`` (read once, at the start of each execute). ``init`` rejects a
      method fixed to host outputs that the option names (a conflict; after ``init``, export time wins).
    * ``execute_stats(handle)`` gives the bytes this handle's last successful execute moved host→device
      (``h2d_bytes``: CPU inputs) and device→host (``d2h_bytes``: outputs copied out); both are 0 for a CPU
      target.

Streams and ordering — the guarantee (``STREAM_POLICY``)
    The method runs on **the caller's current stream** of the handle's device (AOTInductor's runner uses
    the current stream when given none; we pass none, under a device guard), so it is ordered after
    whatever the caller queued there — e.g. the kernel that produced a device input — and no per-handle
    stream can reorder two delegates (upstream #22318). Before returning, ``execute`` records an event after
    the last piece of its work (the method and any output copies) and **waits for it on the host**. So when
    ``execute`` returns, every output — CPU or CUDA — holds finished data, and a consumer on *any* stream,
    including one created later, reads correct values without synchronising (upstream #21727 returned early).
    Why not only stream-ordering: an event or ``record_stream`` can order work on streams we know of; the
    contract says "whatever stream the consumer uses", and the set of streams a caller may use is not
    knowable, so completion is the only general guarantee. Cost: ``execute`` is blocking — the host waits
    for the method's GPU time, and consecutive executes cannot overlap host launch work with GPU work
    (roughly one launch latency, a few to tens of µs, per execute; the D2H path has to wait for its copy
    anyway). Memory rule unchanged from PyTorch: a consumer that uses a returned CUDA tensor on another
    stream and then frees it should ``record_stream`` it, as with any tensor.

Outputs are never views into memory the runtime reuses: CUDA outputs are the method's own fresh allocations
(or tensors the caller passed in), CPU outputs are fresh pinned tensors; the staging buffer only feeds
input copies, and it is not rewritten until the copies that read it have finished (an event, waited on).

Threads
    Any number of threads may ``execute`` on one handle or on different handles while others call
    ``set_option``. Each handle has two small locks: one around its staging buffer (held while inputs are
    written and their copies queued), one around its state (destroyed flag, runner, last stats). Nothing is
    global: different handles never wait for each other here. The AOTInductor container serialises runs of
    one loaded model by itself. ``destroy`` while another thread executes is safe: that execute finishes
    with the runner it started with.

Errors: contract violations raise ``RuntimeArgumentError`` subclasses (``ValueError``) naming the argument and
the rule, before anything runs and with nothing changed (caller ``outputs`` are written only after every check
passed). Program-format errors are the format's own ``LoweringFormatError`` (a ``ValueError``), with a note.
Library failures stay ``RuntimeError``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from reference_impl.format.argument_errors import RuntimeArgumentError
from reference_impl.format.iospec import IOSpec, TensorSpec
from reference_impl.format.package_loader import load_package_fast
from reference_impl.format.placement import SKIP_D2H, SKIP_H2D, MethodPlacement, placement_conflicts
from reference_impl.format.program import program_from_bytes
from reference_impl.runtime.errors import DestroyedHandleError, InputError, OutputError
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD, STORE, OptionStore

__all__ = [
    "STREAM_POLICY",
    "DelegateHandle",
    "destroy",
    "execute",
    "execute_stats",
    "init",
]

STREAM_POLICY = "caller-current-stream; host waits for completion before execute returns"
_ALIGN = 256  # staging slots start on 256-byte boundaries (any dtype view is aligned)


@dataclass(eq=False)
class DelegateHandle:
    """One loaded method. Public fields are read-only by convention; the rest belongs to the runtime."""

    method_name: str
    device: torch.device
    stream_policy: str
    io: IOSpec | None
    """Input/output metadata from the blob; ``None``: dtypes and shapes unchecked (count and device are)."""
    num_inputs: int
    num_outputs: int
    artifact_sha256: str
    options: OptionStore = field(repr=False)
    placement: MethodPlacement = field(default_factory=MethodPlacement)
    """Export-time device placement from the blob (``None`` fields: not fixed, the runtime option decides)."""
    mm_out_route: dict[str, Any] | None = None
    """How the program's ``aoti_torch_cuda_mm_out`` calls were routed (blob ``extra["mm_out_route"]``)."""
    _runner: Any = field(default=None, repr=False)
    _state_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _staging_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _staging: torch.Tensor | None = field(default=None, repr=False)
    _staging_event: Any = field(default=None, repr=False)
    _stats: dict[str, int] = field(default_factory=lambda: {"h2d_bytes": 0, "d2h_bytes": 0}, repr=False)
    _destroyed: bool = field(default=False, repr=False)

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def staging_buffer(self) -> torch.Tensor | None:
        """The pinned staging buffer (``None`` until a CPU input was staged, and on CPU targets)."""
        return self._staging


# --- init / destroy -------------------------------------------------------------------------------------


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(text)


def _resolve_device(target: str, device: object, method: str) -> torch.device:
    if target == "cpu":
        if device is not None and torch.device(device).type != "cpu":  # type: ignore[arg-type]
            raise RuntimeArgumentError(
                f"device: method {method!r} was lowered for the CPU, so it runs on 'cpu', not {device!r}"
            )
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeArgumentError(
            f"program: method {method!r} was lowered for CUDA but this process has no usable CUDA device "
            "(torch.cuda.is_available() is False)"
        )
    try:
        dev = torch.device("cuda") if device is None else torch.device(device)  # type: ignore[arg-type]
    except (TypeError, RuntimeError) as exc:
        raise RuntimeArgumentError(f"device: {device!r} is not a device ({exc})") from None
    if dev.type != "cuda":
        raise RuntimeArgumentError(
            f"device: method {method!r} was lowered for CUDA, so it runs on a CUDA device, not {device!r}"
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < torch.cuda.device_count():
        raise RuntimeArgumentError(
            f"device: {device!r} does not exist; this process sees {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


def _load_runner(artifact: bytes, device: torch.device, method: str) -> Any:
    # The loader wants a path: a private temp file (0600), removed as soon as the package is extracted.
    fd, path = tempfile.mkstemp(prefix=f"aoti-{method}-", suffix=".pt2")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(artifact)
        guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        with guard:
            try:
                # Not aoti_load_package: its device-info probe costs 28-40 s on a process's first load.
                compiled = load_package_fast(path, device_index=device.index if device.type == "cuda" else -1)
            except Exception as exc:
                raise RuntimeError(
                    f"method {method!r}: AOTInductor could not load its artifact on {device}: {exc}"
                ) from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return compiled.loader


def _load_mm_out_provider(route: object, method: str) -> None:
    """A program routed to the native mm_out shim resolves its symbol at dlopen from the global scope:
    load the shim (``RTLD_GLOBAL``) first, or say why it cannot run here (``shims/native/routing.py``)."""
    if not isinstance(route, dict) or route.get("provider") != "native":
        return
    from reference_impl.shims.native.library import NativeUnavailableError, load

    try:
        load()
    except NativeUnavailableError as exc:
        raise RuntimeError(
            f"method {method!r} was lowered to call the native mm_out shim ({route.get('symbol')}), "
            f"which cannot be loaded here: {exc}"
        ) from exc


def _call_spec_leaves(loader: Any) -> tuple[int, int]:
    from torch.utils import _pytree as pytree

    in_spec, out_spec = loader.get_call_spec()
    return pytree.treespec_loads(in_spec).num_leaves, pytree.treespec_loads(out_spec).num_leaves


def init(
    program: bytes,
    method: str,
    *,
    device: str | torch.device | None = None,
    options: OptionStore | None = None,
) -> DelegateHandle:
    """Load method ``method`` of a program file image and return its handle.

    ``device``: for a CUDA program, which CUDA device (default: the current one); a CPU program runs on the
    CPU. ``options``: the option store to read (default: the backend-wide one).
    """
    if not isinstance(method, str):
        raise RuntimeArgumentError(f"method must be a str naming a method of the program, got {method!r}")
    try:
        parsed = program_from_bytes(program, runtime_torch_version=torch.__version__)
        contents = parsed.contents(method)
    except ValueError as exc:
        _note(exc, f"(raised by runtime init of method {method!r})")
        raise
    dev = _resolve_device(contents.device, device, method)
    io = IOSpec.from_json(contents.extra["io"]) if "io" in contents.extra else None
    placement = MethodPlacement.from_json(contents.extra.get("placement"))
    store = STORE if options is None else options
    if placement_conflicts({contents.method_name: placement}, store.skip_copy_methods()):
        raise RuntimeArgumentError(
            f"method: {method!r} was lowered with {SKIP_D2H}=False (outputs copied to the host), but the "
            f"runtime option {SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD!r} names it: conflicting placement "
            "(export time wins; drop one of the two)"
        )
    route = contents.extra.get("mm_out_route")
    _load_mm_out_provider(route, method)
    loader = _load_runner(contents.artifact, dev, method)
    spec_inputs, spec_outputs = _call_spec_leaves(loader)
    return DelegateHandle(
        method_name=contents.method_name,
        device=dev,
        stream_policy=STREAM_POLICY if dev.type == "cuda" else "synchronous (CPU)",
        io=io,
        num_inputs=len(io.inputs) if io is not None else spec_inputs,
        num_outputs=len(io.outputs) if io is not None else spec_outputs,
        artifact_sha256=contents.artifact_sha256,
        options=store,
        placement=placement,
        mm_out_route=route if isinstance(route, dict) else None,
        _runner=loader,
    )


def _live_runner(handle: object, what: str = "handle") -> Any:
    if not isinstance(handle, DelegateHandle):
        raise DestroyedHandleError(
            f"{what} must be a DelegateHandle returned by init, got {type(handle).__name__}"
        )
    with handle._state_lock:
        if handle._destroyed:
            raise DestroyedHandleError(
                f"{what}: the handle of method {handle.method_name!r} was destroyed; init a new one"
            )
        return handle._runner


#: Runners whose release would abort the process (their device is faulted): kept until it ends.
_KEPT_AFTER_DEVICE_FAULT: list[Any] = []


def _device_faulted(device: torch.device) -> bool:
    """Whether ``device`` holds a sticky error (every later call on it fails). A stream query, not a
    synchronize: it never waits for other threads' work."""
    try:
        torch.cuda.current_stream(device).query()
    except Exception:  # torch raises AcceleratorError / RuntimeError for a sticky error
        return True
    return False


def destroy(handle: DelegateHandle) -> None:
    """Release the handle's runner and staging memory. A second destroy is an error (it names the handle)."""
    _live_runner(handle)
    with handle._state_lock:
        if handle._destroyed:
            raise DestroyedHandleError(
                f"handle: the handle of method {handle.method_name!r} was already destroyed"
            )
        handle._destroyed = True
        runner, handle._runner = handle._runner, None
    with handle._staging_lock:  # an execute staging right now finishes first
        staging, handle._staging = handle._staging, None
        event, handle._staging_event = handle._staging_event, None
    if handle.device.type == "cuda" and _device_faulted(handle.device):
        # Releasing the runner, the staging buffers or their event frees device resources; under a sticky
        # CUDA error (a kernel that faulted) that aborts the process (seen on an H100 and an H200). The
        # context is lost anyway: keep them, so that the caller's process survives to report the fault.
        _KEPT_AFTER_DEVICE_FAULT.append((runner, staging, event))


def execute_stats(handle: DelegateHandle) -> dict[str, int]:
    """``{"h2d_bytes", "d2h_bytes"}`` of the handle's last successful execute (zeros before the first)."""
    _live_runner(handle)
    with handle._state_lock:
        return dict(handle._stats)


# --- argument checks ------------------------------------------------------------------------------------


def _tensor_list(value: object, what: str, error: type[RuntimeArgumentError]) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise error(f"{what} must be a list or tuple of tensors, got {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, torch.Tensor):
            raise error(f"{what}[{index}] must be a torch.Tensor, got {type(item).__name__}")
        if item.layout != torch.strided:
            raise error(f"{what}[{index}] must be a dense (strided) tensor, got layout {item.layout}")
    return list(value)


def _check_inputs(handle: DelegateHandle, inputs: object) -> list[torch.Tensor]:
    tensors = _tensor_list(inputs, "inputs", InputError)
    if len(tensors) != handle.num_inputs:
        raise InputError(
            f"inputs: method {handle.method_name!r} takes {handle.num_inputs} tensor(s), got {len(tensors)}"
        )
    device_only = handle.device.type == "cuda" and handle.placement.inputs_on_device is True
    for index, tensor in enumerate(tensors):
        dev = tensor.device
        if device_only and dev != handle.device:
            raise InputError(
                f"inputs[{index}]: device must be {str(handle.device)!r}: method {handle.method_name!r} was "
                f"lowered with {SKIP_H2D}=True, so its inputs arrive on the device and nothing is copied "
                f"host→device; got {str(dev)!r}"
            )
        if dev.type == "cpu" or (handle.device.type == "cuda" and dev == handle.device):
            continue
        allowed = (
            "'cpu'"
            if handle.device.type == "cpu"
            else f"'cpu' or {str(handle.device)!r} (the handle's device)"
        )
        raise InputError(f"inputs[{index}]: device must be {allowed}, got {str(dev)!r}")
    if handle.io is not None:
        handle.io.check_shapes("inputs", tensors, handle.io.inputs, InputError, handle.method_name)
    return tensors


def _check_outputs_before(
    handle: DelegateHandle, outputs: object, out_device: torch.device
) -> list[torch.Tensor]:
    tensors = _tensor_list(outputs, "outputs", OutputError)
    if handle.io is not None and len(tensors) != handle.num_outputs:
        raise OutputError(
            f"outputs: method {handle.method_name!r} returns {handle.num_outputs} tensor(s), "
            f"but {len(tensors)} were provided"
        )
    for index, tensor in enumerate(tensors):
        # Checked before anything runs: torch refuses these in-place writes only after the kernels ran.
        if tensor.is_inference() and not torch.is_inference_mode_enabled():
            raise OutputError(
                f"outputs[{index}] is an inference tensor; outside torch.inference_mode() it cannot be "
                "written in place (pass a normal tensor, or call execute inside inference mode)"
            )
        if tensor.requires_grad and torch.is_grad_enabled():
            raise OutputError(
                f"outputs[{index}] requires grad; autograd forbids writing it in place (pass a tensor that "
                "does not require grad, or call execute under torch.no_grad())"
            )
        if tensor.device != out_device:
            why = _output_placement_reason(handle, out_device)
            got = str(tensor.device)
            raise OutputError(
                f"outputs[{index}]: device must be {str(out_device)!r} because {why}; got {got!r}"
            )
        if handle.io is not None:
            spec = handle.io.outputs[index]
            if tensor.dtype != spec.dtype:
                raise OutputError(f"outputs[{index}]: dtype must be {spec.dtype}, got {tensor.dtype}")
            if spec.is_static and tuple(tensor.shape) != spec.shape:
                raise OutputError(
                    f"outputs[{index}]: shape must be {list(spec.shape)}, got {list(tensor.shape)}"
                )
    return tensors


def _output_placement_reason(handle: DelegateHandle, out_device: torch.device) -> str:
    if handle.device.type == "cpu":
        return "outputs of a CPU target are host tensors"
    fixed = handle.placement.outputs_on_device
    if fixed is not None:
        return f"the method was lowered with {SKIP_D2H}={fixed}"
    named = "named" if out_device.type == "cuda" else "not named"
    return f"the method is {named} in {SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD}"


def keeps_outputs_on_device(handle: DelegateHandle) -> bool:
    """Whether this execute returns device outputs: export-time placement first, then the runtime option."""
    if handle.device.type != "cuda":
        return False
    fixed = handle.placement.outputs_on_device
    return fixed if fixed is not None else handle.options.should_skip_copy(handle.method_name)


def _check_outputs_after(provided: list[torch.Tensor], results: Sequence[torch.Tensor], method: str) -> None:
    if len(provided) != len(results):
        raise OutputError(
            f"outputs: method {method!r} returned {len(results)} tensor(s), but {len(provided)} were provided"
        )
    for index, (dst, src) in enumerate(zip(provided, results, strict=True)):
        if dst.dtype != src.dtype or dst.shape != src.shape:
            raise OutputError(
                f"outputs[{index}]: must have dtype {src.dtype} and shape {list(src.shape)} "
                f"(what method {method!r} produced), got {dst.dtype} {list(dst.shape)}"
            )


# --- layout ---------------------------------------------------------------------------------------------


def _spec(handle: DelegateHandle, index: int) -> TensorSpec | None:
    return handle.io.inputs[index] if handle.io is not None else None


def _layout_ok(tensor: torch.Tensor, spec: TensorSpec | None) -> bool:
    if spec is None or spec.strides is None:
        return tensor.is_contiguous()
    if tensor.numel() == 0:
        return True
    return all(s == e for s, e, n in zip(tensor.stride(), spec.strides, tensor.shape, strict=False) if n != 1)


def _empty_like_spec(tensor: torch.Tensor, spec: TensorSpec | None, device: torch.device) -> torch.Tensor:
    if spec is None or spec.strides is None:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
    return torch.empty_strided(tensor.shape, spec.strides, dtype=tensor.dtype, device=device)


def _as_expected_layout(tensor: torch.Tensor, spec: TensorSpec | None) -> torch.Tensor:
    """The tensor itself when its layout is what the method was compiled for, else a same-device copy."""
    if _layout_ok(tensor, spec):
        return tensor
    out = _empty_like_spec(tensor, spec, tensor.device)
    out.copy_(tensor)
    return out


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# --- execute --------------------------------------------------------------------------------------------


def execute(
    handle: DelegateHandle,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Run the handle's method on ``inputs``; see the module docstring for placement, streams and threads.

    ``outputs``: optional tensors to fill in place (returned as the result); each must have the dtype and
    shape the method produces and live where outputs go this call — the CPU, or the handle's device when the
    method keeps its outputs there (export-time placement, else ``skip_copy_output_to_cpu_for_method``).
    """
    runner = _live_runner(handle)
    tensors = _check_inputs(handle, inputs)
    on_cuda = handle.device.type == "cuda"
    keep_on_device = keeps_outputs_on_device(handle)
    out_device = handle.device if (keep_on_device or not on_cuda) else torch.device("cpu")
    provided = None if outputs is None else _check_outputs_before(handle, outputs, out_device)
    with torch.no_grad():
        if on_cuda:
            with torch.cuda.device(handle.device):
                result, stats = _execute_cuda(handle, runner, tensors, provided, keep_on_device)
        else:
            result, stats = _execute_cpu(handle, runner, tensors, provided)
    with handle._state_lock:
        handle._stats = stats
    return result


def _execute_cpu(
    handle: DelegateHandle, runner: Any, tensors: list[torch.Tensor], provided: list[torch.Tensor] | None
) -> tuple[list[torch.Tensor], dict[str, int]]:
    prepared = [_as_expected_layout(t, _spec(handle, i)) for i, t in enumerate(tensors)]
    results = list(runner.run(prepared))
    stats = {"h2d_bytes": 0, "d2h_bytes": 0}
    if provided is None:
        return results, stats
    _check_outputs_after(provided, results, handle.method_name)
    for dst, src in zip(provided, results, strict=True):
        dst.copy_(src)
    return provided, stats


def _stage_inputs(
    handle: DelegateHandle, tensors: list[torch.Tensor], stream: torch.cuda.Stream
) -> tuple[list[torch.Tensor], int]:
    """Device tensors for ``tensors``: device inputs as they are, CPU inputs copied through pinned memory."""
    prepared: list[torch.Tensor | None] = [None] * len(tensors)
    staged: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (index, host tensor, device destination)
    for index, tensor in enumerate(tensors):
        spec = _spec(handle, index)
        if tensor.device.type == "cuda":
            prepared[index] = _as_expected_layout(tensor, spec)
        else:
            staged.append((index, tensor, _empty_like_spec(tensor, spec, handle.device)))
            prepared[index] = staged[-1][2]
    if not staged:
        return prepared, 0  # type: ignore[return-value]
    h2d = 0
    with handle._staging_lock:
        if handle._destroyed:
            raise DestroyedHandleError(
                f"handle: the handle of method {handle.method_name!r} was destroyed during execute"
            )
        if handle._staging_event is not None:
            handle._staging_event.synchronize()  # the copies that last read the buffer have finished
        need = sum(-(-_nbytes(host) // _ALIGN) * _ALIGN for _, host, _ in staged if not _direct(host))
        if need and (handle._staging is None or handle._staging.numel() < need):
            handle._staging = torch.empty(need, dtype=torch.uint8, pin_memory=True)
        offset = 0
        for _, host, dst in staged:
            size = _nbytes(host)
            h2d += size
            if size == 0:
                continue
            if _direct(host):
                src = host  # the caller's pinned, contiguous tensor: no staging copy needed
            else:
                assert handle._staging is not None
                src = handle._staging[offset : offset + size].view(host.dtype).view(host.shape)
                src.copy_(host)
                offset += -(-size // _ALIGN) * _ALIGN
            dst.copy_(src, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        handle._staging_event = event
    return prepared, h2d  # type: ignore[return-value]


def _direct(host: torch.Tensor) -> bool:
    return host.is_contiguous() and host.is_pinned()


def _execute_cuda(
    handle: DelegateHandle,
    runner: Any,
    tensors: list[torch.Tensor],
    provided: list[torch.Tensor] | None,
    keep_on_device: bool,
) -> tuple[list[torch.Tensor], dict[str, int]]:
    stream = torch.cuda.current_stream(handle.device)
    prepared, h2d = _stage_inputs(handle, tensors, stream)
    # No stream handle: AOTInductor's CUDA runner then uses the current stream of the current device, which
    # the device guard in execute() makes the caller's current stream on the handle's device.
    results = list(runner.run(prepared))
    del prepared
    if provided is not None:
        _check_outputs_after(provided, results, handle.method_name)
    d2h = 0
    finish_on_host: list[tuple[torch.Tensor, torch.Tensor]] = []
    if keep_on_device:
        if provided is None:
            returned = results
        else:
            for dst, src in zip(provided, results, strict=True):
                dst.copy_(src)
            returned = provided
    else:
        returned = []
        for index, src in enumerate(results):
            dst = provided[index] if provided is not None else None
            if dst is not None and _direct(dst):
                dst.copy_(src, non_blocking=True)
                host = dst
            else:
                host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
                host.copy_(src, non_blocking=True)
                if dst is not None:
                    finish_on_host.append((dst, host))
                    host = dst
            d2h += _nbytes(src)
            returned.append(host)
    done = torch.cuda.Event()
    done.record(stream)
    done.synchronize()  # the guarantee: outputs hold finished data for any stream once we return
    for dst, host in finish_on_host:
        dst.copy_(host)
    return returned, {"h2d_bytes": h2d, "d2h_bytes": d2h}
