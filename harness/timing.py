"""GPU timing with CUDA events: warm-up, L2 flush before every sample, median and IQR, adaptive repeats.

The statistics and the stopping rule are pure functions (tested on CPU with synthetic samples); only
``time_cuda`` / ``time_cuda_interleaved`` / ``time_host_per_call`` touch the GPU. Every figure is a
``Measurement``: the median with the interquartile range as its noise figure, in a stated unit, plus the
raw samples, why sampling stopped, and the GPU's clocks and throttle reasons when it did.

Two clocks, kept apart as nvbench keeps them: *GPU time* (``time_cuda_interleaved`` with
``hide_launch_overhead=True``) is what the work costs on the device: each batch is queued behind a
blocking kernel (``torch.cuda._sleep``), so the host's launch cost never shows up as an idle gap between
a start event and the kernel. *Host time* (``time_host_per_call``) is what one call costs the calling
thread to enqueue. For a call that returns before the GPU finishes, the two together are its cost; a
call that waits for the GPU (a synchronous ``execute``) is timed end to end instead (the default).
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


class LaunchBlocker:
    """Holds the stream with a spin kernel while the host enqueues a batch (nvbench's blocking kernel).

    ``hold()`` queues ``torch.cuda._sleep`` for ``hold_s``; work enqueued after it starts only when the
    spin ends, so the events around each call time the device alone. ``released_early(event)`` tells,
    once the batch is queued, whether the GPU already reached the batch's first event, i.e. the hold was
    shorter than the host's enqueueing; then the hold doubles (up to ``MAX_HOLD_S``) for the next batch.
    """

    MIN_HOLD_S = 1e-3
    MAX_HOLD_S = 0.2
    MAX_ATTEMPTS = 8  # per batch; 1 ms doubled 8 times passes MAX_HOLD_S

    def __init__(self) -> None:
        import torch

        from harness.stream_hold import spin_cycles_per_s

        self.cycles_per_s = spin_cycles_per_s(torch.cuda.current_device())  # measured once per device
        self.hold_s = self.MIN_HOLD_S
        self.batches = 0  # batches queued behind a hold
        self.early = 0  # of those, discarded: the GPU reached them before they were fully queued
        self.uncovered = 0  # kept although no hold covered them (the calls wait for the GPU)

    def hold(self) -> None:
        import torch

        torch.cuda._sleep(int(self.hold_s * self.cycles_per_s))

    def released_early(self, first_event: Any, host_s: float) -> bool:
        """Whether the batch behind the last hold was not fully queued in time; adapts the next hold."""
        self.batches += 1
        early = bool(first_event.query())
        if early:
            self.early += 1
            self.hold_s = min(self.MAX_HOLD_S, max(2 * self.hold_s, 2 * host_s))
        else:
            self.hold_s = max(self.MIN_HOLD_S, min(self.hold_s, 2 * host_s))
        return early

    def conditions(self) -> dict[str, Any]:
        covered = self.uncovered == 0
        return {
            "launch_overhead": (
                "hidden: every batch queued behind a blocking kernel (GPU time only)"
                if covered
                else f"included in {self.uncovered} batch(es) no blocking kernel could cover"
            ),
            "blocking_kernel": {
                "batches": self.batches,
                "discarded_released_early": self.early,
                "kept_uncovered": self.uncovered,
                "last_hold_s": round(self.hold_s, 6),
            },
        }


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
    hide_launch_overhead: bool = False,
) -> dict[str, Measurement]:
    """Time several competitors with CUDA events, one sample each per round, order alternating by round.

    Before every sample L2 is flushed, so no competitor inherits warm operands from the one before.
    With ``hide_launch_overhead`` each batch waits behind a ``LaunchBlocker``, so a sample is GPU time
    only; a batch the blocker could not cover (the host took longer to queue it than the hold lasted, or
    a competitor waited for the GPU) is discarded and the hold grows. When even the longest hold does
    not cover a batch, the samples are kept end to end and the conditions say so.
    Each figure's ``conditions`` are the GPU's clocks and throttle reasons when sampling ended.
    """
    import torch

    from harness.gpu_state import capture_gpu_state

    names = list(fns)
    flush = l2_flusher(device_index) if flush_l2 else (lambda: None)
    warm_up(list(fns.values()), device_index, warmup_calls)

    with torch.cuda.device(device_index):
        blocker = LaunchBlocker() if hide_launch_overhead else None

        def enqueue_batch(round_index: int) -> tuple[list[tuple[str, Any, Any]], float]:
            events: list[tuple[str, Any, Any]] = []
            if blocker is not None:
                blocker.hold()
            began = time.perf_counter()
            for i in range(policy.batch):
                for name in interleaved_order(names, round_index * policy.batch + i):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    flush()
                    start.record()
                    fns[name]()
                    end.record()
                    events.append((name, start, end))
            return events, time.perf_counter() - began

        def take_batch(round_index: int) -> dict[str, list[float]]:
            for _ in range(LaunchBlocker.MAX_ATTEMPTS):
                events, host_s = enqueue_batch(round_index)
                if blocker is None or not blocker.released_early(events[0][1], host_s):
                    break
                torch.cuda.synchronize(device_index)  # samples with host gaps in them: discarded
            else:
                assert blocker is not None  # without one the first attempt always breaks
                blocker.uncovered += 1  # kept end to end; the conditions count them
            torch.cuda.synchronize(device_index)
            out: dict[str, list[float]] = {name: [] for name in names}
            for name, start, end in events:
                out[name].append(start.elapsed_time(end) / 1e3)  # ms → s
            return out

        results = run_adaptive(take_batch, policy, unit="s")
    conditions = capture_gpu_state(device_index).to_conditions()
    if blocker is not None:
        conditions.update(blocker.conditions())
    else:
        conditions["launch_overhead"] = "included: samples run from the call's start event to its end event"
    return {name: replace(m, conditions=conditions) for name, m in results.items()}


def time_host_interleaved(
    fns: Mapping[str, Callable[[], object]], policy: StopPolicy = StopPolicy(), warmup_calls: int = 3
) -> dict[str, Measurement]:
    """Wall-clock seconds per call of several competitors, one sample each per round, order alternating by
    round: for work that runs on the host (a program lowered for the CPU), where the call is the work."""
    names = list(fns)
    for fn in fns.values():
        for _ in range(warmup_calls):
            fn()

    def take_batch(round_index: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {name: [] for name in names}
        for i in range(policy.batch):
            for name in interleaved_order(names, round_index * policy.batch + i):
                began = time.perf_counter()
                fns[name]()
                out[name].append(time.perf_counter() - began)
        return out

    conditions = {"timing": "host wall clock per call (the work runs on the CPU)"}
    return {name: replace(m, conditions=conditions) for name, m in run_adaptive(take_batch, policy).items()}


def time_host_per_call(
    fns: Mapping[str, Callable[[], object]],
    device_index: int,
    calls: int = 50,
    repeats: int = 21,
) -> dict[str, Measurement]:
    """Host seconds per call to enqueue each competitor, interleaved by repeat (median and IQR).

    A repeat times ``calls`` back-to-back calls on the host clock with nothing waiting for the device
    (the device drains between repeats, outside the clock): the calling thread's own cost per call.
    Keep ``calls`` under the launch queue's depth (about a thousand) so the queue never pushes back.
    """
    import torch

    names = list(fns)
    warm_up(list(fns.values()), device_index)
    samples: dict[str, list[float]] = {name: [] for name in names}
    with torch.cuda.device(device_index):
        for repeat in range(repeats):
            for name in interleaved_order(names, repeat):
                fn = fns[name]
                began = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples[name].append((time.perf_counter() - began) / calls)
                torch.cuda.synchronize(device_index)
    return {name: summarize(values, "s") for name, values in samples.items()}


def time_cuda(
    fn: Callable[[], object],
    device_index: int,
    policy: StopPolicy = StopPolicy(),
    flush_l2: bool = True,
    warmup_calls: int = 3,
) -> Measurement:
    """Time one GPU workload (seconds per call) with CUDA events; see ``time_cuda_interleaved``."""
    return time_cuda_interleaved({"fn": fn}, device_index, policy, flush_l2, warmup_calls)["fn"]
