"""The PCIe traffic meter on CPU: unwrap, missed polls, drift, calibration maths, the poller and the meter on
a simulated link. The NVML field decoding, the unsupported path and the per-GPU file lock are in
test_nvml_device.py."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.nvml_calibration import calibrate_from, infer_h2d_counter
from harness.nvml_counters import (
    COUNTER_MODULUS,
    SAFE_GAP_S,
    CalibrationError,
    CounterSample,
    drift_from_samples,
    integrate,
    is_settled,
    subtract_drift,
    unwrap,
)
from harness.nvml_poller import CounterPoller
from harness.nvml_traffic import DRIFT_ATTEMPTS, TrafficMeter

GiB = 1 << 30
MiB = 1 << 20


def sampled(true_tx: list[int], true_rx: list[int], period_s: float = 1e-3) -> list[CounterSample]:
    """Raw 32-bit readings of true (unbounded) byte counts, one per poll period."""
    return [
        CounterSample(i * period_s, tx % COUNTER_MODULUS, rx % COUNTER_MODULUS)
        for i, (tx, rx) in enumerate(zip(true_tx, true_rx, strict=True))
    ]


def ramp(start: int, per_step: int, steps: int) -> list[int]:
    return [start + per_step * i for i in range(steps + 1)]


# ---------------------------------------------------------------------------------------------- unwrap


def test_unwrap_without_wrap_is_last_minus_first() -> None:
    assert unwrap([100, 150, 400]) == (300, 0)


def test_unwrap_one_wrap() -> None:
    assert unwrap([COUNTER_MODULUS - 10, 5]) == (15, 1)


def test_unwrap_several_wraps_matches_truth() -> None:
    # 64 MB per 1 ms poll (64 GB/s) for 300 ms: 19.2 GB, i.e. four wraps of the 32-bit counter.
    true = ramp(3_000_000_000, 64_000_000, 300)
    total, wraps = unwrap([v % COUNTER_MODULUS for v in true])
    assert total == true[-1] - true[0]
    assert wraps == (true[-1] // COUNTER_MODULUS) - (true[0] // COUNTER_MODULUS) >= 4


def test_integrate_both_counters_with_wraps() -> None:
    tx = ramp(COUNTER_MODULUS - 1000, 30_000_000, 500)  # 15 GB: several wraps
    rx = ramp(12345, 1_000, 500)  # a trickle: no wrap
    totals = integrate(sampled(tx, rx))
    assert totals.valid, totals.reason
    assert (totals.tx_bytes, totals.rx_bytes) == (tx[-1] - tx[0], rx[-1] - rx[0])
    assert totals.tx_wraps == 4
    assert totals.rx_wraps == 0
    assert totals.duration_s == pytest.approx(0.5)


def test_missed_polls_mark_the_measurement_invalid() -> None:
    # A 5 GB burst between two samples 80 ms apart: the 32-bit delta alone would read 0.7 GB.
    samples = [
        CounterSample(0.0, 0, 0),
        CounterSample(0.001, 1000, 0),
        CounterSample(0.081, 5_000_001_000 % COUNTER_MODULUS, 0),
    ]
    totals = integrate(samples)
    assert not totals.valid
    assert "missed polls" in (totals.reason or "")
    assert totals.max_gap_s == pytest.approx(0.080)
    assert totals.tx_bytes < 5_000_000_000  # what silently under-counting would have reported


def test_gap_just_under_the_safe_time_is_valid() -> None:
    samples = [CounterSample(0.0, 0, 0), CounterSample(SAFE_GAP_S * 0.99, 10, 10)]
    assert integrate(samples).valid


def test_fewer_than_two_samples_is_invalid() -> None:
    totals = integrate([CounterSample(0.0, 1, 1)])
    assert not totals.valid
    assert "only 1" in (totals.reason or "")


def test_safe_gap_leaves_margin_over_the_poll_period() -> None:
    from harness.nvml_poller import POLL_PERIOD_S

    assert POLL_PERIOD_S <= 1e-3  # at least 1 kHz
    assert SAFE_GAP_S >= 20 * POLL_PERIOD_S
    # At full PCIe Gen5 x16 speed (~64 GB/s) the counter must not wrap within the safe gap.
    assert 64e9 * SAFE_GAP_S < COUNTER_MODULUS


# ---------------------------------------------------------------------------------------------- drift


def test_drift_rate_and_subtraction() -> None:
    # Idle: 0.5 MB/s on both counters, 1 kHz for 1 s.
    idle = ramp(0, 500, 1000)
    drift = drift_from_samples(sampled(idle, idle))
    assert drift.tx_bytes_per_s == pytest.approx(0.5e6, rel=1e-3)
    assert drift.rx_noise_bytes_per_s == pytest.approx(0.0, abs=1.0)
    # A 1 GiB burst on rx over 100 ms, on top of the same drift.
    burst = GiB // 50
    rx = [500 * i + min(i, 50) * burst for i in range(101)]
    tx = ramp(0, 500, 100)
    counts = subtract_drift(integrate(sampled(tx, rx)), drift)
    assert counts["rx"] == pytest.approx(50 * burst, abs=1)
    assert counts["tx"] == pytest.approx(0, abs=1)


def test_drift_noise_is_the_difference_of_the_two_halves() -> None:
    idle = [400 * i if i <= 500 else 400 * 500 + 600 * (i - 500) for i in range(1001)]
    drift = drift_from_samples(sampled(idle, idle))
    assert drift.tx_noise_bytes_per_s == pytest.approx(0.2e6, rel=0.01)


def test_drift_noise_is_not_fooled_by_two_equal_halves() -> None:
    """Both sides: the halves advance by the same bytes, yet the rate swings between 0.2 and 0.6 MB/s
    within each; the segments' spread gives the noise, where the halves alone would give 0."""
    rates = [200, 600, 600, 200] * 2  # bytes per ms, per eighth of the window
    idle, total = [0], 0
    for rate in rates:
        for _ in range(125):
            total += rate
            idle.append(total)
    drift = drift_from_samples(sampled(idle, idle))
    assert drift.tx_bytes_per_s == pytest.approx(0.4e6, rel=1e-3)
    sigma = statistics.stdev(r * 1e3 for r in rates)
    assert drift.tx_noise_bytes_per_s == pytest.approx(
        sigma * math.sqrt(2 / 8) * 2 / math.sqrt(math.pi), rel=0.02
    )
    steady = drift_from_samples(sampled(ramp(0, 400, 1000), ramp(0, 400, 1000)))
    assert steady.tx_noise_bytes_per_s == pytest.approx(0.0, abs=1.0)


def test_drift_window_with_a_gap_is_rejected() -> None:
    samples = [CounterSample(0.0, 0, 0), CounterSample(1.0, 500_000, 500_000)]
    with pytest.raises(CalibrationError, match="missed polls"):
        drift_from_samples(samples)


def test_is_settled() -> None:
    quiet = sampled(ramp(0, 50, 40), ramp(0, 50, 40))  # 50 kB/s
    busy = sampled(ramp(0, 5_000_000, 40), ramp(0, 50, 40))  # 5 GB/s
    assert is_settled(quiet)
    assert not is_settled(busy)
    assert not is_settled(quiet[:5])  # window not yet spanned


def test_update_interval_and_settle_window() -> None:
    from harness.nvml_counters import SETTLE_MAX_S, SETTLE_WINDOW_S, settle_window, update_interval

    # Polled every 1 ms, but the value only changes every 10 ms: the driver publishes at 100 Hz.
    steps = [i // 10 * 1000 for i in range(100)]
    assert update_interval(sampled(steps, steps)) == pytest.approx(0.010)
    assert update_interval(sampled([5] * 10, [5] * 10)) is None
    assert settle_window(None) == SETTLE_WINDOW_S
    assert settle_window(0.001) == SETTLE_WINDOW_S
    assert settle_window(0.010) == pytest.approx(0.030)
    assert settle_window(10.0) == SETTLE_MAX_S / 2


# ---------------------------------------------------------------------------------------------- calibration


def synthetic_counts(h2d: float, d2h: float, h2d_counter: str = "rx") -> dict[str, float]:
    """Counted bytes for given payloads: 9 % overhead each way, plus read-request/ack cross traffic."""
    on_h2d = 1.09 * h2d + 0.002 * d2h
    on_d2h = 1.08 * d2h + 0.04 * h2d
    d2h_counter = "tx" if h2d_counter == "rx" else "rx"
    return {h2d_counter: on_h2d, d2h_counter: on_d2h}


def test_calibration_recovers_factors_and_inverts_mixed_traffic() -> None:
    runs_h2d = [synthetic_counts(GiB, 0) for _ in range(3)]
    runs_d2h = [synthetic_counts(0, GiB) for _ in range(3)]
    cal = calibrate_from(runs_h2d, runs_d2h, GiB)
    assert cal.h2d_counter == "rx"
    assert cal.d2h_counter == "tx"
    assert cal.h2d_factor == pytest.approx(1.09)
    assert cal.d2h_factor == pytest.approx(1.08)
    assert cal.h2d_cross == pytest.approx(0.04)
    assert cal.d2h_cross == pytest.approx(0.002)
    assert cal.rel_noise == pytest.approx(0.0)
    mixed = synthetic_counts(300 * MiB, 70 * MiB)
    h2d, d2h = cal.payload(mixed["rx"], mixed["tx"])
    assert h2d == pytest.approx(300 * MiB)
    assert d2h == pytest.approx(70 * MiB)


def test_calibration_follows_the_counters_not_the_documentation() -> None:
    # If a driver ever swapped the meaning of TX and RX, calibration must notice.
    cal = calibrate_from([synthetic_counts(GiB, 0, "tx")], [synthetic_counts(0, GiB, "tx")], GiB)
    assert cal.h2d_counter == "tx"


def test_calibration_noise_is_the_relative_range_of_repeats() -> None:
    runs = [{"rx": f * GiB, "tx": 0.04 * GiB} for f in (1.08, 1.09, 1.10)]
    back = [{"rx": 0.0, "tx": 1.09 * GiB}] * 3
    assert calibrate_from(runs, back, GiB).rel_noise == pytest.approx(0.02 / 1.09)


def test_direction_unclear_is_an_error() -> None:
    with pytest.raises(CalibrationError, match="direction unclear"):
        infer_h2d_counter({"tx": GiB, "rx": 0.9 * GiB}, {"tx": GiB, "rx": 0.0})


def test_direction_not_confirmed_by_the_other_copy() -> None:
    with pytest.raises(CalibrationError, match="not confirmed"):
        infer_h2d_counter({"tx": 0.0, "rx": GiB}, {"tx": 0.0, "rx": GiB})


def test_calibration_needs_runs() -> None:
    with pytest.raises(CalibrationError):
        calibrate_from([], [], GiB)


# ---------------------------------------------------------------------------------------------- poller


# The simulations run at 20 GB/s, so the counter wraps every 215 ms: a 100 ms safe gap then tolerates
# scheduler stalls of a loaded CI machine while still proving the unwrap.
SIM_RATE = 20e9
SIM_SAFE_GAP_S = 0.1


class FakeCounters:
    """A wrapping counter pair advancing at fixed rates in real time; remembers the true values read."""

    def __init__(self, tx_rate: float, rx_rate: float, stall_s: float = 0.0, stall_after: int = -1) -> None:
        self.t0 = time.monotonic()
        self.tx_rate, self.rx_rate = tx_rate, rx_rate
        self.stall_s, self.stall_after = stall_s, stall_after
        self.reads = 0
        self.truth: list[tuple[int, int]] = []

    def read(self) -> tuple[int, int]:
        if self.reads == self.stall_after:
            time.sleep(self.stall_s)
        self.reads += 1
        dt = time.monotonic() - self.t0
        true = (int(self.tx_rate * dt), int(self.rx_rate * dt))
        self.truth.append(true)
        return true[0] % COUNTER_MODULUS, true[1] % COUNTER_MODULUS


def test_poller_unwraps_a_fast_wrapping_counter_exactly() -> None:
    fake = FakeCounters(tx_rate=SIM_RATE, rx_rate=1e6)
    poller = CounterPoller(fake.read, period_s=1e-3)
    poller.start()
    time.sleep(0.6)
    samples = poller.stop()
    totals = integrate(samples, safe_gap_s=SIM_SAFE_GAP_S)
    assert totals.valid, totals.reason
    assert totals.tx_bytes == fake.truth[-1][0] - fake.truth[0][0]
    assert totals.rx_bytes == fake.truth[-1][1] - fake.truth[0][1]
    assert totals.tx_wraps >= 2
    assert len(samples) >= 200  # roughly 1 kHz, allowing for a slow CI box


def test_poller_stall_is_detected_not_undercounted() -> None:
    fake = FakeCounters(tx_rate=SIM_RATE, rx_rate=0.0, stall_s=0.3, stall_after=5)
    poller = CounterPoller(fake.read, period_s=1e-3)
    poller.start()
    time.sleep(0.4)
    totals = integrate(poller.stop(), safe_gap_s=SIM_SAFE_GAP_S)
    assert not totals.valid
    assert "missed polls" in (totals.reason or "")


def test_poller_reports_a_failing_read() -> None:
    calls = {"n": 0}

    def read() -> tuple[int, int]:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("device fell off the bus")
        return (0, 0)

    poller = CounterPoller(read, period_s=1e-3)
    poller.start()
    time.sleep(0.05)
    poller.stop()
    assert poller.error
    assert "device fell off the bus" in poller.error


# ---------------------------------------------------------------------------------------------- simulation


class SimulatedLink:
    """A PCIe link in real time: fixed-rate transfers with protocol overhead, idle drift, 32-bit counters.

    H2D data arrives on rx with 9 % overhead and makes 4 % read-request traffic on tx; D2H data leaves on
    tx with 8 % overhead. Counters advance continuously, so the poller sees them move as on hardware.
    """

    def __init__(self, rate: float = SIM_RATE, drift: float = 0.5e6) -> None:
        self.rate, self.drift = rate, drift
        self.t0 = time.monotonic()
        self.transfers: list[tuple[float, float, str]] = []  # (start, bytes, direction)
        self.lock = threading.Lock()

    def read(self) -> tuple[int, int]:
        now = time.monotonic()
        tx = rx = self.drift * (now - self.t0)
        with self.lock:
            transfers = list(self.transfers)
        for start, nbytes, direction in transfers:
            done = min(nbytes, max(0.0, now - start) * self.rate)
            if direction == "h2d":
                rx += 1.09 * done
                tx += 0.04 * done
            else:
                tx += 1.08 * done
        return int(tx) % COUNTER_MODULUS, int(rx) % COUNTER_MODULUS

    def copy(self, direction: str, nbytes: int) -> Callable[[], None]:
        """A workload for ``TrafficMeter.measure``: returns once the data has crossed, like a synced copy."""

        def run() -> None:
            with self.lock:
                self.transfers.append((time.monotonic(), nbytes, direction))
            time.sleep(nbytes / self.rate)

        return run


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONFORMANCE_LOCK_DIR", str(tmp_path))
    return tmp_path


def test_meter_end_to_end_on_a_simulated_link(lock_dir: Path) -> None:
    link = SimulatedLink()
    with TrafficMeter(
        "GPU-simulated", counter_source=link.read, drift_s=0.2, calibrate=False, safe_gap_s=SIM_SAFE_GAP_S
    ) as meter:
        assert meter.supported, meter.reason
        assert meter.drift is not None
        assert meter.drift.rx_bytes_per_s == pytest.approx(0.5e6, rel=0.05)
        meter.calibration = meter.calibrate_with(
            link.copy("h2d", 256 * MiB), link.copy("d2h", 256 * MiB), 256 * MiB
        )
        assert meter.calibration.h2d_counter == "rx"
        assert meter.calibration.h2d_factor == pytest.approx(1.09, rel=1e-3)
        for direction, size in (("h2d", 6 * GiB), ("d2h", 5 * GiB), ("h2d", 16 * MiB)):
            m = meter.measure(link.copy(direction, size))
            assert m.valid, m.reason
            ours = m.h2d_payload_bytes if direction == "h2d" else m.d2h_payload_bytes
            other = m.d2h_payload_bytes if direction == "h2d" else m.h2d_payload_bytes
            assert ours == pytest.approx(size, rel=0.005), (direction, size, m)
            assert other == pytest.approx(0, abs=0.005 * size)
            if size > 4 * GiB:
                counter = "rx" if direction == "h2d" else "tx"
                assert m.wraps[counter] >= 1
        assert (lock_dir / "gpu-GPU-simulated.lock").exists()


def test_meter_reports_a_stalled_poller_as_invalid(lock_dir: Path) -> None:
    link = SimulatedLink()
    stall = {"on": False}

    def read() -> tuple[int, int]:
        if stall["on"]:
            stall["on"] = False
            time.sleep(0.3)  # the poller misses ~300 polls while 6 GB cross the link
        return link.read()

    def workload() -> None:
        stall["on"] = True
        link.copy("h2d", 6 * GiB)()

    with TrafficMeter(
        "GPU-simulated-2", counter_source=read, drift_s=0.05, calibrate=False, safe_gap_s=SIM_SAFE_GAP_S
    ) as meter:
        m = meter.measure(workload)
    assert not m.valid
    assert m.h2d_bytes is None
    assert "missed polls" in (m.reason or "")
    record = m.to_record("traffic", "x", {}).to_dict()
    assert record["metrics"]["h2d_bytes"]["value"] is None
    assert "missed polls" in record["metrics"]["h2d_bytes"]["note"]


def _stalling_read(link: SimulatedLink, stalls: int) -> Callable[[], tuple[int, int]]:
    """The link's counters, with the first ``stalls`` idle windows each stalled once for 300 ms."""
    left = {"stalls": stalls, "reads": 0}

    def read() -> tuple[int, int]:
        left["reads"] += 1
        if left["stalls"] and left["reads"] % 20 == 0:
            left["stalls"] -= 1
            time.sleep(0.3)
        return link.read()

    return read


@pytest.mark.parametrize("stalls", [1, DRIFT_ATTEMPTS - 1, 99])
def test_a_stalled_drift_window_is_measured_again_up_to_the_attempts(lock_dir: Path, stalls: int) -> None:
    """One stall (a poll gap past the safe gap) spoils a window, not the meter: the next window is used;
    drift is given up, saying why, only once every attempt stalled."""
    with TrafficMeter(
        f"GPU-simulated-stalls-{stalls}",
        counter_source=_stalling_read(SimulatedLink(), stalls),
        drift_s=0.1,
        calibrate=False,
        safe_gap_s=SIM_SAFE_GAP_S,
    ) as meter:
        assert meter.drift is not None
        reason = meter.calibration_reason or ""
    if stalls < DRIFT_ATTEMPTS:
        assert meter.drift.duration_s > 0
        assert reason == ""
    else:
        assert meter.drift.duration_s == 0
        assert f"in {DRIFT_ATTEMPTS} windows" in reason
        assert "missed polls" in reason


def test_drift_noise_is_the_rate_variation_not_the_rate() -> None:
    from harness.nvml_counters import Drift, drift_noise_bytes

    # A fast but steady idle rate is corrected away; only its variation is uncertain.
    drift = Drift(
        tx_bytes_per_s=20e6,
        rx_bytes_per_s=15e6,
        tx_noise_bytes_per_s=2e5,
        rx_noise_bytes_per_s=1e5,
        duration_s=1.0,
    )
    assert drift_noise_bytes(5.0, drift, "tx") == pytest.approx(1e6)
    assert drift_noise_bytes(5.0, drift, "rx") == pytest.approx(5e5)


def test_no_garbage_collection_inside_a_window(lock_dir: Path) -> None:
    """A collection would hold the GIL and starve the poller thread; it waits for the window's end."""
    import gc

    link = SimulatedLink()
    seen: list[bool] = []
    with TrafficMeter(
        "GPU-simulated-gc", counter_source=link.read, drift_s=0.05, calibrate=False, safe_gap_s=SIM_SAFE_GAP_S
    ) as meter:
        assert gc.isenabled()
        meter.measure(lambda: seen.append(gc.isenabled()))
        assert gc.isenabled()
        gc.disable()
        try:
            meter.measure(lambda: None)
            assert not gc.isenabled()  # a caller's own choice is left alone
        finally:
            gc.enable()
    assert seen == [False]
