"""Broken backends that slip *just beside* the examples a person writes: strided inputs, a dynamic size past
its bound, falsy or misspelt option and placement values, method names in another form, a check made at the
wrong time, a cache that serves a stale program, provided outputs left unfilled, outputs shared between
calls. Each wraps the reference; none is named by a rule-specific chapter. The generated chapters
(``differential``, ``metamorphic``) must find each on their own:
``tests/conformance/test_broken_chapter_backends.py`` runs them, and ``python -m tests.differential_power``
measures the differential chapter's catch rate over every CPU broken backend.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from reference_impl import BACKEND as REFERENCE
from reference_impl.format.placement import SKIP_D2H, SKIP_H2D
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP_COPY_OPTION
from tests.broken.chapter import Forwarding, WritesOutputsBeforeChecking
from tests.broken.input import LoadErrorsAsRuntimeError
from tests.broken.placement import CountsArgumentBytes
from tests.rule_coverage import Breaks

DIFFERENTIAL = "conformance/differential/test_differential.py"
METAMORPHIC = "conformance/metamorphic/test_metamorphic.py"
#: The self-tests need to know that the chapter fails, not the shrunk example: shrinking replays hundreds of
#: sequences (minutes), finding the failure takes seconds.
PROTOCOL_CPU = ("-k", "protocol_calls and cpu", "--generated-no-shrink")
PROTOCOL_CUDA = ("-k", "protocol_calls and cuda", "--generated-no-shrink")


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _fits(t: torch.Tensor, strides: Sequence[int], offset: int) -> bool:
    last = offset + sum((n - 1) * s for n, s in zip(t.shape, strides, strict=True)) if t.numel() else offset
    return last < t.untyped_storage().nbytes() // t.element_size()


# ============================================================================================ execute


class ReadsInputsAsContiguous(Forwarding):
    """Copies each input's ``numel`` elements from ``data_ptr()`` as if it were contiguous (the memcpy a
    runtime written against contiguous examples does): a transposed or step-sliced input of the right shape
    and dtype runs on the wrong elements."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        if isinstance(inputs, (list, tuple)):
            inputs = [self._as_read(t) for t in inputs]
        return REFERENCE.execute(handle, inputs, outputs)

    @staticmethod
    def _as_read(t: object) -> object:
        if not isinstance(t, torch.Tensor) or t.is_contiguous() or not t.numel():
            return t
        strides = _contiguous_strides(t.shape)
        if not _fits(t, strides, t.storage_offset()):
            return t
        return torch.as_strided(t, t.shape, strides, t.storage_offset()).clone()


class IgnoresStorageOffset(Forwarding):
    """Reads each input from the start of its storage: an input that is a view at an offset (a slice of a
    larger buffer) runs on the elements before it."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        if isinstance(inputs, (list, tuple)):
            inputs = [
                torch.as_strided(t, t.shape, t.stride(), 0).clone()
                if isinstance(t, torch.Tensor) and t.storage_offset() and _fits(t, t.stride(), 0)
                else t
                for t in inputs
            ]
        return REFERENCE.execute(handle, inputs, outputs)


class ClampsDynamicSizes(Forwarding):
    """Cuts an input whose dynamic dimension is past its ``Dim``'s bound down to the bound ("the most the
    program takes") instead of rejecting it: the caller gets an answer for another input."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        io = getattr(handle, "io", None)
        if io is not None and isinstance(inputs, (list, tuple)) and len(inputs) == len(io.inputs):
            inputs = [self._clamp(t, spec) for t, spec in zip(inputs, io.inputs, strict=True)]
        return REFERENCE.execute(handle, inputs, outputs)

    @staticmethod
    def _clamp(t: object, spec: Any) -> object:
        if not isinstance(t, torch.Tensor) or t.dim() != len(spec.shape):
            return t
        for axis, dim in enumerate(spec.shape):
            top = getattr(dim, "max", None)
            if top is not None and t.shape[axis] > top:
                t = t.narrow(axis, 0, top)
        return t


class IgnoresProvidedOutputs(Forwarding):
    """Returns freshly allocated outputs and never fills the ``outputs=`` tensors the caller provided (it
    checks them, so every rejected call is still rejected): the caller's buffers keep their old contents."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        if outputs is None:
            return REFERENCE.execute(handle, inputs)
        from reference_impl.runtime.delegate import _check_outputs_before, keeps_outputs_on_device

        out_device = (
            handle.device if keeps_outputs_on_device(handle) or handle.device.type == "cpu" else "cpu"
        )
        _check_outputs_before(handle, outputs, torch.device(out_device))
        return REFERENCE.execute(handle, inputs)


class ReturnsItsOutputArena(Forwarding):
    """Returns the same output tensors on every execute of a handle, refilled in place ("no allocation per
    call"): a result the caller still holds changes under it at the next execute."""

    _arena: ClassVar[dict[int, list[torch.Tensor]]] = {}

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        if outputs is not None:
            return results
        arena = self._arena.get(id(handle))
        if arena is None or [(t.shape, t.dtype, t.device) for t in arena] != [
            (t.shape, t.dtype, t.device) for t in results
        ]:
            self._arena[id(handle)] = arena = [torch.empty_like(t) for t in results]
        for dst, src in zip(arena, results, strict=True):
            dst.copy_(src)
        return list(arena)


class SharesScratchAcrossThreads(Forwarding):
    """Stages every handle's inputs through one scratch list per backend, without a lock ("one execute at a
    time in practice"): two threads executing at once run on each other's inputs."""

    _scratch: ClassVar[dict[str, list[torch.Tensor]]] = {}

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in inputs):
            return REFERENCE.execute(handle, inputs, outputs)
        self._scratch["inputs"] = [t.clone() for t in inputs]
        _yield_thread()
        return REFERENCE.execute(handle, self._scratch["inputs"], outputs)


class SharesOutputArenaAcrossHandles(Forwarding):
    """Keeps one output arena per output shape and dtype for the whole backend ("outputs of the same size
    reuse one buffer"), refilled in place by every execute of every handle: two handles (or two threads)
    hand each other's results back."""

    _arena: ClassVar[dict[tuple[object, ...], torch.Tensor]] = {}

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        if outputs is not None:
            return results
        shared = []
        for t in results:
            key = (tuple(t.shape), t.dtype, t.device)
            if key not in self._arena:
                self._arena[key] = torch.empty_like(t)
            _yield_thread()
            self._arena[key].copy_(t)
            shared.append(self._arena[key])
        return shared


def _yield_thread() -> None:
    """Where a real runtime would release the GIL (a host copy, a kernel launch)."""
    threading.Event().wait(0.0005)


class WritesResultsIntoInputs(Forwarding):
    """Saves an allocation by writing the first output back into the first input when their shapes and
    dtypes match ("the caller is done with it"): the caller's input tensor changes under it."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        first = inputs[0] if isinstance(inputs, (list, tuple)) and inputs else None
        same = isinstance(first, torch.Tensor) and results and first.shape == results[0].shape
        if same and first.dtype == results[0].dtype and first.device == results[0].device:
            first.copy_(results[0])
        return results


class KeepsOutputsOnDeviceWhenListed(Forwarding):
    """Splits the skip-copy option on commas without trimming: ``"encoder, decoder"`` keeps only the
    encoder's outputs on the GPU (the decoder's, named with a space, are copied to the host)."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        from reference_impl.runtime.options import STORE

        device = getattr(handle, "device", None)  # not a handle: the reference's error, as it is
        if device is None or device.type != "cuda" or handle.placement.outputs_on_device is not None:
            return REFERENCE.execute(handle, inputs, outputs)
        listed = STORE.get_option(SKIP_COPY_OPTION).split(",")
        if handle.method_name in STORE.skip_copy_methods() and handle.method_name not in listed:
            return [t.cpu() for t in REFERENCE.execute(handle, inputs)]  # named with spaces: missed
        return REFERENCE.execute(handle, inputs, outputs)


# ============================================================================================== init


class StripsMethodNames(Forwarding):
    """Strips surrounding whitespace from the method name at ``init`` ("be lenient"): ``" forward"`` loads
    ``forward``, although names are matched exactly."""

    def init(self, program: Any, method: Any) -> Any:
        return REFERENCE.init(program, method.strip() if isinstance(method, str) else method)


class NormalizesMethodNames(Forwarding):
    """Normalises the method name to NFC at ``init``: a name in another Unicode normal form loads the
    program's method, although names are matched exactly (byte for byte in UTF-8)."""

    def init(self, program: Any, method: Any) -> Any:
        if isinstance(method, str):
            method = unicodedata.normalize("NFC", method)
        return REFERENCE.init(program, method)


class ConflictCheckedOnlyAtLower(Forwarding):
    """Checks the export-time placement against the runtime skip-copy option in ``lower`` only: a method
    named in the option *after* it was lowered with ``skip_d2h_for_method_outputs=False`` initialises
    without the conflict error (export time silently wins)."""

    def init(self, program: Any, method: Any) -> Any:
        from reference_impl.runtime import init
        from reference_impl.runtime.options import STORE, OptionStore

        handle = init(program, method, options=OptionStore())
        handle.options = STORE
        return handle


class StoresTheOptionTrimmed(Forwarding):
    """Stores the skip-copy option with surrounding whitespace and empty items removed ("normalised"):
    ``get_option`` returns another string than the one set (the round trip is broken)."""

    def set_option(self, key: Any, value: Any) -> None:
        if isinstance(value, str):
            value = ",".join(p.strip() for p in value.split(",") if p.strip())
        REFERENCE.set_option(key, value)


# ============================================================================================= lower


class FalsyPlacementIsFalse(Forwarding):
    """Reads a falsy placement value (``None``, ``0``, ``""``, ``{}``) as ``False`` instead of rejecting a
    non-bool: a caller's ``None`` ("not set") or ``0`` silently means "copy"."""

    def lower(self, methods: Any, *, device: str, options: Mapping[str, object] | None = None) -> bytes:
        cleaned = dict(options or {})
        for key in (SKIP_H2D, SKIP_D2H):
            if key in cleaned and not cleaned[key] and not isinstance(cleaned[key], bool):
                cleaned[key] = False
        return REFERENCE.lower(methods, device=device, options=cleaned)


class DropsFalseEntries(Forwarding):
    """Drops placement entries whose value is ``False`` before validating ("False is the default anyway"):
    a misspelt or unknown method name carrying ``False`` is never reported."""

    def lower(self, methods: Any, *, device: str, options: Mapping[str, object] | None = None) -> bytes:
        cleaned = dict(options or {})
        for key in (SKIP_H2D, SKIP_D2H):
            value = cleaned.get(key)
            if isinstance(value, Mapping):
                cleaned[key] = {m: v for m, v in value.items() if v is not False}
        return REFERENCE.lower(methods, device=device, options=cleaned)


class ValidatesPlacementAfterCompiling(Forwarding):
    """Compiles every method first and validates the placement options afterwards: a bad placement is
    reported only after minutes of compiling, and not at all when the compile itself fails."""

    def lower(self, methods: Any, *, device: str, options: Mapping[str, object] | None = None) -> bytes:
        REFERENCE.lower(methods, device=device)
        return REFERENCE.lower(methods, device=device, options=options)


class LeaksItsLockOnFailure(Forwarding):
    """Guards ``lower`` with a process-wide busy flag that it clears only when lowering succeeds: after one
    failed ``lower``, every later one is refused as "already lowering"."""

    _busy: ClassVar[list[bool]] = [False]

    def lower(self, methods: Any, *, device: str, options: Mapping[str, object] | None = None) -> bytes:
        if self._busy[0]:
            raise RuntimeError("lower: another lowering is in progress in this process")
        self._busy[0] = True
        program = REFERENCE.lower(methods, device=device, **({"options": options} if options else {}))
        self._busy[0] = False
        return program


class ReturnsAProgramPath(Forwarding):
    """Writes the program to a temporary file and returns its path ("programs are large"), where the
    protocol returns the program's bytes; its ``init`` takes either."""

    def lower(self, methods: Any, *, device: str, options: Mapping[str, object] | None = None) -> Any:
        import tempfile

        data = REFERENCE.lower(methods, device=device, **({"options": options} if options else {}))
        with tempfile.NamedTemporaryFile(suffix=".program", delete=False) as out:
            out.write(data)
        return out.name

    def init(self, program: Any, method: Any) -> Any:
        if isinstance(program, str) and program.endswith(".program"):
            with open(program, "rb") as f:
                program = f.read()
        return REFERENCE.init(program, method)


class CachesByStateDict(Forwarding):
    """Caches programs by the modules' classes, input shapes and ``state_dict`` bytes: a changed
    non-persistent buffer, plain attribute or ``Dim`` bound is served the earlier program."""

    _programs: ClassVar[dict[str, bytes]] = {}

    def lower(self, methods: Any, *, device: str, options: Mapping[str, object] | None = None) -> bytes:
        key = self._key(methods, device, options)
        if key not in self._programs:
            extra = {"options": options} if options else {}
            self._programs[key] = REFERENCE.lower(methods, device=device, **extra)
        return self._programs[key]

    def _key(self, methods: Any, device: str, options: Any) -> str:
        import hashlib

        digest = hashlib.sha256(f"{device}{sorted((options or {}).items())!r}".encode())
        for name, entry in sorted(methods.items()):
            module, inputs = entry[0], entry[1]
            digest.update(name.encode())
            digest.update(".".join(type(m).__name__ for m in module.modules()).encode())
            digest.update(repr([tuple(t.shape) for t in inputs]).encode())
            if self.weights:
                for pname, tensor in sorted(module.state_dict().items()):
                    digest.update(pname.encode())
                    digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    weights = True


class CachesByClassAndShapes(CachesByStateDict):
    """Caches programs by the modules' classes and input shapes only: a model with other weights (a
    fine-tuned checkpoint of the same architecture) is served the first program."""

    weights = False


# ============================================================================================ declared
# ``breaks``: proven by the self-tests (tests/conformance/test_broken_chapter_backends.py), one or more per
# rule. ``finds``: the other slips of the examples; ``python -m tests.differential_power`` runs them
# too (every chapter run costs seconds of a 2-core CI machine; one proof per rule is what the self-tests
# need).


@dataclass(frozen=True)
class Finds:
    """A slip a generated chapter must find: running ``chapter`` with ``select`` fails with ``rules``."""

    rules: tuple[str, ...]
    chapter: str
    select: tuple[str, ...] = ()


def planted(backend: Forwarding, finds: Finds) -> Forwarding:
    """``backend`` with a ``Finds`` declaration instead of ``Breaks``: measured, not self-tested."""
    backend.finds = finds  # type: ignore[attr-defined]
    return backend


READS_INPUTS_AS_CONTIGUOUS = ReadsInputsAsContiguous(
    "reads-inputs-as-contiguous", Breaks(("differential/values",), DIFFERENTIAL, PROTOCOL_CPU)
)
IGNORES_PROVIDED_OUTPUTS = IgnoresProvidedOutputs(
    "ignores-provided-outputs", Breaks(("differential/outputs-filled",), DIFFERENTIAL, PROTOCOL_CPU)
)
RETURNS_ITS_OUTPUT_ARENA = ReturnsItsOutputArena(
    "returns-its-output-arena", Breaks(("differential/outputs-owned",), DIFFERENTIAL, PROTOCOL_CPU)
)
SHARES_SCRATCH_ACROSS_THREADS = SharesScratchAcrossThreads(
    "shares-scratch-across-threads", Breaks(("differential/threads",), DIFFERENTIAL, PROTOCOL_CPU)
)
STREAMS_THREADS = "conformance/streams_threads/test_streams_threads.py"
#: The same two slips, found by the streams & threads chapter's thread cases (item: races found reliably).
SHARES_SCRATCH_ACROSS_THREADS_STREAMS = SharesScratchAcrossThreads(
    "shares-scratch-across-threads",
    Breaks(
        ("streams_threads/threads",), STREAMS_THREADS, ("-k", "threads_match_serial and one-handle and cpu")
    ),
)
SHARES_OUTPUT_ARENA_ACROSS_HANDLES = SharesOutputArenaAcrossHandles(
    "shares-output-arena-across-handles",
    Breaks(
        ("streams_threads/threads",), STREAMS_THREADS, ("-k", "threads_match_serial and own-handles and cpu")
    ),
)
STRIPS_METHOD_NAMES = StripsMethodNames(
    "strips-method-names",
    # Accepts " forward" as "forward" (missing error); a program lowered with the name " forward" then has
    # no method " forward" (spurious error): the CI examples draw both.
    Breaks(
        ("differential/missing-error", "differential/spurious-error"),
        DIFFERENTIAL,
        ("-k", "(protocol_calls or placement_calls) and cpu", "--generated-no-shrink"),
    ),
)
VALIDATES_PLACEMENT_AFTER_COMPILING = ValidatesPlacementAfterCompiling(
    "validates-placement-after-compiling",
    Breaks(("differential/error-argument",), DIFFERENTIAL, PROTOCOL_CPU),
)
LEAKS_ITS_LOCK_ON_FAILURE = LeaksItsLockOnFailure(
    "leaks-its-lock-on-failure",
    # A valid lower refused after a failed one (spurious error); the next shard, in the same process, finds
    # even a plain model refused with a RuntimeError where a backend that cannot lower raises ValueError.
    Breaks(("differential/spurious-error", "differential/error-class"), DIFFERENTIAL, PROTOCOL_CPU),
)
LEAKS_ITS_LOCK_ON_FAILURE_METAMORPHIC = LeaksItsLockOnFailure(
    "leaks-its-lock-on-failure",
    Breaks(("metamorphic/after-failure",), METAMORPHIC, ("-k", "failed_lower and cpu")),
)
CACHES_BY_CLASS_AND_SHAPES = CachesByClassAndShapes(
    "caches-by-class-and-shapes",
    Breaks(("metamorphic/variant",), METAMORPHIC, ("-k", "variant and cpu-weight")),
)
WRITES_RESULTS_INTO_INPUTS = WritesResultsIntoInputs(
    "writes-results-into-inputs", Breaks(("differential/inputs-untouched",), DIFFERENTIAL, PROTOCOL_CPU)
)
RETURNS_A_PROGRAM_PATH = ReturnsAProgramPath(
    "returns-a-program-path", Breaks(("differential/program",), DIFFERENTIAL, PROTOCOL_CPU)
)
STORES_THE_OPTION_TRIMMED = StoresTheOptionTrimmed(
    "stores-the-option-trimmed",
    # A spaced list for the real key comes late in the CI examples (found at three times the budget).
    Breaks(("differential/option-read-back",), DIFFERENTIAL, (*PROTOCOL_CPU, "--generated-examples=3")),
)
KEEPS_OUTPUTS_ON_DEVICE_WHEN_LISTED = KeepsOutputsOnDeviceWhenListed(
    "keeps-outputs-on-device-when-listed",
    # A spaced list that names the decoder, then its execute: not among the CUDA machine's CI examples since
    # the machine changed (it passed them with and without stream holds on one H200); three times the
    # budget found it (examples/runs/2026-11-29-stream-holds-H200/).
    Breaks(
        ("differential/output-device",),
        DIFFERENTIAL,
        (*PROTOCOL_CUDA, "--generated-examples=3"),
        cuda=True,
    ),
)
# Slips a rule-specific chapter names, proving differential rules that no new slip above breaks.
LOAD_ERRORS_AS_RUNTIME_ERROR_DIFFERENTIAL = LoadErrorsAsRuntimeError(
    "load-errors-as-runtime-error", Breaks(("differential/error-class",), DIFFERENTIAL, PROTOCOL_CPU)
)
COUNTS_ARGUMENT_BYTES_DIFFERENTIAL = CountsArgumentBytes(
    "counts-argument-bytes", Breaks(("differential/counters",), DIFFERENTIAL, PROTOCOL_CPU)
)
WRITES_OUTPUTS_BEFORE_CHECKING_DIFFERENTIAL = WritesOutputsBeforeChecking(
    "writes-outputs-before-checking",
    # The contract monitor names the write first; the machine's own rule follows in the message.
    Breaks(
        ("contract/outputs-untouched", "differential/outputs-untouched"),
        DIFFERENTIAL,
        ("-k", "every_argument and cpu"),
    ),
)

# Measured only (tests/differential_power.py).
IGNORES_STORAGE_OFFSET = planted(
    IgnoresStorageOffset("ignores-storage-offset", None),  # type: ignore[arg-type]
    Finds(("differential/values",), DIFFERENTIAL, PROTOCOL_CPU),
)
CLAMPS_DYNAMIC_SIZES = planted(
    ClampsDynamicSizes("clamps-dynamic-sizes", None),  # type: ignore[arg-type]
    Finds(("differential/missing-error",), DIFFERENTIAL, PROTOCOL_CPU),
)
NORMALIZES_METHOD_NAMES = planted(
    NormalizesMethodNames("normalizes-method-names", None),  # type: ignore[arg-type]
    Finds(("differential/missing-error",), DIFFERENTIAL, PROTOCOL_CPU),
)
CONFLICT_CHECKED_ONLY_AT_LOWER = planted(
    ConflictCheckedOnlyAtLower("conflict-checked-only-at-lower", None),  # type: ignore[arg-type]
    Finds(("differential/missing-error",), DIFFERENTIAL, PROTOCOL_CPU),
)
FALSY_PLACEMENT_IS_FALSE = planted(
    FalsyPlacementIsFalse("falsy-placement-is-false", None),  # type: ignore[arg-type]
    Finds(("differential/missing-error",), DIFFERENTIAL, PROTOCOL_CPU),
)
DROPS_FALSE_ENTRIES = planted(
    DropsFalseEntries("drops-false-entries", None),  # type: ignore[arg-type]
    Finds(("differential/missing-error",), DIFFERENTIAL, PROTOCOL_CPU),
)
CACHES_BY_STATE_DICT = planted(
    CachesByStateDict("caches-by-state-dict", None),  # type: ignore[arg-type]
    Finds(("metamorphic/variant",), METAMORPHIC, ("-k", "variant and cpu and (buffer or attribute or dim)")),
)
