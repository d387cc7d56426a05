"""GPU timing with CUDA events: warm-up, L2 flush before every sample, median and IQR, adaptive repeats.

The statistics and the stopping rule are pure functions (tested on CPU with synthetic samples); only
``time_cuda`` / ``time_cuda_interleaved`` touch the GPU. Every figure is a ``Measurement``: the median
with the interquartile range as its noise figure, in a stated unit, plus the raw samples, why sampling
stopped, and the GPU's clocks and throttle reasons when it did.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.records import Metric

FALLBACK_FLUSH_BYTES = 256 << 20  # when torch does not report the L2 size


@dataclass(frozen=True)
class Measurement:
    """``value`` = median of ``samples``, ``spread`` = their IQR, both in ``unit``."""

    value: float
    spread: float
    n: int
    unit: str
    samples: tuple[float, ...]
    converged: bool = True
    stop_reason: str = ""
    conditions: dict[str, Any] = field(default_factory=dict)

    @property
    def relative_spread(self) -> float:
        return self.spread / abs(self.value) if self.value else math.inf

    def to_metric(self, better: str = "lower") -> Metric:
        return Metric(unit=self.unit, value=self.value, spread=self.spread, better=better, n=self.n)

    def best(self, better: str = "lower") -> float:
        return min(self.samples) if better == "lower" else max(self.samples)


@dataclass(frozen=True)
class StopPolicy:
    """Sample until the relative IQR is at most ``target_rel_iqr`` (after ``min_samples``) or time is up."""

    min_samples: int = 10
    max_samples: int = 2000
    target_rel_iqr: float = 0.02
    budget_s: float = 2.0
    batch: int = 5  # samples taken between two host synchronisations


QUICK_POLICY = StopPolicy(min_samples=5, max_samples=200, target_rel_iqr=0.05, budget_s=0.3, batch=5)


# ---------------------------------------------------------------------------------------------- statistics


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default method)."""
    if not values:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q} outside [0, 1]")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def iqr(values: Sequence[float]) -> float:
    return quantile(values, 0.75) - quantile(values, 0.25)


def relative_iqr(values: Sequence[float]) -> float:
    middle = median(values)
    return iqr(values) / abs(middle) if middle else math.inf


def summarize(
    samples: Sequence[float], unit: str, converged: bool = True, stop_reason: str = ""
) -> Measurement:
    return Measurement(
        value=median(samples),
        spread=iqr(samples),
        n=len(samples),
        unit=unit,
        samples=tuple(samples),
        converged=converged,
        stop_reason=stop_reason,
    )


def transform(m: Measurement, fn: Callable[[float], float], unit: str) -> Measurement:
    """A derived figure (e.g. TFLOP/s from seconds) from the per-sample values, so its IQR is its own."""
    out = summarize([fn(s) for s in m.samples], unit, m.converged, m.stop_reason)
    return replace(out, conditions=dict(m.conditions))


def paired_ratio(numerator: Measurement, denominator: Measurement, unit: str = "x") -> Measurement:
    """Per-round ratios of two interleaved measurements: drift common to a round cancels out."""
    n = min(numerator.n, denominator.n)
    if n == 0:
        raise ValueError("ratio of empty measurements")
    ratios = [a / b for a, b in zip(numerator.samples[:n], denominator.samples[:n], strict=True)]
    return summarize(ratios, unit, numerator.converged and denominator.converged, numerator.stop_reason)


def stop_reason(samples: Sequence[float], elapsed_s: float, policy: StopPolicy) -> str | None:
    """Why to stop now (``converged: ...`` or ``budget...``/``max samples``), or None to go on."""
    n = len(samples)
    if n >= policy.min_samples and relative_iqr(samples) <= policy.target_rel_iqr:
        return f"converged: relative IQR {relative_iqr(samples):.4f} <= {policy.target_rel_iqr}"
    if n >= policy.max_samples:
        return f"max samples ({policy.max_samples}) reached, relative IQR {relative_iqr(samples):.4f}"
    if elapsed_s >= policy.budget_s and n >= policy.min_samples:
        return f"time budget {policy.budget_s} s spent, relative IQR {relative_iqr(samples):.4f}"
    return None


def run_adaptive(
    take_batch: Callable[[int], Mapping[str, Sequence[float]]],
    policy: StopPolicy,
    unit: str = "s",
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Measurement]:
    """Call ``take_batch(round_index)`` (one or more samples per competitor) until every competitor stops.

    All competitors get the same number of samples, so their samples stay paired by round. The budget
    is shared; a figure that stopped on budget or max samples is marked ``converged=False``.
    """
    start = clock()
    samples: dict[str, list[float]] = {}
    round_index = 0
    while True:
        for name, values in take_batch(round_index).items():
            samples.setdefault(name, []).extend(values)
        round_index += 1
        elapsed = clock() - start
        reasons = {name: stop_reason(values, elapsed, policy) for name, values in samples.items()}
        if all(r is not None and r.startswith("converged") for r in reasons.values()) or any(
            r is not None and not r.startswith("converged") for r in reasons.values()
        ):
            break
    return {
        name: summarize(
            values,
            unit,
            converged=(reasons[name] or "").startswith("converged"),
            stop_reason=reasons[name] or "stopped with the other competitors",
        )
        for name, values in samples.items()
    }


def interleaved_order(names: Sequence[str], round_index: int) -> list[str]:
    """Competitors in order on even rounds, reversed on odd ones, so neither always runs first."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def l2_flush_bytes(l2_cache_bytes: int | None) -> int:
    """Bytes to write to evict L2: twice its size, or 256 MiB where the size is unknown."""
    return 2 * l2_cache_bytes if l2_cache_bytes and l2_cache_bytes > 0 else FALLBACK_FLUSH_BYTES


# ---------------------------------------------------------------------------------------------- CUDA


class L2Flusher:
    """Writes a buffer of ``l2_flush_bytes`` on the current stream, evicting the operands from L2."""

    def __init__(self, device_index: int) -> None:
        import torch

        props = torch.cuda.get_device_properties(device_index)
        self.nbytes = l2_flush_bytes(getattr(props, "L2_cache_size", None))
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=f"cuda:{device_index}")

    def __call__(self) -> None:
        self.buffer.zero_()


_flushers: dict[int, L2Flusher] = {}


def l2_flusher(device_index: int) -> L2Flusher:
    if device_index not in _flushers:
        _flushers[device_index] = L2Flusher(device_index)
    return _flushers[device_index]


def warm_up(
    fns: Sequence[Callable[[], object]], device_index: int, min_calls: int = 3, min_s: float = 0.05
) -> None:
    """Run each fn ``min_calls`` times and for ``min_s`` at least: caches, clocks and autotuning settle."""
    import torch

    start = time.monotonic()
    calls = 0
    while calls < min_calls or time.monotonic() - start < min_s:
        for fn in fns:
            fn()
        torch.cuda.synchronize(device_index)
        calls += 1


def time_cuda_interleaved(
    fns: Mapping[str, Callable[[], object]],
    device_index: int,
    policy: StopPolicy = StopPolicy(),
    flush_l2: bool = True,
    warmup_calls: int = 3,
) -> dict[str, Measurement]:
    """Time several competitors with CUDA events, one sample each per round, order alternating by round.

    Before every sample L2 is flushed, so no competitor inherits warm operands from the one before.
    Each figure's ``conditions`` are the GPU's clocks and throttle reasons when sampling ended.
    """
    import torch

    from harness.gpu_state import capture_gpu_state

    names = list(fns)
    flush = l2_flusher(device_index) if flush_l2 else (lambda: None)
    warm_up(list(fns.values()), device_index, warmup_calls)

    def take_batch(round_index: int) -> dict[str, list[float]]:
        events: list[tuple[str, Any, Any]] = []
        for i in range(policy.batch):
            for name in interleaved_order(names, round_index * policy.batch + i):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                flush()
                start.record()
                fns[name]()
                end.record()
                events.append((name, start, end))
        torch.cuda.synchronize(device_index)
        out: dict[str, list[float]] = {name: [] for name in names}
        for name, start, end in events:
            out[name].append(start.elapsed_time(end) / 1e3)  # ms → s
        return out

    with torch.cuda.device(device_index):
        results = run_adaptive(take_batch, policy, unit="s")
    conditions = capture_gpu_state(device_index).to_conditions()
    return {name: replace(m, conditions=conditions) for name, m in results.items()}


def time_cuda(
    fn: Callable[[], object],
    device_index: int,
    policy: StopPolicy = StopPolicy(),
    flush_l2: bool = True,
    warmup_calls: int = 3,
) -> Measurement:
    """Time one GPU workload (seconds per call) with CUDA events; see ``time_cuda_interleaved``."""
    return time_cuda_interleaved({"fn": fn}, device_index, policy, flush_l2, warmup_calls)["fn"]
