"""Calibration of the PCIe byte counters: which counter carries host→device data and how many bytes each
counts per payload byte of each direction (``Calibration``, from the drift-corrected counts of known
copies), and the per-process cache of one calibration per GPU."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.nvml_counters import COUNTERS, CalibrationError

DEFAULT_CALIBRATION_BYTES = 1 << 30
DEFAULT_CALIBRATION_REPEATS = 3
# During one direction's copy the counter of that direction must exceed the other by this much.
DIRECTION_MIN_RATIO = 3.0


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


# Calibration holds for a device until the process ends (same link, same driver): one per UUID.
_calibrations: dict[str, Calibration] = {}
_calibrations_lock = threading.Lock()


def cached_calibration(uuid: str) -> Calibration | None:
    """The calibration this process made for the GPU ``uuid``, if any."""
    with _calibrations_lock:
        return _calibrations.get(uuid)


def remember_calibration(uuid: str, calibration: Calibration) -> None:
    """Keep ``calibration`` for the GPU ``uuid`` until the process ends."""
    with _calibrations_lock:
        _calibrations[uuid] = calibration
