"""PCIe bytes a mechanism saved, as NVML measures them: the check behind rules
``device_placement/skip-copy-pcie`` and ``device_placement/pcie`` (chapter ``device_placement``) and the
sizing the ``pipelines`` bench shares with it.

One execute moves KBs, below the NVML counters' noise, so K back-to-back executes are measured in one
window and the figures divided by K (``choose_runs``). The expected saving of a mechanism is computed from
the tensors the caller sees, never from the backend's own counters: host inputs must cross host→device,
host outputs device→host, device-resident ones must not. Launch and synchronisation traffic mostly
cancels in the difference, but not entirely: a runtime keeping tensors on the device takes another code
path (other launches, device-to-device copies), and every launch reads its commands across PCIe. So each
saving carries an allowance for command traffic (``COMMAND_ALLOWANCE``), and savings too small to be
judged beside it are reported as below the meter's resolution.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conformance.common.checks import fail

if TYPE_CHECKING:
    from harness.nvml_traffic import TrafficMeasurement

#: A saving is judged only where it is at least this many times the noise of the NVML difference (the
#: noise alone then moves the measured saving by at most 10 %); below it the meter cannot tell.
RESOLUTION_FACTOR = 10.0
#: A resolvable saving must reach this share of the expected bytes: less means bytes that should not cross
#: PCIe still did (a round trip, a staging copy).
MIN_SHARE = 0.9
#: ... by more than this many times the noise: with the saving resolvable (at least 10 x its noise), a
#: correct backend still falls 10 % short one time in six by noise alone; a shortfall judged against the
#: bound with no margin was a false alarm that often. A copy the mechanism should have saved costs the
#: whole saving (>= 10 noise), far past the margin.
SIGNIFICANCE = 3.0
#: ... and less this many bytes per execute of command traffic that differs between the two code paths. On
#: an H100 the ASR's export-time windows (2.5 kB savings, noise ±0.2 kB) came 0.9-2.1 kB short for the
#: reference in three runs: more launches on the device path, not data. A saving is judged only where it
#: is at least ``COMMAND_FACTOR`` times this, so a copy the mechanism should have saved still fails far
#: past the bound.
COMMAND_ALLOWANCE = 3 * 1024
COMMAND_FACTOR = 4
#: The least saving the meter can ever judge, whatever its noise (``Saving.resolution``).
FLOOR = COMMAND_FACTOR * COMMAND_ALLOWANCE
NVML_MAX_RUNS = 100_000


def choose_runs(
    bytes_per_run: int,
    seconds_per_run: float,
    target_bytes: int,
    cap_s: float,
    max_runs: int = NVML_MAX_RUNS,
) -> tuple[int, str]:
    """(K, why): back-to-back runs per NVML window so the counted bytes reach ``target_bytes``.

    K stops short where K runs would take longer than ``cap_s`` (or exceed ``max_runs``); at least 1.
    """
    by_bytes = math.ceil(target_bytes / bytes_per_run) if bytes_per_run > 0 else max_runs
    by_time = max(1, math.floor(cap_s / seconds_per_run)) if seconds_per_run > 0 else max_runs
    runs = max(1, min(by_bytes, by_time, max_runs))
    if runs == by_bytes:
        why = f"runtime-counted bytes reach {target_bytes / 2**20:.0f} MiB"
    elif runs == by_time:
        why = f"time cap {cap_s:g} s (bytes would need {by_bytes} runs)"
    else:
        why = f"run cap {max_runs}"
    return runs, why


@dataclass(frozen=True)
class PerRunTraffic:
    """NVML figures of a K-run window divided by K: payload estimates and their noise, per direction."""

    runs: int
    valid: bool
    reason: str | None
    h2d: float | None = None
    d2h: float | None = None
    h2d_noise: float | None = None
    d2h_noise: float | None = None
    h2d_counted: float | None = None
    d2h_counted: float | None = None
    h2d_drift_noise: float | None = None
    d2h_drift_noise: float | None = None
    """The idle-drift part of the noise alone (independent between windows); the rest of ``*_noise`` is the
    calibration's relative noise times the payload, a scale error every window of one meter shares."""
    rel_noise: float | None = None
    window_s: float = 0.0
    window: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_measurement(cls, m: TrafficMeasurement, runs: int) -> PerRunTraffic:
        def per(value: float | None) -> float | None:
            return None if value is None or not m.valid else value / runs

        def noise(payload: float | None, counted_noise: float | None) -> float | None:
            if payload is None or counted_noise is None or not m.valid:
                return None
            return (counted_noise + (m.payload_rel_noise or 0.0) * payload) / runs

        return cls(
            runs=runs,
            valid=m.valid,
            reason=m.reason,
            h2d=per(m.h2d_payload_bytes),
            d2h=per(m.d2h_payload_bytes),
            h2d_noise=noise(m.h2d_payload_bytes, m.h2d_noise_bytes),
            d2h_noise=noise(m.d2h_payload_bytes, m.d2h_noise_bytes),
            h2d_counted=per(m.h2d_bytes),
            d2h_counted=per(m.d2h_bytes),
            h2d_drift_noise=per(m.h2d_noise_bytes),
            d2h_drift_noise=per(m.d2h_noise_bytes),
            rel_noise=m.payload_rel_noise if m.valid else None,
            window_s=m.duration_s,
            window={
                "h2d_counted_bytes": m.h2d_bytes,
                "d2h_counted_bytes": m.d2h_bytes,
                "h2d_payload_bytes": m.h2d_payload_bytes,
                "d2h_payload_bytes": m.d2h_payload_bytes,
                "h2d_noise_bytes": m.h2d_noise_bytes,
                "d2h_noise_bytes": m.d2h_noise_bytes,
                "payload_rel_noise": m.payload_rel_noise,
                "duration_s": m.duration_s,
                "counter_wraps": dict(m.wraps),
                "max_poll_gap_s": m.max_gap_s,
            },
        )

    def minus(self, other: PerRunTraffic) -> PerRunTraffic:
        """This window's per-run figures less ``other``'s: traffic both windows saw (a loop replayed on its
        own, say) taken out. Payloads subtract; drift noises add in quadrature; one calibration scales both,
        so its relative noise stays as it is. Invalid or missing in either: missing, with the reason."""
        if not (self.valid and other.valid):
            return PerRunTraffic(self.runs, False, self.reason if not self.valid else other.reason)

        def sub(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a - b

        def add(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else math.hypot(a, b)

        return dataclasses.replace(
            self,
            h2d=sub(self.h2d, other.h2d),
            d2h=sub(self.d2h, other.d2h),
            h2d_drift_noise=add(self.h2d_drift_noise, other.h2d_drift_noise),
            d2h_drift_noise=add(self.d2h_drift_noise, other.d2h_drift_noise),
            h2d_noise=add(self.h2d_noise, other.h2d_noise),
            d2h_noise=add(self.d2h_noise, other.d2h_noise),
        )

    @classmethod
    def unsupported(cls, reason: str) -> PerRunTraffic:
        return cls(runs=0, valid=False, reason=f"unsupported: {reason}")

    @property
    def why_missing(self) -> str:
        return self.reason or "not measured"

    def note(self) -> str:
        return (
            f"per run: {self.runs} back-to-back runs in one NVML window "
            f"({self.window_s:.2f} s), window payload estimate / {self.runs}"
        )


@dataclass(frozen=True)
class Saving:
    """Bytes per execute one direction should have saved, and what NVML saw: the difference of two windows
    (the host mode's minus the mechanism's), payload estimates divided by K, with its noise."""

    direction: str
    expected: int
    measured: float | None
    noise: float | None

    @property
    def resolution(self) -> float | None:
        """The least saving the meter can judge: ``RESOLUTION_FACTOR`` x the noise, and never less than
        ``COMMAND_FACTOR`` x the command-traffic allowance."""
        if self.noise is None:
            return None
        return max(RESOLUTION_FACTOR * self.noise, FLOOR)

    @property
    def resolvable(self) -> bool:
        res = self.resolution
        return self.expected > 0 and self.measured is not None and res is not None and self.expected >= res

    @property
    def bound(self) -> float:
        """The least measured saving that passes: ``MIN_SHARE`` of the expected bytes, less the margins."""
        return MIN_SHARE * self.expected - SIGNIFICANCE * (self.noise or 0.0) - COMMAND_ALLOWANCE

    @property
    def share(self) -> float | None:
        """Measured / expected: 1.0 means every byte the mechanism should save was saved, and no more."""
        if self.measured is None or self.expected <= 0:
            return None
        return self.measured / self.expected

    def describe(self) -> str:
        if self.measured is None or self.noise is None:
            if 0 < self.expected < FLOOR:
                return (
                    f"{self.direction}: expected {self.expected:,} B saved per execute, under the "
                    f"{FLOOR:,} B the meter can ever judge: not measured"
                )
            return f"{self.direction}: expected {self.expected:,} B saved, not measured"
        return (
            f"{self.direction}: expected {self.expected:,} B saved per execute, NVML {self.measured:,.0f} "
            f"± {self.noise:,.0f} B"
        )


def difference(
    host: PerRunTraffic, other: PerRunTraffic, direction: str
) -> tuple[float | None, float | None]:
    """``host − other`` in ``direction`` ("h2d" or "d2h"), per run, and the noise of that difference.

    The two windows' drift noises are independent and add in quadrature. The calibration's relative noise
    is a scale error both windows share (one meter, one calibration): it scales the difference, not each
    window's total, so it counts once, times the difference. Counting it per window (as the payload noise
    of each does) would bury a 20 kB saving under the noise of two 40 kB totals."""
    a, b = getattr(host, direction), getattr(other, direction)
    if a is None or b is None:
        return None, None
    saved = a - b
    drift_a, drift_b = getattr(host, f"{direction}_drift_noise"), getattr(other, f"{direction}_drift_noise")
    if drift_a is None or drift_b is None:
        return saved, None
    rel = max(host.rel_noise or 0.0, other.rel_noise or 0.0)
    return saved, math.hypot(drift_a, drift_b) + rel * abs(saved)


def worth_measuring(expected: Sequence[int]) -> bool:
    """Whether a window pair with these expected savings (bytes per execute, by direction) can judge any:
    one under ``FLOOR`` stays unjudged whatever NVML counts, so measuring only the unjudged costs the
    GPU-alone phase its time (about 10 s of a one-GPU run's 26 for the ASR's 2.5-3 kB savings)."""
    return any(e >= FLOOR for e in expected)


def check_savings(rule: str, call: str, savings: Sequence[Saving]) -> list[Saving]:
    """Fail ``rule`` where a resolvable saving falls short of ``MIN_SHARE`` of what it should be by more than
    ``SIGNIFICANCE`` times its noise; return the savings too small for the meter to judge (the caller
    reports them as such, never as a pass or a fail)."""
    for saving in savings:
        measured = saving.measured
        if saving.resolvable and measured is not None and measured < saving.bound:
            fail(
                rule,
                call,
                f"{saving.describe()}: only {measured / saving.expected:.0%} of the bytes that should "
                f"not cross PCIe stayed off it (at least {MIN_SHARE:.0%}, less {SIGNIFICANCE:g} x the "
                f"noise and {COMMAND_ALLOWANCE:,} B of command traffic: {saving.bound:,.0f} B); something "
                "still copies them",
            )
    return [s for s in savings if s.expected > 0 and not s.resolvable]
