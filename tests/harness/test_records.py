"""Benchmark records: the exact shape the dashboard reads, round trips, validation; the mm_out record
built from synthetic measurements; and the bench CLI on a machine without CUDA."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.benchmarks.mm import PEAK_SHAPE, flops, host_calls, mm_record, mm_shapes, speedup
from harness.bench import SUITE_MODULES, format_table, format_value, main
from harness.records import BenchRecord, Metric, RecordError, case_name
from harness.results import load_results
from harness.timing import summarize

ROOT = Path(__file__).resolve().parents[2]

SPEC_EXAMPLE = {
    "suite": "mm_out",
    "name": "mm_out[bfloat16-8192x8192x8192]",
    "params": {"dtype": "bfloat16", "shape": "8192x8192x8192"},
    "primary": "time",
    "metrics": {
        "time": {"unit": "s", "value": 0.00123, "spread": 0.00001, "n": 50, "better": "lower"},
        "speed_vs_torch_mm": {"unit": "x", "value": 0.98, "spread": 0.01, "better": "higher"},
    },
    "conditions": {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "throttle_reasons": [], "gpu_uuid": "GPU-x"},
}


def test_spec_example_round_trips_exactly() -> None:
    record = BenchRecord.from_dict(SPEC_EXAMPLE)
    assert record.to_dict() == SPEC_EXAMPLE
    assert json.loads(json.dumps(record.to_dict())) == SPEC_EXAMPLE


def test_built_record_has_the_documented_shape() -> None:
    params = {"dtype": "bfloat16", "shape": "8192x8192x8192"}
    record = BenchRecord(
        suite="mm_out",
        name=case_name("mm_out", params),
        params=params,
        primary="time",
        metrics={
            "time": Metric("s", 0.00123, 0.00001, "lower", n=50),
            "speed_vs_torch_mm": Metric("x", 0.98, 0.01, "higher"),
        },
        conditions=dict(SPEC_EXAMPLE["conditions"]),  # type: ignore[arg-type]
    )
    assert record.to_dict() == SPEC_EXAMPLE
    assert list(record.to_dict()["metrics"]["time"]) == ["unit", "value", "spread", "n", "better"]


def test_missing_value_needs_a_reason_and_keeps_it() -> None:
    with pytest.raises(RecordError, match="note"):
        Metric("B", None, None, "lower")
    metric = Metric.missing("B", "lower", "unsupported: NVML did not initialise")
    assert metric.to_dict() == {
        "unit": "B",
        "value": None,
        "spread": None,
        "better": "lower",
        "note": "unsupported: NVML did not initialise",
    }
    assert Metric.from_dict(metric.to_dict()) == metric


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"unit": "s", "value": 1.0, "spread": 0.1, "better": "faster"}, "better"),
        ({"unit": "", "value": 1.0, "spread": 0.1, "better": "lower"}, "unit"),
        ({"unit": "s", "value": math.nan, "spread": 0.1, "better": "lower"}, "finite"),
        ({"unit": "s", "value": 1.0, "spread": math.inf, "better": "lower"}, "finite"),
    ],
)
def test_metric_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(RecordError, match=match):
        Metric(**kwargs)  # type: ignore[arg-type]


def test_record_validation() -> None:
    ok = {"t": Metric("s", 1.0, 0.0, "lower")}
    with pytest.raises(RecordError, match="primary"):
        BenchRecord("s", "n", {}, "missing", ok)
    with pytest.raises(RecordError, match="params"):
        BenchRecord("s", "n", {"threads": 4}, "t", ok)  # type: ignore[dict-item]
    with pytest.raises(RecordError, match="missing field"):
        BenchRecord.from_dict({"suite": "s"})
    with pytest.raises(RecordError, match="number or null"):
        Metric.from_dict({"unit": "s", "value": "fast", "spread": None, "better": "lower"})


# ---------------------------------------------------------------------------------------------- mm records


def test_mm_shapes_peak_first_and_complete() -> None:
    full = mm_shapes(quick=False)
    assert full[0] == PEAK_SHAPE
    # small 3 + skinny 3 + square 5 + LLM 8, less 2048³ which is both square and LLM.
    assert len(full) == len(set(full)) == 3 + 3 + 5 + 8 - 1
    assert (4096, 16, 4096) in full
    assert (2048, 2048, 8192) in full
    assert (1, 2048, 2048) in full
    quick = mm_shapes(quick=True)
    assert quick[0] == PEAK_SHAPE
    assert len(quick) < len(full)


def test_mm_record_figures() -> None:
    shape = (1024, 1024, 1024)
    ours = summarize([1.0e-4, 1.1e-4, 1.2e-4, 1.0e-4], "s")
    theirs = summarize([2.0e-4, 2.2e-4, 2.4e-4, 2.0e-4], "s")
    peak = flops(shape) / 0.5e-4 / 1e12  # a peak twice our speed
    host = {"ours": summarize([8e-6, 9e-6, 8e-6], "s"), "torch": summarize([4e-6, 4.5e-6, 4e-6], "s")}
    record = mm_record("bfloat16", shape, ours, theirs, peak, {"allow_tf32": False}, host).to_dict()
    assert record["name"] == "mm_out[bfloat16-1024x1024x1024]"
    assert record["params"] == {"dtype": "bfloat16", "shape": "1024x1024x1024"}
    metrics = record["metrics"]
    assert metrics["speed_vs_torch_mm"]["value"] == pytest.approx(2.0)  # torch time / ours: we are faster
    assert metrics["speed_vs_torch_mm"]["better"] == "higher"
    assert metrics["tflops"]["value"] == pytest.approx(flops(shape) / ours.value / 1e12, rel=0.05)
    assert metrics["pct_of_peak"]["value"] == pytest.approx(100 * 0.5e-4 / ours.value, rel=0.05)
    assert "8192x8192x8192" in record["conditions"]["peak_reference"]["what"]
    # Host cost is its own figure: here our calls cost twice torch's on the host.
    assert metrics["host_time"]["value"] == pytest.approx(8e-6)
    assert metrics["host_speed_vs_torch_mm"]["value"] == pytest.approx(0.5)
    assert metrics["host_speed_vs_torch_mm"]["better"] == "higher"
    for metric in metrics.values():
        assert metric["unit"]
        assert metric["spread"] is not None


def test_mm_record_without_peak_says_why() -> None:
    m = summarize([1e-4, 1e-4], "s")
    host = {"ours": m, "torch": m}
    metric = mm_record("float32", (64, 64, 64), m, m, None, {}, host).to_dict()["metrics"]["pct_of_peak"]
    assert metric["value"] is None
    assert "peak" in metric["note"]


def test_thread_speedup_noise() -> None:
    one = summarize([100.0, 100.0, 110.0, 90.0], "calls/s")
    four = summarize([300.0, 330.0, 270.0, 300.0], "calls/s")
    metric = speedup(one, four)
    assert metric.value == pytest.approx(3.0)
    assert metric.spread == pytest.approx(3.0 * math.hypot(one.relative_spread, four.relative_spread))


def test_format_value() -> None:
    assert format_value(0.00123, 0.0000123, "s") == "1.230 ms ±1.0%"
    assert format_value(1.5 * 2**30, None, "B") == "1.500 GiB"  # the dashboard's units, not GB
    assert format_value(None, None, "B") == "n/a"
    assert format_value(0.98, 0.01, "x") == "0.9800 × ±1.0%"
    assert format_value(175_000, None, "calls/s") == "175.0 k calls/s"


# ---------------------------------------------------------------------------------------------- bench CLI


def test_bench_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "harness.bench", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    for option in ("--out", "--backend", "--suite", "--quick"):
        assert option in out


def test_bench_cpu_run_records_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the bench would run for real")
    out = tmp_path / "bench.json"
    # The suites that need CUDA (view_pass and lowering run on the CPU: tests/harness/test_bench_suites.py);
    # they measure nothing here, which fails the bench unless allowed.
    cuda_only = [name for name in SUITE_MODULES if name not in ("view_pass", "lowering")]
    assert main(["--out", str(out), "--quick", "--suite", ",".join(cuda_only), "--allow-empty"]) == 0
    run = load_results(out)
    assert run.complete
    assert run.benchmarks == []
    outcomes = {case.id: (case.outcome, case.message) for case in run.cases}
    assert set(outcomes) == {f"bench::{name}" for name in cuda_only}
    for name in cuda_only:
        outcome, message = outcomes[f"bench::{name}"]
        assert outcome == "skipped"
        assert message.startswith("no CUDA device")
    assert all(case.chapter == "bench" for case in run.cases)
    assert "--suite mm_out --quick" in next(c.repro for c in run.cases if c.id == "bench::mm_out")
    assert run.metadata["backend"]["spec"] == "reference_impl:BACKEND"
    assert not Path(str(out) + ".journal.jsonl").exists()
    assert "bench::mm_out" in capsys.readouterr().out


def test_bench_rejects_unknown_suite_and_bad_backend(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path / "b.json"), "--suite", "nope"]) == 2
    assert main(["--out", str(tmp_path / "b.json"), "--backend", "no_such_module:X"]) == 2
    assert not (tmp_path / "b.json").exists()


def test_bench_suite_error_is_recorded_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.bench as bench

    def explode(ctx: bench.BenchContext) -> None:
        raise RuntimeError("kaboom")

    fake = bench.Suite(name="mm_out", description="x", run=explode, needs_cuda=False)
    monkeypatch.setattr(bench, "resolve_suite", lambda name: fake)
    out = tmp_path / "b.json"
    assert main(["--out", str(out), "--suite", "mm_out"]) == 1
    case = load_results(out).cases[0]
    assert case.outcome == "error"
    assert "kaboom" in case.message


def test_format_table_lists_records_and_cases(tmp_path: Path) -> None:
    from harness.results import new_run

    run = new_run({})
    run.benchmarks.append(SPEC_EXAMPLE)
    text = format_table(run)
    assert "mm_out[bfloat16-8192x8192x8192]" in text
    assert "time=1.230 ms" in text


def test_host_calls_cover_about_two_ms_of_gpu_work() -> None:
    assert host_calls(5e-6) == 50  # small products: capped well under the launch queue's depth
    assert host_calls(1e-4) == 20
    assert host_calls(0.02) == 1  # 8192³ fp32: one call per repeat
