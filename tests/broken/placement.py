"""Broken backends for the device-placement rules: each wraps the reference and slips the way a real
backend does. Used by ``tests/conformance/test_placement_broken_backends.py``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE
from reference_impl.format.placement import SKIP_D2H, SKIP_H2D
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP_COPY_OPTION
from tests.broken.chapter import Forwarding
from tests.rule_coverage import Breaks


class DropsUnknownMethods(Forwarding):
    """Upstream's ``propagate_device_config.get(name, PropagateDeviceConfig())``: a placement naming a method
    the program lacks is silently ignored, so a typo keeps every copy (breaks device_placement/validation)."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ):
        cleaned = dict(options or {})
        for key in (SKIP_H2D, SKIP_D2H):
            value = cleaned.get(key)
            if isinstance(value, Mapping):
                cleaned[key] = {m: v for m, v in value.items() if m in methods}
        return REFERENCE.lower(methods, device=device, options=cleaned)


class CopiesThroughPageableMemory(Forwarding):
    """Keeps outputs on the device internally, then copies them out with ``.cpu()`` into pageable memory:
    correct values and byte counts, but synchronous, slow copies (breaks
    runtime_options/pinned-host-memory)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        from reference_impl.runtime.delegate import keeps_outputs_on_device

        if handle.device.type != "cuda" or keeps_outputs_on_device(handle):
            return REFERENCE.execute(handle, inputs, outputs)
        with handle.options.skip_copy_for([handle.method_name]):
            kept = REFERENCE.execute(handle, inputs)
        stats = handle._stats
        host = [t.cpu() for t in kept]  # pageable: the bug
        handle._stats = {**stats, "d2h_bytes": sum(t.numel() * t.element_size() for t in host)}
        return host


class AcceptsHostInputsForDeviceMethods(Forwarding):
    """Ignores ``skip_h2d_for_method_inputs`` at execute: host tensors are copied in silently, so a caller
    who meant to hold device tensors never learns it pays a copy (breaks device_placement/bad-input)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        if handle.device.type == "cuda" and handle.placement.inputs_on_device:
            inputs = [t.to(handle.device) if t.device.type == "cpu" else t for t in inputs]
        return REFERENCE.execute(handle, inputs, outputs)


class IgnoresOutputPlacement(Forwarding):
    """Accepts ``skip_d2h_for_method_outputs`` and validates it, then drops it before compiling, as a backend
    whose runtime never read the export-time flag would: outputs still come back to the host, every copy
    paid (breaks device_placement/output-device)."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ):
        REFERENCE.lower(methods, device=device, options=options)  # the same validation errors
        kept = {k: v for k, v in (options or {}).items() if k != SKIP_D2H}
        return REFERENCE.lower(methods, device=device, options=kept)


class LowersWithoutOptions(Forwarding):
    """Implements ``lower(methods, *, device)`` as an older protocol had it, with no ``options``, yet keeps
    the reference's ``lower_options``: every lowering a runtime chapter asks for with options fails with a
    ``TypeError`` (breaks lowering/lower, the runtime chapters' rule for a program they cannot get)."""

    def lower(self, methods: Mapping[str, tuple], *, device: str):
        return REFERENCE.lower(methods, device=device)


class ExportTimeWinsSilently(Forwarding):
    """Validates the export-time flags but never looks at the runtime option while lowering: a method fixed
    to host outputs that the runtime option names lowers without a word, and one of the two settings is
    silently ignored (breaks device_placement/conflict)."""

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ):
        named = REFERENCE.get_option(SKIP_COPY_OPTION)
        REFERENCE.set_option(SKIP_COPY_OPTION, "")
        try:
            return REFERENCE.lower(methods, device=device, options=options)
        finally:
            REFERENCE.set_option(SKIP_COPY_OPTION, named)


class CountsArgumentBytes(Forwarding):
    """``execute_stats`` reports the sizes of the arguments, not the copies made: every input counted as
    host→device and every output as device→host, whatever the devices (a counter written from the call's
    signature). On a CPU target nothing crosses PCIe, yet the counters say it did (breaks the cpu-target
    rules of every chapter that runs a CPU program with the mechanisms set)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        result = REFERENCE.execute(handle, inputs, outputs)
        size = sum(t.numel() * t.element_size() for t in inputs)
        handle._stats = {"h2d_bytes": size, "d2h_bytes": sum(t.numel() * t.element_size() for t in result)}
        return result


class StagesThroughTheHost(Forwarding):
    """Keeps tensors on the device as asked, but stages them through the host on the way: device inputs are
    copied to the host and back before the run, kept outputs after it. Values, devices and its own
    ``execute_stats`` (0 bytes) look right; the bytes cross PCIe anyway (breaks device_placement/pcie and
    device_placement/skip-copy-pcie, which judge what NVML saw, not the counters)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        from reference_impl.runtime.delegate import keeps_outputs_on_device

        if handle.device.type != "cuda":
            return REFERENCE.execute(handle, inputs, outputs)
        staged = [t.cpu().to(t.device) if t.device.type == "cuda" else t for t in inputs]
        result = REFERENCE.execute(handle, staged, outputs)
        stats = handle._stats
        if keeps_outputs_on_device(handle):
            result = [t.cpu().to(t.device) for t in result]
        handle._stats = stats  # its counters still say nothing crossed for device tensors
        return result


PLACEMENT = "conformance/device_placement/test_device_placement.py"
PROOF = "tests/conformance/test_placement_broken_backends.py"

DROPS_UNKNOWN_METHODS = DropsUnknownMethods(
    "drops-unknown-methods",
    Breaks(
        ("device_placement/validation",),
        PLACEMENT,
        ("-k", "validated"),
        proven_by=f"{PROOF}::test_silently_dropped_unknown_methods_fail_validation",
    ),
)
COPIES_THROUGH_PAGEABLE_MEMORY = CopiesThroughPageableMemory(
    "copies-through-pageable-memory",
    Breaks(
        ("runtime_options/pinned-host-memory",),
        "conformance/runtime_options/test_runtime_options.py",
        ("-k", "skip_copy_matrix and float32 and llm-unset"),
        cuda=True,
        strict_should=True,
        proven_by=f"{PROOF}::test_pageable_copies_fail_the_pinned_memory_rule",
    ),
)
IGNORES_OUTPUT_PLACEMENT = IgnoresOutputPlacement(
    "ignores-output-placement",
    Breaks(
        ("device_placement/output-device",),
        PLACEMENT,
        ("-k", "placement_matrix and float32 and llm and outputs-first"),
        cuda=True,
    ),
)
ACCEPTS_HOST_INPUTS = AcceptsHostInputsForDeviceMethods(
    "accepts-host-inputs-for-device-methods",
    Breaks(
        ("device_placement/bad-input",),
        PLACEMENT,
        ("-k", "rejects_wrong_inputs and host"),
        cuda=True,
        proven_by=f"{PROOF}::test_host_inputs_accepted_for_a_device_input_method_fail",
    ),
)
LOWERS_WITHOUT_OPTIONS = LowersWithoutOptions(
    "lowers-without-options",
    Breaks(("lowering/lower",), PLACEMENT, ("-k", "cpu_target_changes_nothing and llm")),
)
EXPORT_TIME_WINS_SILENTLY = ExportTimeWinsSilently(
    "export-time-wins-silently", Breaks(("device_placement/conflict",), PLACEMENT, ("-k", "conflict"))
)
COUNTS_ARGUMENT_BYTES = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(("device_placement/cpu-target",), PLACEMENT, ("-k", "cpu_target_changes_nothing and llm")),
)
COUNTS_ARGUMENT_BYTES_SKIP_COPY = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(
        ("runtime_options/cpu-target",),
        "conformance/runtime_options/test_runtime_options.py",
        ("-k", "skip_copy_matrix_cpu_target and float32-llm-both]"),
    ),
)
COUNTS_ARGUMENT_BYTES_PIPELINE = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(
        ("multi_method/cpu-target",),
        "conformance/multi_method/test_multi_method.py",
        ("-k", "pipeline_tokens_match_eager and llm-cpu-float32"),
    ),
)
# The same bug on a CUDA target: kept outputs and device inputs counted as if copied.
COUNTS_ARGUMENT_BYTES_CUDA_KEPT = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(
        ("runtime_options/d2h-bytes",),
        "conformance/runtime_options/test_runtime_options.py",
        ("-k", "skip_copy_matrix and not cpu_target and float32-llm-both]"),
        cuda=True,
    ),
)
COUNTS_ARGUMENT_BYTES_CUDA_PLACED_OUT = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(
        ("device_placement/d2h-bytes",),
        PLACEMENT,
        ("-k", "placement_matrix and float32-llm-outputs-first"),
        cuda=True,
    ),
)
COUNTS_ARGUMENT_BYTES_CUDA_PLACED_IN = CountsArgumentBytes(
    "counts-argument-bytes",
    Breaks(
        ("device_placement/h2d-bytes",),
        PLACEMENT,
        ("-k", "placement_matrix and float32-llm-inputs-all"),
        cuda=True,
    ),
)
STAGES_THROUGH_THE_HOST = StagesThroughTheHost(
    "stages-through-the-host",
    Breaks(
        ("device_placement/pcie", "device_placement/skip-copy-pcie"),
        PLACEMENT,
        ("-k", "pcie and llm"),
        cuda=True,
        strict_should=True,
        alone=True,
    ),
)
