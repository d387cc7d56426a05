"""NVML's PCIe byte counters as numbers: reading them (``pcie_counter_reader``), unwrapping the 32-bit
values, integrating a window of samples, and the maths of idle drift and of waiting for the counters to
settle. Everything but the reader is pure (no threads, no device); ``harness.nvml_traffic`` explains
what the counters are and how the meter uses these.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.gpu_state import NvmlUnavailable, describe_error

COUNTER_MODULUS = 2**32
# Fastest link the unwrap must survive: PCIe Gen6 x16, ≈128 GB/s per direction including protocol bytes.
MAX_LINK_BYTES_PER_S = 128e9
SAFE_GAP_S = COUNTER_MODULUS / MAX_LINK_BYTES_PER_S  # ≈ 33.5 ms
# After the workload, wait until the counters go quiet: NVML may publish them with some delay. The quiet
# window is at least SETTLE_WINDOW_S and at least SETTLE_PUBLISH_FACTOR × the interval at which the
# counters were seen to change while idle, so a coarse publish period cannot end a window early.
SETTLE_WINDOW_S = 0.02
SETTLE_PUBLISH_FACTOR = 3.0
SETTLE_MAX_S = 0.5
SETTLE_RATE_BYTES_PER_S = 50e6  # 100× the idle drift, 1/1000 of the link: "quiet"
COUNTERS = ("tx", "rx")


class CounterUnsupported(NvmlUnavailable):
    """The PCIe byte counters cannot be read on this device; the message says why."""


class CalibrationError(RuntimeError):
    """The calibration transfers did not behave like the model (direction unclear, no traffic...)."""


@dataclass(frozen=True)
class CounterSample:
    """Both raw counters as read at host monotonic time ``t`` (seconds)."""

    t: float
    tx: int
    rx: int


@dataclass(frozen=True)
class CounterTotals:
    """Bytes each counter advanced over a window of samples, unwrapped; invalid if a poll gap was unsafe."""

    tx_bytes: int
    rx_bytes: int
    duration_s: float
    tx_wraps: int
    rx_wraps: int
    n_samples: int
    max_gap_s: float
    valid: bool
    reason: str | None = None

    def get(self, counter: str) -> int:
        return self.tx_bytes if counter == "tx" else self.rx_bytes

    def wraps(self, counter: str) -> int:
        return self.tx_wraps if counter == "tx" else self.rx_wraps


def unwrap(values: Sequence[int], modulus: int = COUNTER_MODULUS) -> tuple[int, int]:
    """(total advance, number of wraps) of a counter read in order, each step taken modulo ``modulus``.

    Correct as long as the counter advanced by less than ``modulus`` between consecutive reads, which
    the poll gap check guarantees.
    """
    total = 0
    wraps = 0
    for before, after in itertools.pairwise(values):
        total += (after - before) % modulus
        wraps += after < before
    return total, wraps


def max_gap(times: Sequence[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def integrate(
    samples: Sequence[CounterSample], modulus: int = COUNTER_MODULUS, safe_gap_s: float = SAFE_GAP_S
) -> CounterTotals:
    """Total bytes per counter over ``samples``; invalid when two samples are further apart than safe."""
    times = [s.t for s in samples]
    tx, tx_wraps = unwrap([s.tx for s in samples], modulus)
    rx, rx_wraps = unwrap([s.rx for s in samples], modulus)
    gap = max_gap(times)
    duration = times[-1] - times[0] if samples else 0.0
    reason = None
    if len(samples) < 2:
        reason = f"only {len(samples)} counter sample(s): need 2 or more"
    elif gap > safe_gap_s:
        reason = (
            f"missed polls: two counter samples were {gap * 1e3:.1f} ms apart, more than the safe "
            f"{safe_gap_s * 1e3:.1f} ms in which the 2^32-byte counter cannot wrap unseen; "
            "the total could be short by multiples of 4 GiB"
        )
    return CounterTotals(tx, rx, duration, tx_wraps, rx_wraps, len(samples), gap, reason is None, reason)


def update_interval(samples: Sequence[CounterSample]) -> float | None:
    """Median time between samples at which either counter changed: how often new values appear."""
    changes = [b.t for a, b in itertools.pairwise(samples) if (a.tx, a.rx) != (b.tx, b.rx)]
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    return statistics.median(gaps) if gaps else None


def settle_window(publish_interval_s: float | None) -> float:
    """How long the counters must stay quiet before a measurement window may close."""
    if publish_interval_s is None:
        return SETTLE_WINDOW_S
    return min(max(SETTLE_WINDOW_S, SETTLE_PUBLISH_FACTOR * publish_interval_s), SETTLE_MAX_S / 2)


def is_settled(
    samples: Sequence[CounterSample],
    window_s: float = SETTLE_WINDOW_S,
    rate_bytes_per_s: float = SETTLE_RATE_BYTES_PER_S,
    modulus: int = COUNTER_MODULUS,
) -> bool:
    """True when the samples span ``window_s`` at the end and both counters rose slower than the rate."""
    if len(samples) < 2:
        return False
    end = samples[-1].t
    recent = [s for s in samples if s.t >= end - window_s]
    if len(recent) < 2 or recent[-1].t - recent[0].t < 0.8 * window_s:
        return False
    span = recent[-1].t - recent[0].t
    tx, _ = unwrap([s.tx for s in recent], modulus)
    rx, _ = unwrap([s.rx for s in recent], modulus)
    return max(tx, rx) <= rate_bytes_per_s * span


@dataclass(frozen=True)
class Drift:
    """Idle advance rate of each counter, with a noise figure (difference of the window's two halves)."""

    tx_bytes_per_s: float
    rx_bytes_per_s: float
    tx_noise_bytes_per_s: float
    rx_noise_bytes_per_s: float
    duration_s: float

    def rate(self, counter: str) -> float:
        return self.tx_bytes_per_s if counter == "tx" else self.rx_bytes_per_s

    def noise(self, counter: str) -> float:
        return self.tx_noise_bytes_per_s if counter == "tx" else self.rx_noise_bytes_per_s


ZERO_DRIFT = Drift(0.0, 0.0, 0.0, 0.0, 0.0)


#: Segments of the idle window whose rates give the drift's noise figure (see :func:`drift_from_samples`).
DRIFT_SEGMENTS = 8


def drift_from_samples(samples: Sequence[CounterSample], safe_gap_s: float = SAFE_GAP_S) -> Drift:
    """Drift rates from an idle window; raises if the window is unusable (too short or a poll gap).

    The noise figure is how much the idle rate measured over half the window varies. One difference of the
    two halves estimates it, but a single difference can come out near zero by chance: on an H100 the same
    meter gave ±3 B one run and ±1,400 B the next, and a saving judged against ±3 B failed a correct
    backend. So the window is also cut into :data:`DRIFT_SEGMENTS` segments; the spread of their rates,
    scaled to a half window (white noise: by sqrt(segment / half)) and to the expected size of a
    two-halves difference (2/sqrt(pi) sigma), bounds the figure from below."""
    totals = integrate(samples, safe_gap_s=safe_gap_s)
    if not totals.valid or totals.duration_s <= 0:
        raise CalibrationError(f"idle drift window unusable: {totals.reason or 'zero duration'}")
    start = samples[0].t
    halves = [_rate(part, safe_gap_s) for part in _segments(samples, start, totals.duration_s, 2)]
    (tx1, rx1), (tx2, rx2) = (halves + [(0.0, 0.0)] * 2)[:2]
    parts = _segments(samples, start, totals.duration_s, DRIFT_SEGMENTS)
    segments = [_rate(part, safe_gap_s) for part in parts]

    def spread(values: list[float]) -> float:
        if len(values) < 3:
            return 0.0
        return statistics.stdev(values) * math.sqrt(2 / len(values)) * 2 / math.sqrt(math.pi)

    return Drift(
        tx_bytes_per_s=totals.tx_bytes / totals.duration_s,
        rx_bytes_per_s=totals.rx_bytes / totals.duration_s,
        tx_noise_bytes_per_s=max(abs(tx1 - tx2), spread([tx for tx, _ in segments])),
        rx_noise_bytes_per_s=max(abs(rx1 - rx2), spread([rx for _, rx in segments])),
        duration_s=totals.duration_s,
    )


def _segments(
    samples: Sequence[CounterSample], start: float, duration: float, count: int
) -> list[Sequence[CounterSample]]:
    """``count`` consecutive parts of equal time, each from the last sample of the one before (no gap);
    parts with fewer than two samples are left out."""
    times = [s.t for s in samples]
    parts: list[Sequence[CounterSample]] = []
    first = 0
    for k in range(1, count + 1):
        last = max(first, bisect.bisect_right(times, start + duration * k / count + 1e-12) - 1)
        if last > first:
            parts.append(samples[first : last + 1])
        first = last
    return parts


def _rate(part: Sequence[CounterSample], safe_gap_s: float) -> tuple[float, float]:
    span = part[-1].t - part[0].t if len(part) >= 2 else 0.0
    if span <= 0:
        return (0.0, 0.0)
    t = integrate(part, safe_gap_s=safe_gap_s)
    return (t.tx_bytes / span, t.rx_bytes / span)


def subtract_drift(totals: CounterTotals, drift: Drift) -> dict[str, float]:
    """Counter advance minus idle drift over the window, per counter, floored at 0 (drift is noisy)."""
    return {c: max(0.0, totals.get(c) - drift.rate(c) * totals.duration_s) for c in COUNTERS}


def drift_noise_bytes(duration_s: float, drift: Drift, counter: str) -> float:
    """How wrong the drift correction can be over a window: the idle rate's own variation, times the window.

    The rate itself is subtracted, so it is not the uncertainty: in one bench run on an H200 the idle
    counters advanced 17-23 MB/s while that rate varied by ~0.2 MB/s between the two halves of the
    idle window. Counting the whole rate as noise made every figure's spread exceed its value. What the
    idle window cannot show, a rate that changes under load, is not included.
    """
    return drift.noise(counter) * duration_s


def _field_int(pynvml: Any, value: Any, name: str) -> int:
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise CounterUnsupported(f"NVML field {name}: {describe_error(pynvml.NVMLError(value.nvmlReturn))}")
    member = {
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }.get(value.valueType)
    if member is None:
        raise CounterUnsupported(f"NVML field {name}: unexpected value type {value.valueType}")
    return int(getattr(value.value, member))


def pcie_counter_reader(pynvml: Any, handle: Any) -> Callable[[], tuple[int, int]]:
    """A function reading (tx, rx) raw byte counters in one NVML call; raises CounterUnsupported."""
    for name in ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"):
        if not hasattr(pynvml, name):
            raise CounterUnsupported(f"this pynvml ({pynvml.__name__}) does not define {name}")
    fields = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]

    def read() -> tuple[int, int]:
        values = pynvml.nvmlDeviceGetFieldValues(handle, fields)
        return (
            _field_int(pynvml, values[0], "NVML_FI_DEV_PCIE_COUNT_TX_BYTES"),
            _field_int(pynvml, values[1], "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"),
        )

    return read
