"""PCIe traffic meter over NVML's device-wide byte counters, plus device memory and GPM DRAM bandwidth.

What the counters are (measured on an H200, SPEC §2): ``NVML_FI_DEV_PCIE_COUNT_TX_BYTES`` / ``RX_BYTES``
read through ``nvmlDeviceGetFieldValues``; 32-bit, so they wrap every 4 GiB (≈80 ms at full link speed);
they count PCIe protocol overhead (~9 % over payload); they drift ~0.5 MB/s on an idle GPU.

How the meter copes:

* **Polling.** A background thread reads both counters every ``POLL_PERIOD_S`` (1 ms, 1 kHz) and the
  deltas are summed modulo 2^32. A delta is unambiguous only while less than 2^32 bytes pass between two
  reads; ``SAFE_GAP_S`` (33.5 ms) is that time on a PCIe Gen6 x16 link (≈128 GB/s per direction, twice
  Gen5's 64 GB/s), so the 1 ms period leaves ~30 missed polls of margin (GIL hand-offs, scheduler
  hiccups), and a gap longer than ``SAFE_GAP_S`` marks the measurement invalid instead of under-counting.
  Summing per-poll deltas modulo 2^32 is also correct for a 64-bit counter, so nothing assumes the width.
* **Direction.** NVML counts from the device's point of view: TX is traffic *from* the GPU (device→host),
  RX traffic *to* it (host→device); the GPM metrics say so in words ("PCIe traffic from this GPU" /
  "to this GPU"). During an H2D DMA the GPU sends small read requests (TX) and receives the data as
  completions (RX), so RX is the big one. Calibration does not trust this: it copies a known pinned
  buffer each way and takes the counter that moved most during the H2D copy as the H2D counter (and fails
  if the D2H copy does not move the other one).
* **Drift** is measured over an idle window first and subtracted as a rate × duration.
* **Overhead** comes from calibration: bytes counted on each counter per payload byte of each direction,
  a 2×2 matrix that is inverted to turn counted bytes into payload estimates.
* **Devices** are mapped by UUID (torch's ``get_device_properties(i).uuid``), because NVML ignores
  ``CUDA_VISIBLE_DEVICES``; measurements hold ``harness.locks.gpu_lock(uuid)`` because the counters are
  device-wide.
* **Unsupported** counters (no driver, MIG, old GPU) give ``None`` values with a reason, never 0.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from harness.gpu_state import (
    NvmlUnavailable,
    describe_error,
    nvml_handle,
    nvml_session,
    torch_device_uuid,
)
from harness.locks import gpu_lock
from harness.records import BenchRecord, Metric

COUNTER_MODULUS = 2**32
# Fastest link the unwrap must survive: PCIe Gen6 x16, ≈128 GB/s per direction including protocol bytes.
MAX_LINK_BYTES_PER_S = 128e9
SAFE_GAP_S = COUNTER_MODULUS / MAX_LINK_BYTES_PER_S  # ≈ 33.5 ms
POLL_PERIOD_S = 1e-3
# After the workload, wait until the counters go quiet: NVML may publish them with some delay. The quiet
# window is at least SETTLE_WINDOW_S and at least SETTLE_PUBLISH_FACTOR × the interval at which the
# counters were seen to change while idle, so a coarse publish period cannot end a window early.
SETTLE_WINDOW_S = 0.02
SETTLE_PUBLISH_FACTOR = 3.0
SETTLE_MAX_S = 0.5
SETTLE_RATE_BYTES_PER_S = 50e6  # 100× the idle drift, 1/1000 of the link: "quiet"
DEFAULT_DRIFT_S = 0.5
DEFAULT_CALIBRATION_BYTES = 1 << 30
DEFAULT_CALIBRATION_REPEATS = 3
# During one direction's copy the counter of that direction must exceed the other by this much.
DIRECTION_MIN_RATIO = 3.0
COUNTERS = ("tx", "rx")


class CounterUnsupported(NvmlUnavailable):
    """The PCIe byte counters cannot be read on this device; the message says why."""


class CalibrationError(RuntimeError):
    """The calibration transfers did not behave like the model (direction unclear, no traffic...)."""


# ---------------------------------------------------------------------------------------------- pure maths


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


def infer_h2d_counter(
    during_h2d: dict[str, float], during_d2h: dict[str, float], min_ratio: float = DIRECTION_MIN_RATIO
) -> str:
    """The counter ("tx" or "rx") that carries host→device data, read off two known copies.

    The H2D copy must move that counter at least ``min_ratio`` × the other; the D2H copy must do the
    opposite. Anything else means the counters are not what we think (or other traffic interfered).
    """
    h2d = max(COUNTERS, key=lambda c: during_h2d[c])
    d2h = next(c for c in COUNTERS if c != h2d)
    if during_h2d[h2d] < min_ratio * max(during_h2d[d2h], 1.0):
        raise CalibrationError(
            f"direction unclear: during the host→device copy tx={during_h2d['tx']:.0f} B, "
            f"rx={during_h2d['rx']:.0f} B (want one ≥ {min_ratio}× the other)"
        )
    if during_d2h[d2h] < min_ratio * max(during_d2h[h2d], 1.0):
        raise CalibrationError(
            f"direction not confirmed: the host→device copy moved {h2d} most, but during the "
            f"device→host copy tx={during_d2h['tx']:.0f} B, rx={during_d2h['rx']:.0f} B "
            f"(want {d2h} ≥ {min_ratio}× {h2d})"
        )
    return h2d


@dataclass(frozen=True)
class Calibration:
    """Counted bytes per payload byte, for each counter and each direction of transfer.

    ``h2d_factor`` (counted on the H2D counter per H2D payload byte, ~1.09) and ``d2h_factor`` are the
    per-direction overhead factors; the cross terms (e.g. read requests the GPU sends while it pulls
    H2D data) are small but real, so payloads are found by inverting the whole 2×2 matrix.
    """

    h2d_counter: str
    h2d_factor: float
    d2h_factor: float
    h2d_cross: float  # counted on the D2H counter per H2D payload byte
    d2h_cross: float  # counted on the H2D counter per D2H payload byte
    rel_noise: float  # spread of the repeats relative to the factor (worst direction)
    payload_bytes: int
    repeats: int

    @property
    def d2h_counter(self) -> str:
        return "tx" if self.h2d_counter == "rx" else "rx"

    def payload(self, h2d_counted: float, d2h_counted: float) -> tuple[float, float]:
        """(H2D payload, D2H payload) from the counted bytes of the H2D and D2H counters."""
        a, b = self.h2d_factor, self.d2h_cross
        c, d = self.h2d_cross, self.d2h_factor
        det = a * d - b * c
        if det <= 0:
            raise CalibrationError(f"calibration matrix is singular (det={det:g})")
        h2d = (d * h2d_counted - b * d2h_counted) / det
        d2h = (a * d2h_counted - c * h2d_counted) / det
        # Small negatives are noise in the cross-term subtraction, not negative traffic.
        return max(0.0, h2d), max(0.0, d2h)

    def to_dict(self) -> dict[str, Any]:
        return {
            "h2d_counter": self.h2d_counter,
            "d2h_counter": self.d2h_counter,
            "h2d_overhead_factor": round(self.h2d_factor, 5),
            "d2h_overhead_factor": round(self.d2h_factor, 5),
            "h2d_cross_factor": round(self.h2d_cross, 5),
            "d2h_cross_factor": round(self.d2h_cross, 5),
            "rel_noise": round(self.rel_noise, 5),
            "payload_bytes": self.payload_bytes,
            "repeats": self.repeats,
        }


def calibrate_from(
    h2d_runs: Sequence[dict[str, float]], d2h_runs: Sequence[dict[str, float]], payload_bytes: int
) -> Calibration:
    """Calibration from drift-corrected counts ({"tx": B, "rx": B}) of known copies of ``payload_bytes``."""
    if not h2d_runs or not d2h_runs or len(h2d_runs) != len(d2h_runs):
        raise CalibrationError("calibration needs the same number (≥ 1) of host→device and device→host runs")
    if payload_bytes <= 0:
        raise CalibrationError("calibration payload must be positive")
    h2d = infer_h2d_counter(_median_counts(h2d_runs), _median_counts(d2h_runs))
    d2h = "tx" if h2d == "rx" else "rx"
    h2d_factors = [run[h2d] / payload_bytes for run in h2d_runs]
    d2h_factors = [run[d2h] / payload_bytes for run in d2h_runs]
    return Calibration(
        h2d_counter=h2d,
        h2d_factor=statistics.median(h2d_factors),
        d2h_factor=statistics.median(d2h_factors),
        h2d_cross=statistics.median(run[d2h] / payload_bytes for run in h2d_runs),
        d2h_cross=statistics.median(run[h2d] / payload_bytes for run in d2h_runs),
        rel_noise=max(_rel_range(h2d_factors), _rel_range(d2h_factors)),
        payload_bytes=payload_bytes,
        repeats=len(h2d_runs),
    )


def _median_counts(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    return {c: statistics.median(run[c] for run in runs) for c in COUNTERS}


def _rel_range(values: Sequence[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else float("inf")


# ---------------------------------------------------------------------------------------------- polling


class CounterPoller:
    """Reads ``read() -> (tx, rx)`` every ``period_s`` on a background thread.

    The first and last samples are taken in the caller's thread (in ``start`` and ``stop``), so the
    window is exactly bracketed and only one thread ever calls ``read`` at a time.
    """

    def __init__(
        self,
        read: Callable[[], tuple[int, int]],
        period_s: float = POLL_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._period = period_s
        self._clock = clock
        self._samples: list[CounterSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def _sample(self) -> None:
        tx, rx = self._read()
        self._samples.append(CounterSample(self._clock(), int(tx), int(rx)))

    def start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="nvml-pcie-poller", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = self._clock()
        while True:
            deadline += self._period
            # Sleep to the next deadline, not a fixed period, so the call's own cost does not add up.
            if self._stop.wait(max(0.0, deadline - self._clock())):
                return
            try:
                self._sample()
            except Exception as exc:
                self.error = f"counter read failed while polling: {describe_error(exc)}"
                return

    def samples(self) -> list[CounterSample]:
        return list(self._samples)

    def stop(self) -> list[CounterSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is None:
            self._sample()
        return self.samples()


# ---------------------------------------------------------------------------------------------- NVML access


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


def device_memory(pynvml: Any, handle: Any) -> dict[str, Any]:
    """NVML memory info, v2 where the driver has it (its ``used`` excludes driver-reserved memory)."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return {
                "nvml_memory_info": "v2",
                "used_bytes": int(info.used),
                "reserved_bytes": int(info.reserved),
                "total_bytes": int(info.total),
            }
        except Exception:
            pass  # older driver: fall back to v1
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception as exc:
        return {"nvml_memory_info": None, "reason": describe_error(exc)}
    return {"nvml_memory_info": "v1", "used_bytes": int(info.used), "total_bytes": int(info.total)}


class GpmDramBandwidth:
    """DRAM bandwidth utilisation (% of peak) between ``begin`` and ``end`` via GPM, where supported."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self._nvml = pynvml
        self._handle = handle
        self._first: Any = None
        self.reason: str | None = None
        try:
            if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self.reason = "GPM not supported on this device (needs Hopper or newer, no MIG)"
        except Exception as exc:
            self.reason = f"GPM unavailable: {describe_error(exc)}"

    @property
    def supported(self) -> bool:
        return self.reason is None

    def begin(self) -> None:
        if self.supported:
            try:
                self._first = self._nvml.nvmlGpmSampleGet(self._handle, self._nvml.nvmlGpmSampleAlloc())
            except Exception as exc:
                self.reason = f"GPM sample failed: {describe_error(exc)}"

    def end(self) -> float | None:
        if not self.supported or self._first is None:
            return None
        nvml = self._nvml
        second = None
        try:
            second = nvml.nvmlGpmSampleGet(self._handle, nvml.nvmlGpmSampleAlloc())
            query = nvml.c_nvmlGpmMetricsGet_t()
            query.version = nvml.NVML_GPM_METRICS_GET_VERSION
            query.numMetrics = 1
            query.sample1 = self._first
            query.sample2 = second
            query.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
            nvml.nvmlGpmMetricsGet(query)
            metric = query.metrics[0]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:
                self.reason = f"GPM DRAM_BW_UTIL: {describe_error(nvml.NVMLError(metric.nvmlReturn))}"
                return None
            value = float(metric.value)
            if not math.isfinite(value):
                # Seen on an H200 for a 46 ms window: GPM answers success with NaN. Unsupported, not 0.
                self.reason = "GPM DRAM_BW_UTIL returned no finite value for this window"
                return None
            return value
        except Exception as exc:
            self.reason = f"GPM metrics failed: {describe_error(exc)}"
            return None
        finally:
            for sample in (self._first, second):
                if sample is not None:
                    # A failed free leaks a few bytes; nothing measured depends on it.
                    with contextlib.suppress(Exception):
                        nvml.nvmlGpmSampleFree(sample)
            self._first = None


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class TrafficMeasurement:
    """Bytes that crossed PCIe while ``fn`` ran. ``None`` values come with ``reason``; never 0 for unknown.

    ``h2d_bytes``/``d2h_bytes`` are counted bytes (protocol overhead included) minus idle drift;
    ``*_payload_bytes`` are estimates of the data itself after calibration; ``*_noise_bytes`` are the
    drift uncertainty of the counted figures (payload noise adds the calibration's relative noise).
    ``dram_bw_util_pct`` (GPM, % of peak DRAM bandwidth over the window) has no noise figure: one reading.
    """

    h2d_bytes: int | None
    d2h_bytes: int | None
    h2d_payload_bytes: float | None
    d2h_payload_bytes: float | None
    duration_s: float
    valid: bool
    reason: str | None
    h2d_noise_bytes: float | None = None
    d2h_noise_bytes: float | None = None
    payload_rel_noise: float | None = None
    wraps: dict[str, int] = field(default_factory=dict)
    n_samples: int = 0
    max_gap_s: float | None = None
    gpu_uuid: str | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    dram_bw_util_pct: float | None = None
    dram_bw_reason: str | None = None

    @classmethod
    def unsupported(
        cls, reason: str, duration_s: float = 0.0, gpu_uuid: str | None = None
    ) -> TrafficMeasurement:
        return cls(None, None, None, None, duration_s, False, f"unsupported: {reason}", gpu_uuid=gpu_uuid)

    def to_record(
        self, suite: str, name: str, params: dict[str, str], primary: str = "h2d_payload_bytes"
    ) -> BenchRecord:
        """This measurement as a ``run.traffic`` record (same shape as benchmark records)."""
        why = self.reason or "not measured"

        def figure(value: float | None, noise: float | None, unit: str = "B") -> Metric:
            if value is None or not self.valid:
                return Metric.missing(unit, "lower", why)
            return Metric(unit=unit, value=value, spread=noise, better="lower", n=1)

        payload_noise = self.payload_rel_noise
        metrics = {
            "h2d_bytes": figure(self.h2d_bytes, self.h2d_noise_bytes),
            "d2h_bytes": figure(self.d2h_bytes, self.d2h_noise_bytes),
            "h2d_payload_bytes": figure(
                self.h2d_payload_bytes,
                _payload_noise(self.h2d_payload_bytes, self.h2d_noise_bytes, payload_noise),
            ),
            "d2h_payload_bytes": figure(
                self.d2h_payload_bytes,
                _payload_noise(self.d2h_payload_bytes, self.d2h_noise_bytes, payload_noise),
            ),
            # The window's edges are known to within one poll gap.
            "duration": Metric(unit="s", value=self.duration_s, spread=self.max_gap_s, better="lower", n=1),
        }
        if self.dram_bw_util_pct is not None:
            metrics["dram_bw_util"] = Metric(
                unit="%", value=self.dram_bw_util_pct, spread=None, better="lower", n=1
            )
        conditions: dict[str, Any] = {
            "gpu_uuid": self.gpu_uuid,
            "valid": self.valid,
            "n_samples": self.n_samples,
            "max_poll_gap_s": self.max_gap_s,
            "counter_wraps": dict(self.wraps),
            "memory": dict(self.memory),
        }
        if self.reason:
            conditions["reason"] = self.reason
        if self.dram_bw_reason:
            conditions["dram_bw_reason"] = self.dram_bw_reason
        return BenchRecord(
            suite=suite, name=name, params=params, primary=primary, metrics=metrics, conditions=conditions
        )


def _payload_noise(value: float | None, counted_noise: float | None, rel: float | None) -> float | None:
    if value is None or counted_noise is None or rel is None:
        return None
    return counted_noise + rel * value


# ---------------------------------------------------------------------------------------------- the meter

# Calibration holds for a device until the process ends (same link, same driver): one per UUID.
_calibrations: dict[str, Calibration] = {}
_calibrations_lock = threading.Lock()


class TrafficMeter:
    """Measures PCIe bytes of a workload on one GPU. Use as a context manager::

        with TrafficMeter(0) as meter:
            m = meter.measure(lambda: host_tensor.to("cuda"))

    ``device`` is a torch CUDA index (honours CUDA_VISIBLE_DEVICES) or an NVML UUID. Entering takes the
    GPU's cross-process lock, measures idle drift and calibrates (once per GPU per process). Where the
    counters cannot be read, ``supported`` is False, ``reason`` says why, and ``measure`` still runs the
    workload but returns ``None`` figures with that reason.
    """

    def __init__(
        self,
        device: int | str = 0,
        *,
        poll_period_s: float = POLL_PERIOD_S,
        safe_gap_s: float = SAFE_GAP_S,
        drift_s: float = DEFAULT_DRIFT_S,
        calibrate: bool = True,
        calibration_bytes: int = DEFAULT_CALIBRATION_BYTES,
        calibration_repeats: int = DEFAULT_CALIBRATION_REPEATS,
        lock_timeout_s: float | None = None,
        counter_source: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.device = device
        # Replaces NVML as the (tx, rx) source: simulated links in tests, replays. No memory/GPM then.
        self.counter_source = counter_source
        self.poll_period_s = poll_period_s
        self.safe_gap_s = safe_gap_s
        self.drift_s = drift_s
        self.calibrate = calibrate
        self.calibration_bytes = calibration_bytes
        self.calibration_repeats = calibration_repeats
        self.lock_timeout_s = lock_timeout_s
        self.uuid: str | None = None
        self.reason: str | None = "meter not entered"
        self.drift: Drift | None = None
        self.calibration: Calibration | None = None
        self.calibration_reason: str | None = None
        self.publish_interval_s: float | None = None  # how often the counters changed while idle
        self._stack: ExitStack | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._read: Callable[[], tuple[int, int]] | None = None

    @property
    def supported(self) -> bool:
        return self.reason is None

    @property
    def reader(self) -> Callable[[], tuple[int, int]]:
        """The raw ``(tx, rx)`` counter read, for diagnostics; only while entered and supported."""
        if self._read is None:
            raise RuntimeError(f"no counter reader: {self.reason}")
        return self._read

    @property
    def device_index(self) -> int | None:
        return self.device if isinstance(self.device, int) else None

    # -- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> TrafficMeter:
        self._stack = ExitStack()
        try:
            self._open()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _open(self) -> None:
        assert self._stack is not None
        try:
            self.uuid = self.device if isinstance(self.device, str) else torch_device_uuid(self.device)
            if self.counter_source is not None:
                read = self.counter_source
            else:
                self._nvml = self._stack.enter_context(nvml_session())
                self._handle = nvml_handle(self._nvml, self.uuid)
                read = pcie_counter_reader(self._nvml, self._handle)
            try:
                read()  # a probe: per-field errors (NOT_SUPPORTED on MIG, old GPUs) surface here
            except NvmlUnavailable:
                raise
            except Exception as exc:
                raise CounterUnsupported(f"PCIe byte counters unreadable: {describe_error(exc)}") from exc
        except NvmlUnavailable as exc:
            self.reason = str(exc)
            return
        self._stack.enter_context(gpu_lock(self.uuid, timeout_s=self.lock_timeout_s))
        self._read = read
        self.reason = None
        self.drift = self.measure_drift(self.drift_s)
        if self.calibrate:
            self._ensure_calibration()

    def __exit__(self, *exc_info: object) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        self._read = None

    # -- measuring -------------------------------------------------------------------------------------

    def _poll(
        self, fn: Callable[[], object] | None, idle_s: float = 0.0
    ) -> tuple[list[CounterSample], str | None]:
        assert self._read is not None
        poller = CounterPoller(self._read, self.poll_period_s)
        # The poller is a Python thread, so whatever holds the GIL long starves it: poll gaps of 159-278 ms
        # made ASR pipeline windows invalid on an H200. A full garbage collection in a process that
        # imported torch's compiler is one such holder; collections wait until the window ends, as
        # timeit does for its loops.
        collecting = gc.isenabled()
        gc.disable()
        poller.start()
        try:
            if fn is not None:
                fn()
                self._synchronize()
                self._settle(poller)
            if idle_s > 0:
                time.sleep(idle_s)
        finally:
            samples = poller.stop()
            if collecting:
                gc.enable()
        return samples, poller.error

    def _settle(self, poller: CounterPoller) -> None:
        window = settle_window(self.publish_interval_s)
        deadline = time.monotonic() + SETTLE_MAX_S
        time.sleep(window)
        while not is_settled(poller.samples(), window) and time.monotonic() < deadline:
            time.sleep(window / 4)

    def _synchronize(self) -> None:
        if self.device_index is None:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize(self.device_index)

    def measure_drift(self, duration_s: float = DEFAULT_DRIFT_S) -> Drift:
        """Idle drift over ``duration_s``; falls back to zero drift with a noted reason if unusable."""
        samples, error = self._poll(None, idle_s=duration_s)
        try:
            if error:
                raise CalibrationError(error)
            drift = drift_from_samples(samples, self.safe_gap_s)
            self.publish_interval_s = update_interval(samples)
            return drift
        except CalibrationError as exc:
            self.calibration_reason = f"idle drift not measured ({exc}); assuming none"
            return ZERO_DRIFT

    def measure_counts(self, fn: Callable[[], object]) -> tuple[CounterTotals, dict[str, float]]:
        """Raw totals and drift-corrected counts per counter ({"tx", "rx"}) while ``fn`` runs."""
        samples, error = self._poll(fn)
        totals = integrate(samples, safe_gap_s=self.safe_gap_s)
        if error:
            totals = dataclasses.replace(totals, valid=False, reason=error)
        return totals, subtract_drift(totals, self.drift or ZERO_DRIFT)

    def measure(self, fn: Callable[[], object]) -> TrafficMeasurement:
        """Run ``fn`` (then synchronise the device) and return the PCIe bytes it moved."""
        if not self.supported or self._read is None:
            start = time.monotonic()
            fn()
            self._synchronize()
            return TrafficMeasurement.unsupported(
                self.reason or "meter not entered", time.monotonic() - start, self.uuid
            )
        if self._nvml is None:
            totals, counts = self.measure_counts(fn)
            return self._result(totals, counts, {}, None, "no NVML: custom counter source")
        memory_before = device_memory(self._nvml, self._handle)
        self._reset_torch_peak()
        gpm = GpmDramBandwidth(self._nvml, self._handle)
        gpm.begin()
        totals, counts = self.measure_counts(fn)
        dram = gpm.end()
        memory = {
            "before": memory_before,
            "after": device_memory(self._nvml, self._handle),
            **self._torch_peak(),
        }
        return self._result(totals, counts, memory, dram, gpm.reason)

    def _result(
        self,
        totals: CounterTotals,
        counts: dict[str, float],
        memory: dict[str, Any],
        dram: float | None,
        dram_reason: str | None,
    ) -> TrafficMeasurement:
        drift = self.drift or ZERO_DRIFT
        cal = self.calibration
        wraps = {c: totals.wraps(c) for c in COUNTERS}
        common: dict[str, Any] = {
            "duration_s": totals.duration_s,
            "wraps": wraps,
            "n_samples": totals.n_samples,
            "max_gap_s": totals.max_gap_s,
            "gpu_uuid": self.uuid,
            "memory": memory,
            "dram_bw_util_pct": dram,
            "dram_bw_reason": dram_reason,
        }
        if not totals.valid:
            return TrafficMeasurement(
                None, None, None, None, valid=False, reason=f"invalid: {totals.reason}", **common
            )
        if cal is None:
            # Without calibration the direction of each counter is NVML's documented one (RX = to the GPU).
            h2d_c, d2h_c = "rx", "tx"
            reason = f"uncalibrated: {self.calibration_reason or 'calibration not run'}; no payload estimate"
            payload: tuple[float | None, float | None] = (None, None)
        else:
            h2d_c, d2h_c = cal.h2d_counter, cal.d2h_counter
            reason = self.calibration_reason
            payload = cal.payload(counts[h2d_c], counts[d2h_c])
        return TrafficMeasurement(
            h2d_bytes=round(counts[h2d_c]),
            d2h_bytes=round(counts[d2h_c]),
            h2d_payload_bytes=payload[0],
            d2h_payload_bytes=payload[1],
            valid=True,
            reason=reason,
            h2d_noise_bytes=drift_noise_bytes(totals.duration_s, drift, h2d_c),
            d2h_noise_bytes=drift_noise_bytes(totals.duration_s, drift, d2h_c),
            payload_rel_noise=None if cal is None else cal.rel_noise,
            **common,
        )

    def _reset_torch_peak(self) -> None:
        if self.device_index is not None:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device_index)

    def _torch_peak(self) -> dict[str, Any]:
        if self.device_index is None:
            return {
                "torch_peak_allocated_bytes": None,
                "torch_peak_reason": "device given by UUID, not torch index",
            }
        import torch

        return {"torch_peak_allocated_bytes": int(torch.cuda.max_memory_allocated(self.device_index))}

    # -- calibration -----------------------------------------------------------------------------------

    def _ensure_calibration(self, force: bool = False) -> None:
        assert self.uuid is not None
        with _calibrations_lock:
            cached = None if force else _calibrations.get(self.uuid)
        if cached is not None:
            self.calibration = cached
            return
        try:
            self.calibration = self.run_calibration()
        except (CalibrationError, RuntimeError) as exc:
            self.calibration = None
            self.calibration_reason = f"calibration failed: {describe_error(exc)}"
            return
        with _calibrations_lock:
            _calibrations[self.uuid] = self.calibration

    def run_calibration(self) -> Calibration:
        """Copy a pinned buffer of ``calibration_bytes`` each way, ``calibration_repeats`` times."""
        if self.device_index is None:
            raise CalibrationError("calibration needs a torch device index (the meter was given a UUID)")
        import torch

        device = torch.device("cuda", self.device_index)
        n = self.calibration_bytes
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        dev.random_(0, 256)  # never zeros: a link or driver could compress them
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host.copy_(dev)  # also the warm-up: first-touch costs stay out of the figures
        dev.copy_(host)
        torch.cuda.synchronize(device)
        return self.calibrate_with(
            lambda: dev.copy_(host, non_blocking=True), lambda: host.copy_(dev, non_blocking=True), n
        )

    def calibrate_with(
        self, h2d_copy: Callable[[], object], d2h_copy: Callable[[], object], payload_bytes: int
    ) -> Calibration:
        """Calibration from two copies of ``payload_bytes`` each, measured ``calibration_repeats`` times."""
        runs: dict[str, list[dict[str, float]]] = {"h2d": [], "d2h": []}
        for _ in range(self.calibration_repeats):
            for direction, copy in (("h2d", h2d_copy), ("d2h", d2h_copy)):
                totals, counts = self.measure_counts(copy)
                if not totals.valid:
                    raise CalibrationError(f"calibration {direction} transfer not measured: {totals.reason}")
                runs[direction].append(counts)
        return calibrate_from(runs["h2d"], runs["d2h"], payload_bytes)

    def describe(self) -> dict[str, Any]:
        """The meter's state for a record's conditions: device, drift, calibration, poll settings."""
        drift = self.drift
        return {
            "gpu_uuid": self.uuid,
            "supported": self.supported,
            "reason": self.reason,
            "poll_period_s": self.poll_period_s,
            "safe_gap_s": round(self.safe_gap_s, 6),
            "counter_publish_interval_s": self.publish_interval_s,
            "settle_window_s": settle_window(self.publish_interval_s),
            "drift_bytes_per_s": None if drift is None else {c: round(drift.rate(c), 1) for c in COUNTERS},
            "drift_noise_bytes_per_s": None
            if drift is None
            else {c: round(drift.noise(c), 1) for c in COUNTERS},
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "calibration_reason": self.calibration_reason,
        }
