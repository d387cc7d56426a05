"""Timing statistics on CPU: quantiles, IQR, the adaptive stopping rule with synthetic sample generators,
paired ratios, and the L2 flush size; the CUDA path skips with a reason where there is no GPU."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import numpy as np
import pytest

from harness.timing import (
    FALLBACK_FLUSH_BYTES,
    StopPolicy,
    interleaved_order,
    iqr,
    l2_flush_bytes,
    median,
    paired_ratio,
    quantile,
    relative_iqr,
    run_adaptive,
    stop_reason,
    summarize,
    time_cuda,
    time_cuda_interleaved,
    time_host_per_call,
    transform,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 101])
@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 1.0, 0.1])
def test_quantile_matches_numpy(n: int, q: float) -> None:
    values = [random.Random(n).gauss(5, 2) for _ in range(n)]
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


def test_median_iqr_known_values() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert median(values) == 3.0
    assert iqr(values) == 2.0  # robust: the outlier does not move it
    assert relative_iqr(values) == pytest.approx(2 / 3)


def test_quantile_rejects_empty_and_bad_q() -> None:
    with pytest.raises(ValueError, match="no samples"):
        quantile([], 0.5)
    with pytest.raises(ValueError, match="outside"):
        quantile([1.0], 1.5)


def test_summarize_is_median_and_iqr_with_unit() -> None:
    m = summarize([3.0, 1.0, 2.0, 4.0], "s")
    assert (m.value, m.spread, m.n, m.unit) == (2.5, 1.5, 4, "s")
    metric = m.to_metric("lower").to_dict()
    assert metric == {"unit": "s", "value": 2.5, "spread": 1.5, "n": 4, "better": "lower"}


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def generator(noise: float, seed: int = 0, base: float = 1e-3) -> Iterator[float]:
    """Endless samples around ``base`` with uniform relative noise of ±``noise``."""
    rng = random.Random(seed)
    return (base * (1 + rng.uniform(-noise, noise)) for _ in itertools.count())


def test_adaptive_stops_early_on_quiet_samples() -> None:
    quiet = generator(0.001)
    policy = StopPolicy(min_samples=10, target_rel_iqr=0.02, budget_s=100.0, batch=5)
    result = run_adaptive(
        lambda _: {"fn": [next(quiet) for _ in range(policy.batch)]}, policy, clock=FakeClock(0.01)
    )
    m = result["fn"]
    assert m.converged
    assert m.n == 10  # the minimum, and no more
    assert m.stop_reason.startswith("converged")
    assert m.value == pytest.approx(1e-3, rel=0.01)


def test_adaptive_gives_up_on_noise_when_the_budget_ends() -> None:
    noisy = generator(0.5)
    policy = StopPolicy(min_samples=10, target_rel_iqr=0.02, budget_s=1.0, batch=5)
    clock = FakeClock(0.1)  # every batch "takes" 0.1 s
    result = run_adaptive(lambda _: {"fn": [next(noisy) for _ in range(policy.batch)]}, policy, clock=clock)
    m = result["fn"]
    assert not m.converged
    assert "budget" in m.stop_reason
    assert 10 <= m.n <= 60
    assert m.relative_spread > 0.02


def test_adaptive_respects_min_samples_even_past_the_budget() -> None:
    noisy = generator(0.5)
    policy = StopPolicy(min_samples=20, budget_s=0.0, batch=5)
    result = run_adaptive(
        lambda _: {"fn": [next(noisy) for _ in range(policy.batch)]}, policy, clock=FakeClock(1.0)
    )
    assert result["fn"].n == 20


def test_adaptive_stops_at_max_samples() -> None:
    noisy = generator(0.5)
    policy = StopPolicy(min_samples=5, max_samples=30, budget_s=1e9, batch=5)
    result = run_adaptive(
        lambda _: {"fn": [next(noisy) for _ in range(policy.batch)]}, policy, clock=FakeClock(0.0)
    )
    assert result["fn"].n == 30
    assert "max samples" in result["fn"].stop_reason


def test_adaptive_keeps_competitors_paired_until_both_converge() -> None:
    quiet, noisy_then_quiet = generator(0.001, 1), generator(0.001, 2)
    rounds = {"n": 0}

    def take(round_index: int) -> dict[str, list[float]]:
        rounds["n"] += 1
        # "b" is noisy for its first 4 rounds (20 samples), then quiet: it converges later than "a".
        b = [next(noisy_then_quiet) * (3 if round_index < 4 and i % 2 else 1) for i in range(5)]
        return {"a": [next(quiet) for _ in range(5)], "b": b}

    policy = StopPolicy(min_samples=10, target_rel_iqr=0.02, budget_s=1e9, batch=5)
    result = run_adaptive(take, policy, clock=FakeClock(0.0))
    assert result["a"].n == result["b"].n == 5 * rounds["n"]
    assert rounds["n"] > 2  # "a" alone would have stopped after 2 rounds
    assert result["a"].converged
    assert result["b"].converged


def test_stop_reason_none_while_unconverged_within_budget() -> None:
    assert (
        stop_reason([1.0, 2.0, 3.0], 0.0, StopPolicy(min_samples=2, target_rel_iqr=0.01, budget_s=10)) is None
    )


def test_interleaved_order_alternates() -> None:
    assert interleaved_order(["ours", "torch"], 0) == ["ours", "torch"]
    assert interleaved_order(["ours", "torch"], 1) == ["torch", "ours"]
    firsts = [interleaved_order(["a", "b"], i)[0] for i in range(10)]
    assert firsts.count("a") == firsts.count("b") == 5


def test_paired_ratio_cancels_common_drift() -> None:
    # Both competitors slow down together (thermal drift); the per-round ratio stays exactly 2.
    drift = [1.0 + 0.1 * i for i in range(20)]
    ours = summarize([1e-3 * d for d in drift], "s")
    torch_mm = summarize([2e-3 * d for d in drift], "s")
    ratio = paired_ratio(torch_mm, ours)
    assert ratio.value == pytest.approx(2.0)
    assert ratio.spread == pytest.approx(0.0, abs=1e-12)
    assert ours.relative_spread > 0.2  # while each figure alone is noisy
    assert ratio.unit == "x"


def test_transform_derives_figures_per_sample() -> None:
    times = summarize([1.0, 2.0, 4.0], "s")
    rate = transform(times, lambda s: 8.0 / s, "TFLOP/s")
    assert rate.value == 4.0  # median of 8, 4, 2
    assert rate.unit == "TFLOP/s"
    assert rate.spread == pytest.approx(quantile([8.0, 4.0, 2.0], 0.75) - quantile([8.0, 4.0, 2.0], 0.25))


def test_l2_flush_size() -> None:
    assert l2_flush_bytes(50 << 20) == 100 << 20  # an H100's 50 MiB L2
    assert l2_flush_bytes(None) == FALLBACK_FLUSH_BYTES == 256 << 20
    assert l2_flush_bytes(0) == FALLBACK_FLUSH_BYTES


def test_time_cuda_needs_a_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: time_cuda is exercised by `python -m runner.gpu_smoke` on a GPU machine")
    a = torch.randn(256, 256, device="cuda")
    m = time_cuda(lambda: a @ a, 0, StopPolicy(min_samples=5, budget_s=0.2))
    assert m.unit == "s"
    assert 0 < m.value < 0.1
    assert m.conditions.get("gpu_uuid")


def _needs_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the blocking kernel runs on a GPU (`nox -s tests` there runs this)")


def test_blocking_kernel_hides_launch_cost_and_host_timer_shows_it() -> None:
    """A call with 200 µs of host work before a tiny kernel: GPU time stays tiny, host time does not."""
    import time

    import torch

    _needs_cuda()
    x = torch.randn(64, device="cuda")

    def slow_host_tiny_kernel() -> None:
        deadline = time.perf_counter() + 200e-6
        while time.perf_counter() < deadline:
            pass
        x.add_(1.0)

    policy = StopPolicy(min_samples=10, budget_s=0.3)
    fns = {"slow": slow_host_tiny_kernel}
    hidden = time_cuda_interleaved(fns, 0, policy, flush_l2=False, hide_launch_overhead=True)["slow"]
    shown = time_cuda_interleaved(fns, 0, policy, flush_l2=False)["slow"]
    assert hidden.value < 50e-6 < 200e-6 <= shown.value
    assert hidden.conditions["launch_overhead"].startswith("hidden")
    assert hidden.conditions["blocking_kernel"]["kept_uncovered"] == 0
    assert shown.conditions["launch_overhead"].startswith("included")
    host = time_host_per_call(fns, 0, calls=10, repeats=5)["slow"]
    assert host.value >= 200e-6


def test_blocking_kernel_says_when_calls_wait_for_the_gpu() -> None:
    """A call that synchronises can never be queued behind a hold: kept end to end, and said so."""
    import torch

    _needs_cuda()
    x = torch.randn(64, device="cuda")

    def synchronous() -> None:
        x.add_(1.0)
        torch.cuda.synchronize()

    policy = StopPolicy(min_samples=5, max_samples=5, budget_s=0.1)
    m = time_cuda_interleaved({"sync": synchronous}, 0, policy, flush_l2=False, hide_launch_overhead=True)
    assert m["sync"].conditions["blocking_kernel"]["kept_uncovered"] >= 1
    assert m["sync"].conditions["launch_overhead"].startswith("included")


# ---------------------------------------------------------------------------------------------- GPU state


def test_throttle_reasons_decode_every_bit() -> None:
    from harness.gpu_state import decode_throttle_reasons

    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x001 | 0x004 | 0x040) == [
        "gpu_idle",
        "sw_power_cap",
        "hw_thermal_slowdown",
    ]
    assert decode_throttle_reasons(0x800 | 0x008) == ["hw_slowdown", "unknown_0x800"]  # nothing hidden


def test_uuid_is_in_nvml_form() -> None:
    from harness.gpu_state import format_uuid

    assert format_uuid("58b0a6c0-1111-2222-3333-444455556666") == "GPU-58b0a6c0-1111-2222-3333-444455556666"
    assert format_uuid(b"GPU-abc") == "GPU-abc"
    assert format_uuid("MIG-abc") == "MIG-abc"


def test_gpu_state_without_a_gpu_is_unknown_not_zero() -> None:
    import torch

    from harness.gpu_state import capture_gpu_state

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    conditions = capture_gpu_state(0).to_conditions()
    assert conditions["sm_clock_mhz"] is None
    assert conditions["throttle_reasons"] is None
    assert "no CUDA device" in conditions["state_errors"]["nvml"]
