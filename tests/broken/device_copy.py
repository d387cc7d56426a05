"""Broken backends for the copy rules the device needs to show: where outputs go, what crosses PCIe, what
the counters say, and when a runtime option takes effect. Each wraps the reference and slips the way a
real runtime does; every failing case needs CUDA (on CPU the self-tests skip them with the reason), so
``.ci/gpu/followup.sh`` runs them on the GPU machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from reference_impl import BACKEND as REFERENCE
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP
from tests.broken.chapter import MULTI_METHOD, RUNTIME_OPTIONS, Forwarding, HalvesOutputCopies
from tests.broken.option import ValidatesMethodNames
from tests.broken.placement import PLACEMENT, CountsArgumentBytes, StagesThroughTheHost
from tests.rule_coverage import Breaks


class MemoisesHostOutputs(Forwarding):
    """Caches each method's host outputs by the identity of its input tensors and hands the cached copies
    back when the same tensors come again: a repeated execute skips the device-to-host copy. A caller who
    refills an input in place then gets the previous results (breaks ``*/d2h-copy``: outputs came back to
    the host, yet nothing was copied)."""

    _cache: ClassVar[dict[tuple[int, tuple[int, ...]], list[torch.Tensor]]] = {}

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        key = (id(handle), tuple(t.data_ptr() for t in inputs))
        cached = self._cache.get(key)
        if cached is not None and outputs is None:
            return cached
        result = REFERENCE.execute(handle, inputs, outputs)
        if all(t.device.type == "cpu" for t in result):
            self._cache[key] = result
        return result


class CountsElements(Forwarding):
    """``execute_stats`` counts the elements copied, not the bytes (``numel`` where ``nbytes`` was meant):
    right for one-byte dtypes, short by the element size for every other (breaks
    ``runtime_options/h2d-bytes``: the float32 and int64 inputs of the LLM's methods)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        result = REFERENCE.execute(handle, inputs, outputs)
        stats = dict(handle._stats)
        stats["h2d_bytes"] = sum(t.numel() for t in inputs if t.device.type == "cpu")
        stats["d2h_bytes"] = sum(t.numel() for t in result if t.device.type == "cpu")
        handle._stats = stats
        return result


class _OptionDuringExecute(Forwarding):
    """The reference's execute with the skip-copy option replaced by :meth:`effective` (then restored)."""

    def effective(self, handle: Any, value: str) -> str:
        raise NotImplementedError

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        value = str(REFERENCE.get_option(SKIP))
        REFERENCE.set_option(SKIP, self.effective(handle, value))
        try:
            return REFERENCE.execute(handle, inputs, outputs)
        finally:
            REFERENCE.set_option(SKIP, value)


class HonoursTheFirstNameOnly(_OptionDuringExecute):
    """Reads the skip-copy option as one method name, up to the first comma, though it stores and returns
    the whole list: ``"prefill,decode"`` keeps prefill's outputs on the GPU and copies decode's KV caches
    out every step (breaks ``multi_method/kv-cache-on-device`` and ``runtime_options/list-parsing``)."""

    def effective(self, handle: Any, value: str) -> str:
        return value.split(",")[0]


class ReadsTheOptionAtInit(_OptionDuringExecute):
    """Takes the skip-copy option's value when a handle is created and keeps it for the handle's life: a
    change with handles alive never reaches them (breaks ``runtime_options/next-execute``)."""

    _at_init: ClassVar[dict[int, str]] = {}

    def init(self, program: bytes, method: str) -> object:
        handle = REFERENCE.init(program, method)
        self._at_init[id(handle)] = str(REFERENCE.get_option(SKIP))
        return handle

    def effective(self, handle: Any, value: str) -> str:
        return self._at_init.get(id(handle), value)


class RecyclesKeptOutputsOnOptionChange(Forwarding):
    """Serves kept (device) outputs from a pool it recycles whenever the skip-copy option changes, to give
    the memory back: tensors it already returned are overwritten (breaks ``runtime_options/not-retroactive``:
    outputs the caller holds changed when the option did)."""

    _pool: ClassVar[list[torch.Tensor]] = []

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        result = REFERENCE.execute(handle, inputs, outputs)
        self._pool.extend(t for t in result if t.device.type == "cuda")
        return result

    def set_option(self, key: str, value: object) -> None:
        REFERENCE.set_option(key, value)
        if key == SKIP:
            for tensor in self._pool:
                tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor.fill_(-1)
            self._pool.clear()


# ========================================================================================= declarations

MEMOISES_HOST_OUTPUTS_PLACED = MemoisesHostOutputs(
    "memoises-host-outputs",
    Breaks(
        ("device_placement/d2h-copy",),
        PLACEMENT,
        ("-k", "placement_matrix and float32-llm-explicit-host"),
        cuda=True,
    ),
)
MEMOISES_HOST_OUTPUTS_OPTION = MemoisesHostOutputs(
    "memoises-host-outputs",
    Breaks(
        ("runtime_options/d2h-copy",),
        RUNTIME_OPTIONS,
        ("-k", "skip_copy_matrix and not cpu_target and float32-llm-unset]"),
        cuda=True,
    ),
)
# Staging kept tensors through the host: the profiler sees the copies the counters hide.
STAGES_KEPT_OUTPUTS_PLACED = StagesThroughTheHost(
    "stages-through-the-host",
    Breaks(
        ("device_placement/no-d2h-copy",),
        PLACEMENT,
        ("-k", "placement_matrix and float32-llm-outputs-first"),
        cuda=True,
        strict_should=True,
    ),
)
STAGES_KEPT_OUTPUTS_OPTION = StagesThroughTheHost(
    "stages-through-the-host",
    Breaks(
        ("runtime_options/no-d2h-copy",),
        RUNTIME_OPTIONS,
        ("-k", "skip_copy_matrix and not cpu_target and float32-llm-both]"),
        cuda=True,
        strict_should=True,
    ),
)
STAGES_DEVICE_INPUTS_PLACED = StagesThroughTheHost(
    "stages-through-the-host",
    Breaks(
        ("device_placement/no-h2d-copy",),
        PLACEMENT,
        ("-k", "placement_matrix and float32-llm-inputs-all"),
        cuda=True,
        strict_should=True,
    ),
)
HALVES_OUTPUT_COPIES_PLACED = HalvesOutputCopies(
    "halves-output-copies",
    Breaks(
        ("device_placement/values",),
        PLACEMENT,
        ("-k", "placement_matrix and float32-llm-outputs-first"),
        cuda=True,
    ),
)
COUNTS_ARGUMENT_BYTES_DEVICE_PIPELINE = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(
        ("device_placement/pipeline",),
        PLACEMENT,
        ("-k", "pipeline_stays_on_the_device and float32-llm]"),
        cuda=True,
    ),
)
COUNTS_ARGUMENT_BYTES_DEVICE_INPUT = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(
        ("multi_method/device-input",),
        MULTI_METHOD,
        ("-k", "asr_decoder_consumes_encoder_output_on_gpu and float32-asr]"),
        cuda=True,
    ),
)
COUNTS_ELEMENTS = CountsElements(
    "counts-elements",
    Breaks(
        ("runtime_options/h2d-bytes",),
        RUNTIME_OPTIONS,
        ("-k", "skip_copy_matrix and not cpu_target and float32-llm-both]"),
        cuda=True,
    ),
)
HONOURS_THE_FIRST_NAME_ONLY_KV = HonoursTheFirstNameOnly(
    "honours-the-first-name-only",
    Breaks(
        ("multi_method/kv-cache-on-device",),
        MULTI_METHOD,
        ("-k", "llm_kv_cache_stays_on_gpu and float32-llm]"),
        cuda=True,
        strict_should=True,
    ),
)
HONOURS_THE_FIRST_NAME_ONLY_LIST = HonoursTheFirstNameOnly(
    "honours-the-first-name-only",
    Breaks(
        ("runtime_options/list-parsing",),
        RUNTIME_OPTIONS,
        ("-k", "list_parsing_selects_methods and both-spaced"),
        cuda=True,
    ),
)
READS_THE_OPTION_AT_INIT = ReadsTheOptionAtInit(
    "reads-the-option-at-init",
    Breaks(
        ("runtime_options/next-execute",),
        RUNTIME_OPTIONS,
        ("-k", "option_change_applies_to_next_execute_only"),
        cuda=True,
    ),
)
RECYCLES_KEPT_OUTPUTS = RecyclesKeptOutputsOnOptionChange(
    "recycles-kept-outputs-on-option-change",
    Breaks(
        ("runtime_options/not-retroactive",),
        RUNTIME_OPTIONS,
        ("-k", "option_change_applies_to_next_execute_only"),
        cuda=True,
    ),
)
# Refusing a method name no loaded program has: the skip-copy matrix names "forward" on purpose (CPU).
VALIDATES_METHOD_NAMES_WITH_HANDLES = ValidatesMethodNames(
    "validates-method-names",
    Breaks(
        ("runtime_options/option",),
        RUNTIME_OPTIONS,
        ("-k", "skip_copy_matrix_cpu_target and float32-llm-unknown-method"),
    ),
)
