"""Shared by the bench suites' self-tests (test_bench_suites, test_bench_pipelines): the repository root, a
record's round trip through its dict and synthetic traffic and latency figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.nvml_traffic import TrafficMeasurement
from harness.records import BenchRecord
from harness.timing import summarize

ROOT = Path(__file__).resolve().parents[2]


def round_trips(record: BenchRecord) -> dict[str, Any]:
    data = record.to_dict()
    assert BenchRecord.from_dict(data).to_dict() == data
    assert data["primary"] in data["metrics"]
    assert all(isinstance(v, str) for v in data["params"].values())
    return data


def _traffic(d2h: float, h2d: float, valid: bool = True) -> TrafficMeasurement:
    return TrafficMeasurement(
        h2d_bytes=round(h2d * 1.09),
        d2h_bytes=round(d2h * 1.09),
        h2d_payload_bytes=h2d,
        d2h_payload_bytes=d2h,
        duration_s=1.5,
        valid=valid,
        reason=None if valid else "invalid: missed polls",
        h2d_noise_bytes=1e5,
        d2h_noise_bytes=2e5,
        payload_rel_noise=0.01,
        max_gap_s=0.002,
    )


def _latency(value: float) -> Any:
    return summarize([value * f for f in (0.98, 1.0, 1.01, 1.03)], "s")
