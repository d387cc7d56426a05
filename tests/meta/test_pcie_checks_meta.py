"""Meta-tests of ``conformance.common.pcie_checks``: the PCIe-saving check fails just past its bound and
passes just inside it; a saving under the meter's resolution is returned as unjudged, never passed or
failed."""

from __future__ import annotations

import pytest

from conformance.common import pcie_checks as pc
from harness.nvml_traffic import TrafficMeasurement
from tests.meta.registry import covers

RULE, CALL = "device_placement/pcie", "execute(llm.decode)"
EXPECTED = 100_000
NOISE = 1_000.0  # resolution = 10 x noise = 10,000 B: EXPECTED is resolvable


@covers(
    pc.check_savings, pc.Saving, pc.MIN_SHARE, pc.SIGNIFICANCE, pc.COMMAND_ALLOWANCE, pc.RESOLUTION_FACTOR
)
def test_a_saving_exactly_at_the_bound_passes_and_one_byte_less_fails() -> None:
    """The bound is the minimum share less the significance margin (3 x the noise) and the command-traffic
    allowance."""
    bound = pc.MIN_SHARE * EXPECTED - pc.SIGNIFICANCE * NOISE - pc.COMMAND_ALLOWANCE
    inside = pc.Saving("h2d", EXPECTED, bound, NOISE)
    assert inside.bound == bound
    assert pc.check_savings(RULE, CALL, [inside]) == []
    past = pc.Saving("h2d", EXPECTED, bound - 1, NOISE)
    with pytest.raises(
        AssertionError, match=r"\[device_placement/pcie\] execute\(llm\.decode\).*h2d: expected 100,000 B"
    ):
        pc.check_savings(RULE, CALL, [past])


@covers(pc.check_savings, pc.Saving)
def test_a_saving_no_copy_made_fails_and_names_the_share() -> None:
    round_trip = pc.Saving("d2h", EXPECTED, 0.0, NOISE)  # every byte still crossed
    with pytest.raises(AssertionError, match=r"only 0% of the bytes"):
        pc.check_savings(RULE, CALL, [round_trip])


@covers(pc.Saving, pc.COMMAND_ALLOWANCE, pc.COMMAND_FACTOR)
def test_a_saving_too_small_beside_command_traffic_is_never_judged() -> None:
    """Both sides of the floor: a saving of COMMAND_FACTOR x the allowance is judged (and a round trip
    fails); one byte less is returned unjudged however quiet the meter, with that resolution."""
    floor = pc.COMMAND_FACTOR * pc.COMMAND_ALLOWANCE
    at = pc.Saving("h2d", floor, 0.0, 1.0)
    with pytest.raises(AssertionError, match="command traffic"):
        pc.check_savings(RULE, CALL, [at])
    below = pc.Saving("h2d", floor - 1, 0.0, 1.0)
    assert pc.check_savings(RULE, CALL, [below]) == [below]
    assert below.resolution == floor


@covers(pc.check_savings, pc.Saving, pc.RESOLUTION_FACTOR)
def test_a_saving_just_below_the_resolution_is_returned_unjudged() -> None:
    noise = EXPECTED / pc.RESOLUTION_FACTOR
    at = pc.Saving("h2d", EXPECTED, 0.0, noise)  # expected == resolution: judged, and fails
    with pytest.raises(AssertionError):
        pc.check_savings(RULE, CALL, [at])
    below = pc.Saving("h2d", EXPECTED, 0.0, noise * 1.0001)
    assert pc.check_savings(RULE, CALL, [below]) == [below]
    assert not below.resolvable
    assert below.resolution == pytest.approx(EXPECTED * 1.0001)


@covers(pc.check_savings, pc.Saving)
def test_nothing_expected_or_nothing_measured_is_never_judged() -> None:
    nothing = pc.Saving("h2d", 0, 5_000.0, NOISE)
    assert pc.check_savings(RULE, CALL, [nothing]) == []
    unmeasured = pc.Saving("d2h", EXPECTED, None, None)
    assert pc.check_savings(RULE, CALL, [unmeasured]) == [unmeasured]
    assert unmeasured.share is None
    assert "not measured" in unmeasured.describe()
    assert pc.Saving("d2h", EXPECTED, 95_000.0, NOISE).share == pytest.approx(0.95)


@covers(pc.worth_measuring, pc.FLOOR, pc.Saving)
def test_windows_are_worth_measuring_only_where_a_saving_can_be_judged() -> None:
    """Both sides of the floor: one direction at it is worth a window pair; every direction under it (or
    nothing expected) is not, and such a saving, unmeasured, says why."""
    assert pc.FLOOR == pc.COMMAND_FACTOR * pc.COMMAND_ALLOWANCE
    assert pc.worth_measuring([pc.FLOOR, 0])
    assert pc.worth_measuring([0, pc.FLOOR])
    assert not pc.worth_measuring([pc.FLOOR - 1, pc.FLOOR - 1])
    assert not pc.worth_measuring([0, 0])
    small = pc.Saving("d2h", 2_560, None, None)
    assert pc.check_savings(RULE, CALL, [small]) == [small]
    assert small.describe() == (
        "d2h: expected 2,560 B saved per execute, under the 12,288 B the meter can ever judge: not measured"
    )
    # a saving the meter could judge, had it been measured, keeps the plain words
    assert pc.Saving("d2h", pc.FLOOR, None, None).describe() == "d2h: expected 12,288 B saved, not measured"


def _window(h2d: float, drift: float, rel: float = 0.05) -> pc.PerRunTraffic:
    return pc.PerRunTraffic(
        runs=1,
        valid=True,
        reason=None,
        h2d=h2d,
        d2h=0.0,
        h2d_drift_noise=drift,
        d2h_drift_noise=drift,
        rel_noise=rel,
    )


@covers(pc.difference)
def test_difference_counts_drift_per_window_and_the_calibration_scale_once() -> None:
    saved, noise = pc.difference(_window(40_000.0, 300.0), _window(20_000.0, 400.0), "h2d")
    assert saved == 20_000.0
    assert noise == pytest.approx(500.0 + 0.05 * 20_000.0)  # hypot(300, 400) + 5 % of the difference
    assert pc.difference(_window(1.0, 1.0), pc.PerRunTraffic.unsupported("no NVML"), "h2d") == (None, None)


@covers(pc.choose_runs)
def test_choose_runs_stops_at_the_byte_target_or_the_time_cap() -> None:
    assert pc.choose_runs(1 << 20, 1e-3, 16 << 20, 10.0)[0] == 16
    assert pc.choose_runs(1 << 10, 1e-2, 16 << 20, 1.0)[0] == 100


@covers(pc.PerRunTraffic)
def test_per_run_traffic_divides_payload_and_noise_by_the_runs() -> None:
    m = TrafficMeasurement(
        h2d_bytes=2_100,
        d2h_bytes=1_050,
        h2d_payload_bytes=2_000.0,
        d2h_payload_bytes=1_000.0,
        duration_s=1.0,
        valid=True,
        reason=None,
        h2d_noise_bytes=100.0,
        d2h_noise_bytes=50.0,
        payload_rel_noise=0.01,
    )
    t = pc.PerRunTraffic.from_measurement(m, 10)
    assert (t.h2d, t.d2h) == (200.0, 100.0)
    assert t.h2d_noise == pytest.approx((100.0 + 0.01 * 2_000.0) / 10)
    invalid = pc.PerRunTraffic.from_measurement(TrafficMeasurement.unsupported("no NVML"), 10)
    assert invalid.h2d is None
    assert "no NVML" in invalid.why_missing
