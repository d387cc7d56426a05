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

This module is the meter (``TrafficMeter``, run around a workload) and its result
(``TrafficMeasurement``); its parts live apart: ``harness.nvml_counters`` (reading, unwrap, drift and
settle maths), ``harness.nvml_poller`` (the polling thread), ``harness.nvml_calibration`` (direction and
overhead) and ``harness.nvml_memory`` (device memory, GPM DRAM bandwidth).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
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
from harness.nvml_calibration import (
    DEFAULT_CALIBRATION_BYTES,
    DEFAULT_CALIBRATION_REPEATS,
    Calibration,
    cached_calibration,
    calibrate_from,
    remember_calibration,
)
from harness.nvml_counters import (
    COUNTERS,
    SAFE_GAP_S,
    SETTLE_MAX_S,
    ZERO_DRIFT,
    CalibrationError,
    CounterSample,
    CounterTotals,
    CounterUnsupported,
    Drift,
    drift_from_samples,
    drift_noise_bytes,
    integrate,
    is_settled,
    pcie_counter_reader,
    settle_window,
    subtract_drift,
    update_interval,
)
from harness.nvml_memory import GpmDramBandwidth, device_memory
from harness.nvml_poller import POLL_PERIOD_S, CounterPoller
from harness.records import BenchRecord, Metric

DEFAULT_DRIFT_S = 0.5
#: Idle windows tried before drift is given up: a window with a missed poll is unusable, and one such stall
#: (199 ms, on an H200, as the shared phase's processes exited) says nothing about the next window.
DRIFT_ATTEMPTS = 3


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

    def measure_drift(self, duration_s: float = DEFAULT_DRIFT_S, attempts: int = DRIFT_ATTEMPTS) -> Drift:
        """Idle drift over the first usable of up to ``attempts`` windows of ``duration_s``; falls back to
        zero drift with a noted reason where none is usable."""
        reasons: list[str] = []
        for _ in range(max(1, attempts)):
            samples, error = self._poll(None, idle_s=duration_s)
            try:
                if error:
                    raise CalibrationError(error)
                drift = drift_from_samples(samples, self.safe_gap_s)
            except CalibrationError as exc:
                reasons.append(str(exc))
                continue
            self.publish_interval_s = update_interval(samples)
            return drift
        tried = f"in {len(reasons)} windows, the last: " if len(reasons) > 1 else ""
        self.calibration_reason = f"idle drift not measured ({tried}{reasons[-1]}); assuming none"
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
        cached = None if force else cached_calibration(self.uuid)
        if cached is not None:
            self.calibration = cached
            return
        try:
            self.calibration = self.run_calibration()
        except (CalibrationError, RuntimeError) as exc:
            self.calibration = None
            self.calibration_reason = f"calibration failed: {describe_error(exc)}"
            return
        remember_calibration(self.uuid, self.calibration)

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
