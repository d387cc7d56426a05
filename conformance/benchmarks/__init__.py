"""Benchmark suites for ``python -m harness.bench``: one module per group, each exposing ``SUITES``.

``harness.bench`` names these modules by path string (``SUITE_MODULES``) and imports them when a suite
runs, so ``harness`` never imports ``conformance`` statically; the suites here may use the model zoo,
the protocol helpers (``conformance.common.programs``, ``conformance.common.pipelines``) and harness's
measuring primitives (``harness.timing``, ``harness.nvml_traffic``).

* ``mm``: ``mm_out`` (the backend's ``mm_out`` vs ``torch.mm``) and ``threads`` (its thread scaling).
* ``pipelines``: ASR-like and LLM-like end-to-end latency and bytes moved, with and without skip-copy.
* ``view_pass``: the slicing-heavy block lowered with and without the view-copy pass.
* ``lowering``: compile time cold and warm, program size, first and warm load time.
* ``models``: per pipeline model (``asr``, ``llm``, ``hf_whisper``, ``hf_llm``): lowering cold/warm, first
  load, latency and PCIe bytes per token with and without skip-copy, as ratios against eager.

Helpers shared by several suites live here; they import nothing heavy at module level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.records import Metric
from harness.timing import summarize

__all__ = [
    "BACKEND_MODES",
    "BENCH_STEPS",
    "BenchPipeline",
    "bench_pipelines",
    "cuda_device",
    "exact_metric",
    "ratio_metric",
    "timing_metric",
]

#: Greedy steps one bench run takes, by kind: ASR decoder steps; LLM tokens (prefill's, then 8 decodes').
BENCH_STEPS = {"asr": 6, "llm": 9}
#: Modes a backend runs a pipeline in: every output copied to the host, the runtime skip-copy option, and
#: export-time placement (``placed``: the program lowered with every input and output on the device).
BACKEND_MODES = ("copy", "skip_copy", "placed")


@dataclass(frozen=True)
class BenchPipeline:
    """One pipeline model as the ``pipelines`` and ``models`` benches run it (the one owner of what a run
    is: which methods, how many steps, what the skip-copy option names)."""

    model: str
    kind: str
    methods: tuple[str, str]
    steps: int

    @property
    def name(self) -> str:
        return self.model

    @property
    def skip_methods(self) -> str:
        """What mode ``skip_copy`` names: the first method for the ASR kind (the encoder's hidden state stays
        on the GPU for every decoder step), both for the LLM kind (logits and KV caches stay)."""
        return self.methods[0] if self.kind == "asr" else ",".join(self.methods)

    @property
    def tokens_per_run(self) -> int:
        """Tokens one run generates per sequence (each a decoder / decode call's argmax, or prefill's)."""
        return self.steps

    @property
    def description(self) -> str:
        first, second = self.methods
        if self.kind == "asr":
            return f"{first} once + {second} {self.steps} steps"
        return f"{first} + {second} {self.steps - 1} steps"

    def option_value(self, mode: str) -> str:
        """The runtime skip-copy option's value in ``mode`` (one of ``BACKEND_MODES``)."""
        if mode not in BACKEND_MODES:
            raise ValueError(f"mode {mode!r} has no skip-copy option value; backend modes: {BACKEND_MODES}")
        return self.skip_methods if mode == "skip_copy" else ""

    def run(self, backend: Any, handles: Sequence[object], first_input: Any, stats: Any = None) -> Any:
        """One greedy run on the backend's two handles; token ids ``[B, steps]`` (int64, CPU)."""
        from conformance.common.pipelines import run_greedy

        first, second = handles
        return run_greedy(backend, self.model, first, second, first_input, self.steps, stats)


def bench_pipelines(pipelines: Mapping[str, Any] | None = None) -> list[BenchPipeline]:
    """One ``BenchPipeline`` per pipeline model (``conformance.common.pipelines.PIPELINE_MODELS`` by
    default)."""
    if pipelines is None:
        from conformance.common.pipelines import PIPELINE_MODELS

        pipelines = PIPELINE_MODELS
    return [
        BenchPipeline(name, p.kind, tuple(p.methods), BENCH_STEPS[p.kind]) for name, p in pipelines.items()
    ]


def exact_metric(value: float, unit: str, better: str = "lower", note: str | None = None) -> Metric:
    """A figure that is counted, not sampled (bytes a runtime reports, a size): spread 0, one reading."""
    return Metric(unit=unit, value=value, spread=0.0, better=better, n=1, note=note)


def timing_metric(samples: Sequence[float], why_missing: str) -> Metric:
    """Sampled seconds (lower is better) as a metric with its spread; missing says why when none finished."""
    if not samples:
        return Metric.missing("s", "lower", why_missing)
    return summarize(list(samples), "s").to_metric("lower")


def ratio_metric(
    numerator: float | None,
    numerator_noise: float | None,
    denominator: float | None,
    *,
    what: str,
    better: str = "lower",
    missing_reason: str = "not measured",
) -> Metric:
    """``numerator / denominator`` (unit ``x``) with the numerator's noise carried over; missing says why.

    The denominator is taken as exact (a runtime's own byte count); a zero or absent one gives no ratio.
    """
    if numerator is None:
        return Metric.missing("x", better, missing_reason)
    if not denominator:
        return Metric.missing("x", better, f"{what}: the runtime counted 0 bytes, so there is no ratio")
    value = numerator / denominator
    spread = None if numerator_noise is None else abs(numerator_noise / denominator)
    if not math.isfinite(value):
        return Metric.missing("x", better, f"{what}: ratio not finite")
    return Metric(unit="x", value=value, spread=spread, better=better, n=1)


def cuda_device(index: int) -> Any:
    """``torch.device("cuda", index)``, imported lazily."""
    import torch

    return torch.device("cuda", index)
