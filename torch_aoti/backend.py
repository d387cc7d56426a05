"""The adapter: PyTorch's own AOTInductor (``torch._inductor``) behind ``conformance/protocol.py``.

Parts implemented, each by calling PyTorch's public AOTI entry points unchanged:

``lowering`` (``cpu``, ``cuda``)
    ``torch.export.export`` per method (``dynamic_shapes`` honoured), then AOTInductor the way the docstring
    of ``torch._inductor.aoti_compile_and_package`` prescribes for several models in one ``.pt2``:
    ``torch._inductor.aot_compile(ep.module(), *ep.example_inputs, options={"aot_inductor.package": True})``
    per method and ``torch._inductor.package.package_aoti(file, {method: files})``. Each method is one model
    of the package, its model name the method name. No ``lower_options``: AOTInductor has no view-copy pass
    switch and no export-time placement (see below). A method that cannot be exported or compiled raises a
    ``ValueError`` naming it, with PyTorch's exception chained.

``runtime``
    ``init`` writes the program to a temporary ``.pt2`` and calls
    ``torch._inductor.package.load_package(path, model_name=method)`` (what ``aoti_load_package`` calls);
    ``execute`` calls the loaded ``AOTICompiledModel`` with the inputs, as a deployment does. Nothing is
    checked here that PyTorch does not check: inputs go to the runner as given, so the suite sees what
    PyTorch's runtime accepts. Its ``RuntimeError`` s (a corrupt archive, an unknown model, the generated
    input checks of ``AOTI_RUNTIME_CHECK_INPUTS=1``) become the protocol's ``ValueError``, PyTorch's message
    kept whole and prefixed with the argument it is about. The adapter's own handle (its lifetime:
    ``destroy``) is the adapter's business and is checked.

Not implemented, on purpose:

* part ``view_pass``: AOTInductor lowers ATen graphs through Inductor; no ``*_copy`` ops (an ExecuTorch
  edge-dialect artefact) ever reach a pass of PyTorch's, so there is nothing to run the suite's cases on.
* part ``runtime_options``: PyTorch's runner has no backend-wide options.
* part ``device_placement`` (``lower_options`` ``skip_h2d_for_method_inputs`` and
  ``skip_d2h_for_method_outputs``): placement is fixed by nature. A model compiled for a device takes its
  inputs on that device and returns its outputs there, and PyTorch's runner copies nothing either way: it
  reads a host tensor given to a CUDA model as device memory (an illegal address, or garbage; see
  ``repros/host_input_cuda_model.py``). The protocol's default on a CUDA target is host tensors in and
  out, the runtime copying them ("outputs are CPU tensors unless the method keeps them on the device"), and
  there is no export-time switch to declare. So the adapter does what every deployment around
  ``aoti_load_package`` does by hand: for a CUDA model it copies host input tensors to the model's device
  before the call, with their sizes and strides (``same_layout_on``), and the outputs back to the host
  after it (``stage_inputs``, ``unstage_outputs``), and ``execute_stats`` counts those bytes. A tensor
  already on a CUDA device, and anything that is not a tensor, goes to the runner as given: what PyTorch
  does with it is what the suite sees. On a CPU target nothing is copied.
* caller-provided ``outputs`` in PyTorch's runner: it always allocates its outputs. The protocol's
  ``outputs`` are therefore the adapter's own feature: after the run, the results are copied into them, and
  only when every one is a tensor of the result's dtype, shape and device (else a ``ValueError`` naming
  ``outputs``, nothing written). Those checks judge the adapter, not PyTorch.
"""

from __future__ import annotations

import copy
import io
import json
import os
import tempfile
import threading
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torch_aoti.package_cache import PackageCache, package_key

#: The environment variable the generated code reads (``cpp_wrapper_cpu.py``: a ``static`` getenv in each
#: compiled model, read at that model's first run). Anything but unset or starting with ``0`` turns on the
#: dtype / size / stride / device checks of every input.
CHECK_ENV = "AOTI_RUNTIME_CHECK_INPUTS"
#: The options a package needs; everything else is AOTInductor's defaults, as a deployment gets them.
INDUCTOR_OPTIONS: dict[str, Any] = {"aot_inductor.package": True}

#: The check mode the first ``execute`` of this process ran in (None: nothing ran yet). A compiled model
#: reads ``CHECK_ENV`` once, at its first run, so a process mixing modes would report the wrong one.
_first_run_mode: bool | None = None
_mode_lock = threading.Lock()


def checks_on(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the generated code will check inputs: the value it reads, judged as its C++ does."""
    value = env.get(CHECK_ENV)
    return value is not None and not value.startswith("0")


def first_run_mode() -> bool | None:
    return _first_run_mode


class AotiHandle:
    """One ``init``: the loaded model of one method. ``runner`` is None once destroyed."""

    def __init__(self, runner: Any, method: str, device: str) -> None:
        self.runner: Any = runner
        self.method = method
        #: The device AOTInductor compiled the model for, as its metadata says (``cpu``, ``cuda``).
        self.device = device
        #: What the adapter copied in the last execute (``execute_stats``).
        self.copied = {"h2d_bytes": 0, "d2h_bytes": 0}

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")


# ================================================================================================ lowering


def _check_methods(methods: object) -> Mapping[str, Sequence[Any]]:
    """The protocol's shape of ``methods``: what the adapter needs to call ``torch.export`` at all."""
    if not isinstance(methods, Mapping) or not methods:
        raise ValueError(
            "lower: argument 'methods' must be a non-empty mapping "
            f"{{name: (module, inputs[, dynamic_shapes])}}, got {methods!r}"
        )
    for name, entry in methods.items():
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"lower: argument 'methods': a method name must be a non-empty str, got {name!r}"
            )
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            raise ValueError(
                f"lower: argument 'methods': method {name!r} must be (module, inputs[, dynamic_shapes]), "
                f"got {type(entry).__name__}"
            )
    return methods


def _on(value: Any, device: str) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def export_method(name: str, entry: Sequence[Any], device: str) -> torch.export.ExportedProgram:
    """``torch.export`` of one method on the target device, or a ``ValueError`` naming it."""
    module, inputs = entry[0], entry[1]
    dynamic_shapes = entry[2] if len(entry) > 2 else None
    # A copy on the target device: the caller's module is left as it was; the model is compiled where it runs.
    placed = copy.deepcopy(module).to(device)
    args = tuple(_on(t, device) for t in inputs)
    try:
        return torch.export.export(placed, args, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        raise ValueError(f"lower: method {name!r}: torch.export failed: {type(exc).__name__}: {exc}") from exc


def compile_method(name: str, exported: torch.export.ExportedProgram) -> list[Any]:
    """The AOTInductor files of one exported method (``aot_compile``, packaging on), or a ``ValueError``."""
    try:
        # What aoti_compile_and_package runs (its minifier wrapper): the module without export's guards.
        example_args, example_kwargs = exported.example_inputs
        files = torch._inductor.aot_compile(
            exported.module(check_guards=False), example_args, example_kwargs, options=dict(INDUCTOR_OPTIONS)
        )
    except Exception as exc:
        raise ValueError(
            f"lower: method {name!r}: AOTInductor could not compile it: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(files, list):  # packaging on: aot_compile returns the list of generated files
        raise RuntimeError(f"lower: method {name!r}: aot_compile returned {files!r}, not a file list")
    return files


def package_methods(compiled: Mapping[str, list[Any]]) -> bytes:
    """One ``.pt2`` holding every method as a model of that name (``package_aoti`` with a mapping)."""
    from torch._inductor.package import package_aoti

    with tempfile.TemporaryDirectory(prefix="torch-aoti-") as tmp:
        path = os.path.join(tmp, "program.pt2")
        package_aoti(path, dict(compiled))
        with open(path, "rb") as f:
            return f.read()


#: Compiles of one program before a package with damaged files is an error.
PACKAGE_ATTEMPTS = 3


def compile_package(exported: Mapping[str, torch.export.ExportedProgram]) -> bytes:
    """Every method compiled and packaged; compiled again (up to ``PACKAGE_ATTEMPTS``) while the package
    holds damaged files."""
    damaged: list[str] = []
    for _attempt in range(PACKAGE_ATTEMPTS):
        data = package_methods({name: compile_method(name, ep) for name, ep in exported.items()})
        damaged = damaged_members(data)
        if not damaged:
            return data
    raise RuntimeError(
        f"lower: AOTInductor packaged damaged files {PACKAGE_ATTEMPTS} times "
        f"({', '.join(damaged)}): another process compiling the same kernels into the "
        "shared inductor cache ($TORCHINDUCTOR_CACHE_DIR) is the likely cause"
    )


def damaged_members(package: bytes) -> list[str]:
    """The members of a ``.pt2`` that cannot be what they claim: a ``.json`` that does not parse, a ``.so``
    that is no ELF file. ``aot_compile`` returns paths inside the shared inductor cache and ``package_aoti``
    copies them: a process compiling the same kernel at that moment rewrites them, and the package gets an
    empty ``*_metadata.json`` or ``.so`` that every later ``load_package`` fails on ("file too short"; both
    seen under two xdist workers). Not a defect of the runtime under test: the adapter compiles again."""
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        return [name for name in archive.namelist() if not _whole(archive, name)]


def _whole(archive: zipfile.ZipFile, name: str) -> bool:
    """Only what tells: a library's first four bytes, a JSON member whole; other members are not read."""
    if name.endswith(".so"):
        with archive.open(name) as member:
            return member.read(4) == b"\x7fELF"
    if name.endswith(".json"):
        try:
            json.loads(archive.read(name))
        except ValueError:
            return False
    return True


# ================================================================================================= runtime


def _refusal(argument: str, action: str, exc: BaseException) -> ValueError:
    """The protocol's invalid-argument error for a refusal of PyTorch's, its message kept whole."""
    return ValueError(
        f"{argument}: PyTorch's AOTI runtime refused it ({action}): {type(exc).__name__}: {exc}"
    )


def load_method(program: object, method: object) -> Any:
    """``load_package(path, model_name=method)`` on the program written to a temporary file."""
    from torch._inductor.package import load_package

    if not isinstance(program, (bytes, bytearray, memoryview)):  # the transport: bytes to a file
        raise ValueError(f"program: must be bytes (the .pt2 file's contents), got {type(program).__name__}")
    with tempfile.TemporaryDirectory(prefix="torch-aoti-init-") as tmp:
        path = os.path.join(tmp, "program.pt2")
        with open(path, "wb") as f:
            f.write(program)
        try:
            # The loader unpacks the archive into a directory of its own: the file may go afterwards.
            return load_package(path, model_name=method)  # type: ignore[arg-type]
        except TypeError as exc:  # pybind11 refuses a model_name that is not a str
            raise _refusal("method", "load_package's model_name", exc) from exc
        except RuntimeError as exc:
            # The loader names the model it could not find ("for model 'x'", "Available models"); any
            # other refusal is about the archive itself ("failed finding central directory").
            about_method = "Available models" in str(exc) or "not found in package" in str(exc)
            raise _refusal("method" if about_method else "program", "load_package", exc) from exc


def check_outputs(outputs: object, results: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The adapter's own ``outputs`` feature: tensors matching ``results`` one for one, or a ValueError."""
    if not isinstance(outputs, (list, tuple)):
        raise ValueError(f"outputs: must be a list or tuple of tensors, got {type(outputs).__name__}")
    if len(outputs) != len(results):
        raise ValueError(f"outputs: the method returns {len(results)} tensor(s), {len(outputs)} provided")
    for index, (dst, src) in enumerate(zip(outputs, results, strict=True)):
        if not isinstance(dst, torch.Tensor):
            raise ValueError(f"outputs[{index}]: must be a tensor, got {type(dst).__name__}")
        if dst.layout != torch.strided:
            raise ValueError(f"outputs[{index}]: must be a dense (strided) tensor, got layout {dst.layout}")
        if dst.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(f"outputs[{index}]: an inference tensor, not writable outside inference mode")
        if dst.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"outputs[{index}]: requires grad; autograd forbids writing it in place")
        for what, want, got in (("dtype", src.dtype, dst.dtype), ("shape", src.shape, dst.shape)):
            if want != got:
                raise ValueError(f"outputs[{index}]: {what} {got}, the method returns {want}")
        if dst.device != src.device:
            raise ValueError(f"outputs[{index}]: device {dst.device}, the method returns {src.device}")
    return list(outputs)


def stage_inputs(handle: AotiHandle, inputs: object) -> tuple[object, int]:
    """For a CUDA model, the caller's host tensors copied to its device (the protocol's default placement,
    which PyTorch's runner does not do), with the bytes copied; anything else as given."""
    if not handle.on_cuda or not isinstance(inputs, (list, tuple)):
        return inputs, 0
    device = torch.device("cuda", torch.cuda.current_device())
    staged: list[object] = []
    copied = 0
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            copied += value.numel() * value.element_size()
            value = same_layout_on(value, device)
        staged.append(value)
    return type(inputs)(staged), copied


def same_layout_on(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` copied to ``device`` with its sizes and strides (``Tensor.to`` would make a view with
    gaps, a step slice, contiguous, and the runner would never see the layout the caller gave). A tensor
    whose elements share memory (an expanded one) cannot be written with its strides: ``Tensor.to``."""
    try:
        placed = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
        return placed.copy_(tensor)
    except RuntimeError:  # "some elements of the written-to tensor refer to a single memory location"
        return tensor.to(device)


def unstage_outputs(handle: AotiHandle, results: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
    """For a CUDA model, its outputs copied to the host (the protocol's default), with the bytes copied."""
    if not handle.on_cuda:
        return results, 0
    on_device = [r for r in results if isinstance(r, torch.Tensor) and r.device.type == "cuda"]
    copied = sum(r.numel() * r.element_size() for r in on_device)
    return [r.cpu() if isinstance(r, torch.Tensor) else r for r in results], copied


def run_method(handle: AotiHandle, inputs: object) -> list[torch.Tensor]:
    """The runner called as a deployment calls it (``model(*inputs)``), its outputs as a flat list."""
    global _first_run_mode
    with _mode_lock:
        if _first_run_mode is None:
            _first_run_mode = checks_on()
    if not isinstance(inputs, (list, tuple)):  # the transport: the protocol's inputs are a sequence
        raise ValueError(f"inputs: must be a list or tuple of tensors, got {type(inputs).__name__}")
    try:
        result = handle.runner(*inputs)
    except RuntimeError as exc:
        raise _refusal("inputs", f"running method {handle.method!r}", exc) from exc
    return list(torch.utils._pytree.tree_leaves(result))


# ================================================================================================= backend


class TorchAotiBackend:
    """PyTorch's AOTInductor as a protocol backend: parts ``lowering`` and ``runtime``, in one check mode."""

    lowering_devices = ("cpu", "cuda")
    lower_options: frozenset[str] = frozenset()

    def __init__(self, checked: bool) -> None:
        #: Whether the generated input checks are on (``AOTI_RUNTIME_CHECK_INPUTS``), as read at load.
        self.checked = checked
        self.name = "torch-aoti-checked" if checked else "torch-aoti"
        mode = f"{CHECK_ENV}=1: input checks on" if checked else f"{CHECK_ENV} unset: no input checks"
        self.version = f"{torch.__version__} ({mode})"

    def lower(
        self,
        methods: Mapping[str, Sequence[Any]],
        *,
        device: str,
        options: Mapping[str, object] | None = None,
    ) -> bytes:
        """One ``.pt2`` package: every method exported, compiled by AOTInductor, packaged as a model."""
        checked = _check_methods(methods)
        if device not in self.lowering_devices:
            raise ValueError(f"lower: argument 'device' is {device!r}; AOTInductor lowers for cpu and cuda")
        if options:  # None or empty: nothing asked
            raise ValueError(
                f"lower: option(s) {sorted(map(str, options))} not supported: AOTInductor has no view-copy "
                "pass switch and no export-time placement (a model's inputs and outputs live on its device)"
            )
        exported = {name: export_method(name, entry, device) for name, entry in checked.items()}
        key = package_key(exported, device, INDUCTOR_OPTIONS)
        data, _cached = PackageCache().get_or_build(key, lambda: compile_package(exported))
        return data

    def init(self, program: bytes, method: str) -> AotiHandle:
        runner = load_method(program, method)
        metadata = runner.get_metadata()  # AOTInductor records the device it compiled for
        return AotiHandle(runner, method, str(metadata.get("AOTI_DEVICE_KEY", "unknown")))

    def execute(
        self,
        handle: AotiHandle,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        live = _live(handle, "execute")
        staged, h2d = stage_inputs(live, inputs)
        results, d2h = unstage_outputs(live, run_method(live, staged))
        live.copied = {"h2d_bytes": h2d, "d2h_bytes": d2h}
        if outputs is None:
            return results
        provided = check_outputs(outputs, results)  # nothing is written unless every one fits
        for dst, src in zip(provided, results, strict=True):
            dst.copy_(src)
        return provided

    def destroy(self, handle: AotiHandle) -> None:
        _live(handle, "destroy").runner = None  # the loader's last reference: its model is freed

    def execute_stats(self, handle: AotiHandle) -> dict[str, int]:
        """What the adapter copied between host and device in the handle's last execute (the runner itself
        copies nothing): zero on a CPU target."""
        return dict(_live(handle, "execute_stats").copied)

    def __repr__(self) -> str:
        return f"<torch AOTInductor {self.version} adapter: lowering, runtime>"


def _live(handle: object, call: str) -> AotiHandle:
    """The adapter's own handle check (PyTorch has no handles: a model is freed with its last reference)."""
    if not isinstance(handle, AotiHandle):
        raise ValueError(f"{call}: argument 'handle' is not a handle from init, got {type(handle).__name__}")
    if handle.runner is None:
        raise ValueError(f"{call}: argument 'handle' was destroyed (method {handle.method!r})")
    return handle
