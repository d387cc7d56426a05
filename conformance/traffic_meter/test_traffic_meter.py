"""Chapter traffic_meter — the PCIe byte meter checks itself before anyone trusts its figures (SPEC §2).

After calibration, known pinned copies host→device and device→host of 16 MiB to 8 GiB must be measured
within ``MAX_ERROR`` (5 %); a copy larger than the 4 GiB counter range must be counted whole (wrap
handling); idle drift is measured and reported. Measured figures are attached to each case as params
(``measured_error_pct`` etc.), so they land in the result file. Every check names its rule as
``traffic_meter/<rule>``. Needs a CUDA device and NVML PCIe counters; skips with the reason otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest
import torch

from conformance.common.checks import fail
from conformance.common.rules import rule_id
from harness import start_gate
from harness.nvml_counters import COUNTER_MODULUS
from harness.nvml_traffic import TrafficMeasurement, TrafficMeter
from harness.pytest_plugin import set_case_params

# The meter checks itself: no backend is involved (its cases are the suite's, never the backend's passes).
pytestmark = [pytest.mark.gpu, pytest.mark.traffic, pytest.mark.slow, pytest.mark.suite_check]

# The rules this module checks (conformance/catalogue/rule_table.py).
CALIBRATION = rule_id("traffic_meter/calibration")
DIRECTION = rule_id("traffic_meter/direction")
OVERHEAD = rule_id("traffic_meter/overhead")
VALID = rule_id("traffic_meter/valid")
ACCURACY = rule_id("traffic_meter/accuracy")
WRAP = rule_id("traffic_meter/wrap")
DRIFT = rule_id("traffic_meter/drift")


MiB = 1 << 20
GiB = 1 << 30
SIZES = {"16MiB": 16 * MiB, "256MiB": 256 * MiB, "1GiB": GiB, "4GiB": 4 * GiB, "8GiB": 8 * GiB}
DIRECTIONS = ["h2d", "d2h"]
MAX_ERROR = 0.05  # relative, after calibration
ATTEMPTS = 3
WRAP_SIZE = 6 * GiB  # more than the 2^32-byte counter range
# Idle drift measured on an H200 is ~0.5 MB/s; two orders of magnitude more means something else talks.
MAX_IDLE_DRIFT_BYTES_PER_S = 50e6


@pytest.fixture(scope="module")
def meter() -> Iterator[TrafficMeter]:
    with TrafficMeter(torch.cuda.current_device()) as m:
        if not m.supported:
            pytest.skip(f"PCIe byte counters unsupported here: {m.reason}")
        yield m


@functools.cache
def _buffers() -> tuple[torch.Tensor, torch.Tensor]:
    largest = max(*SIZES.values(), WRAP_SIZE)
    device = torch.device("cuda", torch.cuda.current_device())
    dev = torch.empty(largest, dtype=torch.uint8, device=device)
    dev.random_(0, 256)  # random bytes: nothing along the way can compress them
    host = torch.empty(largest, dtype=torch.uint8, pin_memory=True)
    host.copy_(dev)
    torch.cuda.synchronize(device)
    return host, dev


@start_gate.while_held  # pinning 8 GiB takes seconds: done while the GPU-alone phase waits its turn
def _pin_buffers(config: pytest.Config) -> None:
    _buffers()


@pytest.fixture(scope="module")
def buffers(meter: TrafficMeter) -> tuple[torch.Tensor, torch.Tensor]:
    """One pinned host and one device buffer of the largest size; smaller cases use their prefixes."""
    return _buffers()


def copy_fn(direction: str, host: torch.Tensor, dev: torch.Tensor, nbytes: int) -> Callable[[], object]:
    h, d = host[:nbytes], dev[:nbytes]
    if direction == "h2d":
        return lambda: d.copy_(h, non_blocking=True)
    return lambda: h.copy_(d, non_blocking=True)


def moved(m: TrafficMeasurement, direction: str) -> tuple[float | None, float | None]:
    """(payload in the copy's direction, payload in the other direction)."""
    if direction == "h2d":
        return m.h2d_payload_bytes, m.d2h_payload_bytes
    return m.d2h_payload_bytes, m.h2d_payload_bytes


def require_calibration(meter: TrafficMeter) -> None:
    if meter.calibration is None:
        fail(CALIBRATION, "TrafficMeter", f"no calibration: {meter.calibration_reason}")


@pytest.mark.rules(CALIBRATION, DIRECTION, OVERHEAD)
def test_calibration_confirms_direction_and_overhead(
    meter: TrafficMeter, request: pytest.FixtureRequest
) -> None:
    require_calibration(meter)
    cal = meter.calibration
    assert cal is not None
    set_case_params(request.node, {f"calibration_{k}": v for k, v in cal.to_dict().items()})
    # NVML counts from the device's side: RX is traffic to the GPU. Calibration found it independently.
    if cal.h2d_counter != "rx":
        fail(
            DIRECTION,
            "calibration",
            f"the counter that moved during a host→device copy is {cal.h2d_counter!r}, not 'rx' as NVML "
            "documents (RX = to the GPU); figures stay correct (the meter follows calibration) but check "
            "the driver",
        )
    for name, factor in (("h2d", cal.h2d_factor), ("d2h", cal.d2h_factor)):
        if not 1.0 <= factor <= 1.3:
            fail(
                OVERHEAD,
                "calibration",
                f"{name} counts {factor:.3f} bytes per payload byte; PCIe protocol overhead should put it "
                "between 1.0 and 1.3 (~1.09 measured on an H200)",
            )
    if cal.rel_noise > MAX_ERROR / 2:
        fail(CALIBRATION, "calibration", f"repeats disagree by {cal.rel_noise:.1%} (want ≤ 2.5%)")


@pytest.mark.rules(CALIBRATION, VALID, ACCURACY)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_known_transfer_measured_within_error(
    meter: TrafficMeter,
    buffers: tuple[torch.Tensor, torch.Tensor],
    size: int,
    direction: str,
    request: pytest.FixtureRequest,
) -> None:
    measure_copy(meter, buffers, size, direction, request)


def measure_copy(
    meter: TrafficMeter,
    buffers: tuple[torch.Tensor, torch.Tensor],
    size: int,
    direction: str,
    request: pytest.FixtureRequest,
) -> TrafficMeasurement:
    """Measure a known copy; up to ``ATTEMPTS`` tries, since traffic from other processes only adds bytes.

    A meter that is really wrong fails every attempt; the attempts used are recorded with the figures.
    """
    require_calibration(meter)
    host, dev = buffers
    call = f"{direction} copy of {size / MiB:.0f} MiB"
    attempts = 0
    while True:
        attempts += 1
        m = meter.measure(copy_fn(direction, host, dev, size))
        problems = measurement_problems(m, size, direction)
        if not problems or attempts == ATTEMPTS:
            break
    ours, other = moved(m, direction)
    set_case_params(
        request.node,
        {
            "attempts": attempts,
            "measured_payload_bytes": None if ours is None else round(ours),
            "measured_error_pct": "n/a" if ours is None else f"{100 * (ours - size) / size:+.2f}",
            "other_direction_bytes": None if other is None else round(other),
            "counted_h2d_bytes": m.h2d_bytes,
            "counted_d2h_bytes": m.d2h_bytes,
            "counter_wraps": m.wraps,
            "duration_s": f"{m.duration_s:.4f}",
        },
    )
    if problems:
        rule, message = problems[0]
        fail(rule, call, f"{message} (after {ATTEMPTS} attempts)")
    return m


def measurement_problems(m: TrafficMeasurement, size: int, direction: str) -> list[tuple[str, str]]:
    """(rule, message) for every way ``m`` misses the known copy; empty when it is right."""
    if not m.valid:
        return [(VALID, f"measurement invalid: {m.reason}")]
    ours, other = moved(m, direction)
    if ours is None or other is None:
        return [(CALIBRATION, f"no payload estimate: {m.reason}")]
    problems = []
    error = (ours - size) / size
    if abs(error) > MAX_ERROR:
        problems.append(
            (
                ACCURACY,
                f"measured {ours:.0f} B of payload, {100 * error:+.2f}% off the {size} B copied "
                f"(limit ±{100 * MAX_ERROR:.0f}%; counted h2d={m.h2d_bytes} d2h={m.d2h_bytes}, "
                f"wraps {m.wraps})",
            )
        )
    if other > MAX_ERROR * size:
        problems.append(
            (
                ACCURACY,
                f"the other direction shows {other:.0f} B of payload ({100 * other / size:.2f}% of the "
                f"copy, limit {100 * MAX_ERROR:.0f}%): other traffic on this GPU, or a wrong calibration",
            )
        )
    return problems


@pytest.mark.rules(CALIBRATION, VALID, ACCURACY, WRAP)
def test_transfer_larger_than_counter_range_is_counted_whole(
    meter: TrafficMeter, buffers: tuple[torch.Tensor, torch.Tensor], request: pytest.FixtureRequest
) -> None:
    m = measure_copy(meter, buffers, WRAP_SIZE, "h2d", request)
    cal = meter.calibration
    assert cal is not None
    wraps = m.wraps.get(cal.h2d_counter, 0)
    if m.h2d_bytes is None or m.h2d_bytes <= COUNTER_MODULUS or wraps < 1:
        fail(
            WRAP,
            f"h2d copy of {WRAP_SIZE / GiB:.0f} GiB",
            f"counted {m.h2d_bytes} B with {wraps} wrap(s) of the 32-bit counter; a copy beyond 4 GiB "
            "must count more than 2^32 B and see the counter wrap",
        )


@pytest.mark.rules(DRIFT)
def test_idle_drift_is_measured_and_small(meter: TrafficMeter, request: pytest.FixtureRequest) -> None:
    drift = meter.measure_drift(1.0)
    set_case_params(
        request.node,
        {
            "idle_drift_tx_bytes_per_s": f"{drift.tx_bytes_per_s:.0f}",
            "idle_drift_rx_bytes_per_s": f"{drift.rx_bytes_per_s:.0f}",
            "idle_drift_noise_tx_bytes_per_s": f"{drift.tx_noise_bytes_per_s:.0f}",
            "idle_drift_noise_rx_bytes_per_s": f"{drift.rx_noise_bytes_per_s:.0f}",
            "window_s": f"{drift.duration_s:.3f}",
        },
    )
    if drift.duration_s <= 0:
        fail(DRIFT, "idle window", f"drift not measured: {meter.calibration_reason}")
    worst = max(drift.tx_bytes_per_s, drift.rx_bytes_per_s)
    if worst > MAX_IDLE_DRIFT_BYTES_PER_S:
        fail(
            DRIFT,
            "idle window",
            f"idle counters advance {worst / 1e6:.2f} MB/s (tx {drift.tx_bytes_per_s / 1e6:.2f}, rx "
            f"{drift.rx_bytes_per_s / 1e6:.2f}); more than {MAX_IDLE_DRIFT_BYTES_PER_S / 1e6:.0f} MB/s "
            "means another process is using this GPU's PCIe link",
        )
