"""One broken backend (or more) per chapter: each wraps the reference backend and slips the way a real
backend does, and declares (``breaks``) the rules a chapter must fail it on.

``tests/conformance/test_broken_chapter_backends.py`` runs each through its chapter, as a user would, and
holds the declaration true: the run fails, every failure names a declared rule, every declared rule is named;
the reference passes the same selection. ``python -m tests.rule_coverage`` lists them per rule.
"""

from __future__ import annotations

import copy
import re
import threading
import time
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from reference_impl import BACKEND as REFERENCE
from reference_impl.lowering.fallback_kernels import UnsupportedKernelsError
from tests.rule_coverage import Breaks

MM_OUT = "conformance/mm_out/test_mm_out.py"
LOWERING = "conformance/lowering/test_lowering.py"
PROGRAM_FORMAT = "conformance/program_format/test_program_format.py"
RUNTIME_OPTIONS = "conformance/runtime_options/test_runtime_options.py"
MULTI_METHOD = "conformance/multi_method/test_multi_method.py"
STREAMS_THREADS = "conformance/streams_threads/test_streams_threads.py"
BAD_INPUTS = "conformance/bad_inputs/test_bad_inputs.py"


class Forwarding:
    """Forwards every protocol part to the reference; subclasses override one behaviour."""

    version = "broken"
    lowering_devices = REFERENCE.lowering_devices
    lower_options = REFERENCE.lower_options
    breaks: Breaks

    def __init__(self, name: str, breaks: Breaks) -> None:
        self.name = name
        self.breaks = breaks

    def __getattr__(self, attr: str) -> Any:
        return getattr(REFERENCE, attr)


# ================================================================================================ mm_out


class RelaysAtenErrors(Forwarding):
    """Calls ``torch.mm(self, mat2, out=out)`` and leaves checking to ATen: a bad call is a RuntimeError
    (not the protocol's ValueError), a wrong-shaped ``out`` is silently resized, CPU tensors just work."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        torch.mm(self_, mat2, out=out)


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its float32 mantissa cut to TF32's 10 bits, as tensor cores read it."""
    return (t.contiguous().view(torch.int32) & -(1 << 13)).view(torch.float32)


class UsesTf32(Forwarding):
    """Turns on TF32 tensor-core math for float32 "because it is faster" (CUBLAS_TF32_TENSOR_OP_MATH)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in (out, self_, mat2)):
            self_, mat2 = _tf32(self_), _tf32(mat2)
        REFERENCE.mm_out(out, self_, mat2)


class OwnStream(Forwarding):
    """Runs every GEMM on a stream of its own, created at first use, with no ordering against the caller's
    current stream: it reads inputs the caller has not finished writing (upstream #21727's shape)."""

    _streams: ClassVar[dict[int, torch.cuda.Stream]] = {}

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        device = out.device if isinstance(out, torch.Tensor) and out.is_cuda else None
        if device is None:
            REFERENCE.mm_out(out, self_, mat2)
            return
        if device.index not in self._streams:
            self._streams[device.index] = torch.cuda.Stream(device)
        stream = self._streams[device.index]
        with torch.cuda.stream(stream):
            REFERENCE.mm_out(out, self_, mat2)


class AssumesRowMajor(Forwarding):
    """Hands cuBLAS ``mat2``'s storage as if it were row-major, whatever its strides: a transposed
    (column-major) ``mat2`` multiplies the wrong elements, with no error (breaks mm_out/values and
    mm_out/exact-integers for every layout but row-major)."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if isinstance(mat2, torch.Tensor) and mat2.dim() == 2 and mat2.is_cuda and not mat2.is_contiguous():
            mat2 = torch.as_strided(mat2, mat2.shape, (mat2.shape[1], 1), mat2.storage_offset())
        REFERENCE.mm_out(out, self_, mat2)


class ReturnsEarlyOnEmptyK(Forwarding):
    """Returns at once when K is 0 ("nothing to multiply"), leaving ``out`` as it was instead of zeros."""

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        if isinstance(self_, torch.Tensor) and self_.dim() == 2 and self_.shape[1] == 0:
            return
        REFERENCE.mm_out(out, self_, mat2)


#: The contract errors of the mm_out chapter (``test_bad_input_is_rejected_and_out_untouched``).
MM_OUT_CONTRACT = (
    "none-out", "none-self", "none-mat2", "rank-self-3d", "rank-mat2-1d", "rank-out-3d", "inner-dimension",
    "out-shape", "out-shape-transposed", "out-not-contiguous", "out-strided", "dtype-mismatch-mat2",
    "dtype-mismatch-out", "unsupported-dtype-float64", "unsupported-dtype-int32", "cpu-out", "cpu-self",
    "cpu-mat2",
)  # fmt: skip

RELAYS_ATEN_ERRORS = RelaysAtenErrors(
    "relays-aten-errors",
    Breaks(tuple(f"mm_out/{r}" for r in MM_OUT_CONTRACT), MM_OUT, ("-k", "bad_input"), cuda=True),
)
ASSUMES_ROW_MAJOR = AssumesRowMajor(
    "assumes-row-major",
    Breaks(
        ("mm_out/values", "mm_out/exact-integers"),
        MM_OUT,
        ("-k", "(values_match_float64_reference or small_integers_are_exact) and float32 and row-col"),
        cuda=True,
    ),
)
USES_TF32 = UsesTf32("uses-tf32", Breaks(("mm_out/no-tf32",), MM_OUT, ("-k", "does_not_use_tf32"), cuda=True))
OWN_STREAM = OwnStream(
    "own-stream", Breaks(("mm_out/current-stream",), MM_OUT, ("-k", "callers_current_stream"), cuda=True)
)
RETURNS_EARLY_ON_EMPTY_K = ReturnsEarlyOnEmptyK(
    "returns-early-on-empty-k",
    Breaks(("mm_out/zero-size",), MM_OUT, ("-k", "zero_sizes and (K0 or all0)"), cuda=True),
)

# ============================================================================================== lowering

_MISSING_KERNELS: set[str] = set()  # the bug itself: module-level, never cleared


class UpstreamFallbackKernels(Forwarding):
    """Upstream's preprocess before the fix (SPEC §1a): missing kernels go into one module-level set that
    is never cleared, and the error is a RuntimeError. One refused method poisons every later ``lower``."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        name = next(iter(methods), "?")
        try:
            if not _MISSING_KERNELS:
                return REFERENCE.lower(methods, device=device, options=options)
        except UnsupportedKernelsError as exc:
            _MISSING_KERNELS.update(exc.kernels)
        missing = sorted(_MISSING_KERNELS)
        raise RuntimeError(f"Method {name} missing fallback kernels ({len(missing)} total): {missing}")


class _Bfloat16Inside(torch.nn.Module):
    """``inner`` in bfloat16, with float32 at its edges: the caller sees float32 tensors either way."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = copy.deepcopy(inner).to(torch.bfloat16)

    def forward(self, *args: Any) -> Any:
        cast = [a.to(torch.bfloat16) if torch.is_tensor(a) and a.dtype == torch.float32 else a for a in args]
        out = self.inner(*cast)
        if torch.is_tensor(out):
            return out.float()
        return tuple(o.float() if torch.is_tensor(o) and o.is_floating_point() else o for o in out)


class ComputesFloat32InBfloat16(Forwarding):
    """Lowers float32 models in bfloat16 behind float32 inputs and outputs ("halves the weights' memory"):
    every dtype and shape the caller sees is right, the values carry bfloat16's 3 significant digits
    (breaks lowering/zoo)."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        def shrunk(entry: tuple) -> tuple:
            module, inputs, *rest = entry
            floats = [p.dtype for p in module.parameters()] + [t.dtype for t in inputs if torch.is_tensor(t)]
            if torch.float32 not in floats:
                return entry
            return (_Bfloat16Inside(module), inputs, *rest)

        changed = {name: shrunk(entry) for name, entry in methods.items()}
        return REFERENCE.lower(changed, device=device, options=options)


class CrashesOnUnknownOps(Forwarding):
    """Looks every graph op up in its kernel table without a guard: a model using an op it has no entry for
    (here attention) crashes ``lower`` with a ``KeyError`` instead of the protocol's ``ValueError`` naming
    the op (breaks lowering/zoo-lowers)."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        for entry in methods.values():
            module, inputs = entry[0], entry[1]
            graph = torch.export.export(module, tuple(inputs)).graph
            for node in graph.nodes:
                if node.op == "call_function" and "scaled_dot_product" in str(node.target):
                    raise KeyError(str(node.target))  # the unguarded table lookup
        return REFERENCE.lower(methods, device=device, options=options)


class ShipsProxyExecutorCalls(Forwarding):
    """Leaves a method's missing kernels to the proxy executor instead of refusing the method: ``lower``
    returns a program for an op that has no kernel anywhere, and the failure waits for the first execute
    (breaks lowering/unsupported-kernels)."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        from reference_impl.lowering.fallback_kernels import provided_by_torch_runtime
        from reference_impl.lowering.lower import lower_program

        try:
            return REFERENCE.lower(methods, device=device, options=options)
        except UnsupportedKernelsError as exc:
            everything = provided_by_torch_runtime(device.split(":")[0]) | set(exc.kernels)
            pairs = {name: (entry[0], entry[1]) for name, entry in methods.items()}
            return lower_program(pairs, device=device, provided_kernels=everything)


UPSTREAM_FALLBACK_KERNELS = UpstreamFallbackKernels(
    "upstream-fallback-kernels",
    Breaks(
        ("lowering/failure-not-sticky", "lowering/unsupported-is-valueerror"),
        LOWERING,
        ("-k", "unsupported_kernels and cpu"),
    ),
)
SHIPS_PROXY_EXECUTOR_CALLS = ShipsProxyExecutorCalls(
    "ships-proxy-executor-calls",
    Breaks(("lowering/unsupported-kernels",), LOWERING, ("-k", "unsupported_kernels and cpu")),
)
COMPUTES_FLOAT32_IN_BFLOAT16 = ComputesFloat32InBfloat16(
    "computes-float32-in-bfloat16",
    Breaks(
        ("lowering/zoo",), LOWERING, ("-k", "zoo_model_lowers_runs_and_matches_eager and float32-linear-cpu")
    ),
)
CRASHES_ON_UNKNOWN_OPS = CrashesOnUnknownOps(
    "crashes-on-unknown-ops",
    Breaks(("lowering/zoo-lowers",), LOWERING, ("-k", "zoo_model_lowers and not eager and float32-sdpa-cpu")),
)

# ======================================================================================== program format


def _folded(name: str) -> str:
    """Case and accents dropped: "Décodeur" -> "decodeur"."""
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().casefold()


class FoldsMethodNames(Forwarding):
    """Looks a method up "forgivingly": when no name matches exactly, it takes the one equal after case
    folding and accent stripping, so ``MUL_ADD`` loads ``mul_add`` and ``decodeur`` loads ``décodeur``."""

    _methods: ClassVar[dict[bytes, list[str]]] = {}

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        program = REFERENCE.lower(methods, device=device, options=options)
        self._methods[program] = list(methods)
        return program

    def init(self, program: bytes, method: str) -> object:
        try:
            return REFERENCE.init(program, method)
        except ValueError:
            known = self._methods.get(program, []) if isinstance(program, bytes) else []
            close = [m for m in known if isinstance(method, str) and _folded(m) == _folded(method)]
            if not close:
                raise
            return REFERENCE.init(program, close[0])


FOLDS_METHOD_NAMES = FoldsMethodNames(
    "folds-method-names",
    Breaks(
        ("program_format/method-name-case", "program_format/non-ascii-name"),
        PROGRAM_FORMAT,
        ("-k", "method_names_match_exactly or non_ascii"),
    ),
)

# ======================================================================================= runtime options

_MAX_VALUE = 255


class TruncatesLongValues(Forwarding):
    """Copies the value into a 256-byte C buffer, as upstream does: a longer value is silently cut."""

    def set_option(self, key: str, value: object) -> None:
        REFERENCE.set_option(key, value[:_MAX_VALUE] if isinstance(value, str) else value)


class IgnoresUnknownKeys(Forwarding):
    """Ignores keys it does not know (and reads them as ""): a misspelt key is silently a no-op."""

    def set_option(self, key: str, value: object) -> None:
        if key == "skip_copy_output_to_cpu_for_method" or not isinstance(key, str):
            REFERENCE.set_option(key, value)

    def get_option(self, key: str) -> object:
        return REFERENCE.get_option(key) if key == "skip_copy_output_to_cpu_for_method" else ""


class CStringOptions(Forwarding):
    """Passes key and value through ``char*`` (ctypes): each ends at its first NUL, silently."""

    def set_option(self, key: str, value: object) -> None:
        key = key.split("\0")[0] if isinstance(key, str) else key
        REFERENCE.set_option(key, value.split("\0")[0] if isinstance(value, str) else value)


_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


class SanitisesControlCharacters(Forwarding):
    """ "Sanitises" values by deleting control characters (NUL included) instead of rejecting them."""

    def set_option(self, key: str, value: object) -> None:
        REFERENCE.set_option(key, _CONTROL.sub("", value) if isinstance(value, str) else value)


class IgnoresSkipCopyOption(Forwarding):
    """Upstream since June 2026: the runtime option is accepted and read back, but a no-op: every output is
    copied to the host."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        if handle.placement.outputs_on_device is not None:  # fixed at export time: not the option's business
            return results
        return [t.cpu() if t.is_cuda else t for t in results]


TRUNCATES_LONG_VALUES = TruncatesLongValues(
    "truncates-long-values",
    Breaks(("runtime_options/value-length",), RUNTIME_OPTIONS, ("-k", "value_over_255")),
)
IGNORES_UNKNOWN_KEYS = IgnoresUnknownKeys(
    "ignores-unknown-keys", Breaks(("runtime_options/unknown-key",), RUNTIME_OPTIONS, ("-k", "unknown_key"))
)
C_STRING_OPTIONS = CStringOptions(
    "c-string-options", Breaks(("runtime_options/nul-character",), RUNTIME_OPTIONS, ("-k", "nul_in"))
)
SANITISES_CONTROL_CHARACTERS = SanitisesControlCharacters(
    "sanitises-control-characters",
    Breaks(
        ("runtime_options/nul-character", "runtime_options/control-characters"),
        RUNTIME_OPTIONS,
        ("-k", "nul_in or control_characters"),
    ),
)
IGNORES_SKIP_COPY_OPTION = IgnoresSkipCopyOption(
    "ignores-skip-copy-option",
    Breaks(
        ("runtime_options/output-device",),
        RUNTIME_OPTIONS,
        ("-k", "skip_copy_matrix and not cpu_target and float32 and asr-encoder"),
        cuda=True,
    ),
)

# ========================================================================================== multi-method


class StaleKeptOutputsOnTheCpu(Forwarding):
    """Keeps a method's outputs in buffers of its own when the skip-copy option names it, and refreshes them
    only on the device path: a program lowered for the CPU hands back the first execute's outputs again
    and again (shapes unchanged), so a greedy loop repeats its first step's tokens (breaks
    multi_method/skip-invariant: setting the option changed what a CPU target computes)."""

    _kept: ClassVar[dict[int, list[torch.Tensor]]] = {}

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        from reference_impl.runtime.options import skip_copy_methods

        result = REFERENCE.execute(handle, inputs, outputs)
        if handle.device.type != "cpu" or handle.method_name not in skip_copy_methods():
            return result
        kept = self._kept.get(id(handle))
        if kept is None or [t.shape for t in kept] != [t.shape for t in result]:
            self._kept[id(handle)] = kept = [t.clone() for t in result]
        return kept


class HalvesOutputCopies(Forwarding):
    """Hands float32 outputs back through bfloat16 staging buffers ("half the bytes to copy") and widens
    them again: dtypes and shapes are right, the values carry bfloat16's 3 significant digits (breaks
    runtime_options/values, which holds every output to float64 eager whatever the option says)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        result = REFERENCE.execute(handle, inputs, outputs)
        return [t.to(torch.bfloat16).float() if t.dtype == torch.float32 else t for t in result]


class StaleInputStaging(Forwarding):
    """Keeps one staging copy per input slot and refreshes it only when the shape or dtype changes: the
    decode loop's next token (same shape, new value) never reaches the method."""

    _staged: ClassVar[dict[tuple[int, int], torch.Tensor]] = {}

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        staged = list(inputs)
        for index, tensor in enumerate(staged):
            if not isinstance(tensor, torch.Tensor):
                continue
            old = self._staged.get((id(handle), index))
            if old is not None and old.shape == tensor.shape and old.dtype == tensor.dtype:
                staged[index] = old
            else:
                self._staged[(id(handle), index)] = tensor.clone()
        return REFERENCE.execute(handle, staged, outputs)


STALE_KEPT_OUTPUTS_ON_THE_CPU = StaleKeptOutputsOnTheCpu(
    "stale-kept-outputs-on-the-cpu",
    Breaks(
        ("multi_method/skip-invariant",),
        "conformance/multi_method/test_multi_method.py",
        ("-k", "pipeline_tokens_match_eager and llm-cpu-float32"),
    ),
)
HALVES_OUTPUT_COPIES = HalvesOutputCopies(
    "halves-output-copies",
    Breaks(
        ("runtime_options/values",),
        RUNTIME_OPTIONS,
        ("-k", "skip_copy_matrix_cpu_target and float32-llm-unset"),
    ),
)
STALE_INPUT_STAGING = StaleInputStaging(
    "stale-input-staging",
    Breaks(("multi_method/tokens",), MULTI_METHOD, ("-k", "pipeline_tokens and llm-cpu-float32 and not hf_")),
)

# ========================================================================================= streams/threads


class NotReentrant(Forwarding):
    """Guards a handle with a busy flag instead of a lock: a second thread executing the same handle gets
    an error instead of waiting its turn."""

    _busy: ClassVar[set[int]] = set()
    _lock = threading.Lock()

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        with self._lock:
            if id(handle) in self._busy:
                raise RuntimeError("handle is busy: execute is already running on it in another thread")
            self._busy.add(id(handle))
        try:
            time.sleep(0.002)  # the handle's setup work, long enough for threads to overlap
            return REFERENCE.execute(handle, inputs, outputs)
        finally:
            with self._lock:
                self._busy.discard(id(handle))


NOT_REENTRANT = NotReentrant(
    "not-reentrant",
    Breaks(
        ("streams_threads/threads",), STREAMS_THREADS, ("-k", "threads_match_serial and one-handle and cpu")
    ),
)

# ============================================================================================ bad inputs


class CastsInputs(Forwarding):
    """Casts inputs of the wrong dtype to the method's dtype instead of rejecting them."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        specs = handle.io.inputs if getattr(handle, "io", None) is not None else ()
        if isinstance(inputs, (list, tuple)) and len(inputs) == len(specs):
            inputs = [
                t.to(spec.dtype) if isinstance(t, torch.Tensor) and t.dtype != spec.dtype else t
                for t, spec in zip(inputs, specs, strict=True)
            ]
        return REFERENCE.execute(handle, inputs, outputs)


class WritesOutputsBeforeChecking(Forwarding):
    """Computes, writes each caller-provided output it can (``copy_`` casts), and only then validates the
    outputs: a rejected call has already overwritten the caller's tensors."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        if isinstance(outputs, (list, tuple)):
            results = REFERENCE.execute(handle, inputs)
            for provided, result in zip(outputs, results, strict=False):
                if isinstance(provided, torch.Tensor) and provided.shape == result.shape:
                    provided.copy_(result)
        return REFERENCE.execute(handle, inputs, outputs)


class DestroyTwiceIsSilent(Forwarding):
    """Makes ``destroy`` "idempotent": a second destroy of a handle returns quietly."""

    def destroy(self, handle: Any) -> None:
        if not getattr(handle, "destroyed", False):
            REFERENCE.destroy(handle)


CASTS_INPUTS = CastsInputs(
    "casts-inputs",
    Breaks(
        ("bad_inputs/wrong-dtype-float64", "bad_inputs/wrong-dtype-float16", "bad_inputs/wrong-dtype-int64"),
        BAD_INPUTS,
        ("-k", "wrong-dtype and cpu-program"),
    ),
)
WRITES_OUTPUTS_BEFORE_CHECKING = WritesOutputsBeforeChecking(
    "writes-outputs-before-checking",
    Breaks(
        # The contract monitor names the write first; the chapter's own rule follows in the message.
        ("contract/outputs-untouched", "bad_inputs/outputs-one-more", "bad_inputs/outputs-wrong-dtype"),
        BAD_INPUTS,
        ("-k", "bad_outputs and cpu-program"),
    ),
)
DESTROY_TWICE_IS_SILENT = DestroyTwiceIsSilent(
    "destroy-twice-is-silent",
    Breaks(("bad_inputs/destroy-twice",), BAD_INPUTS, ("-k", "destroyed_handle and destroy-cpu-program")),
)
