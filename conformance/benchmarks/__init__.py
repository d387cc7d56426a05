"""Benchmark suites for ``python -m harness.bench``: one module per group, each exposing ``SUITES``.

``harness.bench`` names these modules by path string (``SUITE_MODULES``) and imports them when a suite
runs, so ``harness`` never imports ``conformance`` statically; the suites here may use the model zoo,
the protocol helpers (``conformance.programs``, ``conformance.pipelines``) and harness's measuring
primitives (``harness.timing``, ``harness.nvml_traffic``).

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
from collections.abc import Sequence
from typing import Any

from harness.records import Metric
from harness.timing import summarize

__all__ = ["cuda_device", "exact_metric", "ratio_metric", "timing_metric"]


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
