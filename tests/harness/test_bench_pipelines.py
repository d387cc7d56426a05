"""The records the CUDA bench suites build, from synthetic figures, on the CPU: the pipelines suite (runtime
bytes, run counts, latency, PCIe and saving records) and the models suite (coverage of the pipeline models,
record shapes, the replayed loop and the savings net of it). The rest of the suites' plumbing is in
test_bench_suites.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from conformance.benchmarks import BENCH_STEPS, BenchPipeline, pipeline_records
from conformance.benchmarks import bench_pipelines as bench_pipelines_of
from conformance.benchmarks import lowering as bench_lowering
from conformance.benchmarks import models as bench_models
from conformance.benchmarks import pipelines as bench_pipelines
from conformance.common import pcie_checks
from harness.timing import summarize
from tests.harness.bench_support import _latency, _traffic, round_trips

# ---------------------------------------------------------------------------------------------- pipelines


def test_runtime_bytes_sums_rows_per_method() -> None:
    rows = [
        ("prefill", {"h2d_bytes": 80, "d2h_bytes": 5000}),
        ("decode", {"h2d_bytes": 100, "d2h_bytes": 20}),
        ("decode", {"h2d_bytes": 100, "d2h_bytes": 30}),
    ]
    counted = pipeline_records.runtime_bytes(rows)
    assert (counted.h2d, counted.d2h, counted.executes) == (280, 5050, 3)
    assert counted.per_method["decode"] == {"calls": 2, "h2d_bytes": 200, "d2h_bytes": 50}


def test_choose_runs_reaches_the_byte_target_within_the_time_cap() -> None:
    runs, why = pcie_checks.choose_runs(1 << 20, 1e-3, 64 << 20, 10.0)
    assert runs == 64
    assert "MiB" in why
    runs, why = pcie_checks.choose_runs(1 << 10, 1e-2, 64 << 20, 2.0)
    assert runs == 200
    assert "time cap" in why
    runs, _ = pcie_checks.choose_runs(0, 1e-3, 64 << 20, 1.0)
    assert runs == 1000  # nothing counted: the time cap decides
    assert pcie_checks.choose_runs(10, 100.0, 64 << 20, 1.0)[0] == 1  # never zero
    assert pcie_checks.choose_runs(1, 1e-9, 1 << 40, 1e9, max_runs=7) == (7, "run cap 7")


def test_pipeline_records_have_the_documented_shape() -> None:
    spec = bench_pipelines.PIPELINES[1]
    copy_bytes = pipeline_records.RunBytes(h2d=150_000, d2h=300_000, executes=9)
    skip_bytes = pipeline_records.RunBytes(h2d=300, d2h=0, executes=9)
    runs = 100
    copy_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(310_000 * runs, 152_000 * runs), runs)
    skip_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(4_000 * runs, 2_000 * runs), runs)
    assert copy_t.d2h == pytest.approx(310_000)
    assert copy_t.d2h_noise == pytest.approx((2e5 + 0.01 * 310_000 * runs) / runs)

    latency = round_trips(pipeline_records.latency_record(spec, "copy", _latency(2e-3), copy_bytes))
    assert latency["name"] == "pipelines[llm-float32-copy]"
    assert latency["primary"] == "latency"
    assert latency["metrics"]["runtime_d2h_bytes"]["value"] == 300_000
    assert latency["conditions"]["skip_copy_option"] == ""
    skip = round_trips(
        pipeline_records.latency_record(
            spec, "skip_copy", _latency(1e-3), skip_bytes, summarize([2.0, 2.1, 1.9], "x")
        )
    )
    assert skip["conditions"]["skip_copy_option"] == "prefill,decode"
    assert skip["metrics"]["speed_vs_copy"]["better"] == "higher"

    pcie = round_trips(pipeline_records.pcie_record(spec, "copy", copy_t, copy_bytes, "bytes"))
    assert pcie["name"] == "pipelines[llm-float32-copy-pcie]"
    assert pcie["metrics"]["nvml_d2h_bytes"]["value"] == pytest.approx(310_000)
    assert "100 back-to-back runs" in pcie["metrics"]["nvml_d2h_bytes"]["note"]
    assert pcie["metrics"]["d2h_agreement"]["value"] == pytest.approx(310_000 / 300_000)
    assert pcie["conditions"]["valid"] is True
    assert "divided by K" in pcie["conditions"]["note"]
    skip_pcie = round_trips(pipeline_records.pcie_record(spec, "skip_copy", skip_t, skip_bytes, "bytes"))
    assert skip_pcie["metrics"]["d2h_agreement"]["value"] is None  # runtime counted 0 d2h bytes

    saving = round_trips(pipeline_records.saving_record(spec, copy_bytes, skip_bytes, copy_t, skip_t))
    assert saving["name"] == "pipelines[llm-float32-skip_copy_saving]"
    m = saving["metrics"]
    assert m["d2h_saved_runtime"]["value"] == 300_000
    assert m["d2h_saved_nvml"]["value"] == pytest.approx(306_000)
    assert m["d2h_saved_agreement"]["value"] == pytest.approx(306_000 / 300_000)
    assert m["h2d_saved_runtime"]["value"] == 149_700
    assert m["d2h_saved_nvml"]["spread"] > 0
    assert saving["conditions"]["mechanism"] == "runtime option"


def test_placed_saving_names_the_mechanism_and_the_saving_per_method() -> None:
    spec = bench_pipelines.PIPELINES[1]
    rows = {"prefill": {"calls": 1, "h2d_bytes": 100, "d2h_bytes": 40_000}}
    rows["decode"] = {"calls": 8, "h2d_bytes": 260_000, "d2h_bytes": 80_000}
    copy_bytes = pipeline_records.RunBytes(h2d=260_100, d2h=120_000, executes=9, per_method=rows)
    placed = {m: {"calls": r["calls"], "h2d_bytes": 0, "d2h_bytes": 0} for m, r in rows.items()}
    placed_bytes = pipeline_records.RunBytes(h2d=0, d2h=0, executes=9, per_method=placed)
    none = pcie_checks.PerRunTraffic.unsupported("no GPU")
    saving = round_trips(
        pipeline_records.saving_record(spec, copy_bytes, placed_bytes, none, none, mode="placed")
    )
    assert saving["name"] == "pipelines[llm-float32-placed_saving]"
    assert saving["conditions"]["mechanism"] == "export-time placement"
    assert saving["conditions"]["placement"] == pipeline_records.PLACED_OPTIONS
    assert saving["conditions"]["runtime_saved_per_method"]["decode"] == {
        "h2d_bytes": 260_000,
        "d2h_bytes": 80_000,
    }
    assert saving["metrics"]["h2d_saved_runtime"]["value"] == 260_100
    assert saving["metrics"]["d2h_saved_nvml"]["value"] is None


def test_pipeline_records_without_nvml_say_why() -> None:
    spec = bench_pipelines.PIPELINES[0]
    counted = pipeline_records.RunBytes(h2d=10_000, d2h=20_000, executes=7)
    none = pcie_checks.PerRunTraffic.unsupported("NVML library not found")
    pcie = round_trips(pipeline_records.pcie_record(spec, "copy", none, counted, "bytes"))
    for key in ("nvml_d2h_bytes", "nvml_h2d_bytes", "d2h_agreement", "h2d_agreement"):
        assert pcie["metrics"][key]["value"] is None
        assert pcie["metrics"][key]["note"] == "unsupported: NVML library not found"
    assert pcie["metrics"]["runtime_d2h_bytes"]["value"] == 20_000
    invalid = pcie_checks.PerRunTraffic.from_measurement(_traffic(1e6, 1e6, valid=False), 10)
    saving = round_trips(pipeline_records.saving_record(spec, counted, counted, invalid, invalid))
    assert saving["metrics"]["d2h_saved_nvml"]["value"] is None
    assert saving["metrics"]["d2h_saved_nvml"]["note"] == "invalid: missed polls"
    assert saving["conditions"]["valid"] is False


def test_pipeline_modes_name_the_right_methods() -> None:
    asr, llm = bench_pipelines.PIPELINES
    assert (asr.option_value("copy"), asr.option_value("skip_copy")) == ("", "encoder")
    assert (llm.option_value("skip_copy"), llm.option_value("placed")) == ("prefill,decode", "")
    assert (asr.description, llm.description) == (
        "encoder once + decoder 6 steps",
        "prefill + decode 8 steps",
    )
    with pytest.raises(ValueError, match="mode"):
        asr.option_value("fast")


# ---------------------------------------------------------------------------------------------- models


def test_models_suite_covers_every_pipeline_model_or_says_why_not() -> None:
    from conformance.common.pipelines import PIPELINE_MODELS
    from conformance.models import HF_MODELS, HF_UNAVAILABLE

    specs = {s.model: s for s in bench_models.bench_pipelines()}
    assert set(specs) == set(PIPELINE_MODELS)
    assert {"asr", "llm"} <= set(specs)
    missing = bench_models.unavailable_models()
    if HF_UNAVAILABLE is None:
        assert set(HF_MODELS) <= set(specs)
        assert missing == {}
    else:
        assert set(missing) == set(HF_MODELS)
        assert all("transformers" in why for why in missing.values())
    assert specs["asr"].option_value("skip_copy") == "encoder"
    assert specs["llm"].option_value("skip_copy") == "prefill,decode"
    assert specs["llm"].option_value("copy") == ""
    assert specs["llm"].tokens_per_run == BENCH_STEPS["llm"]
    with pytest.raises(ValueError, match="no skip-copy option"):
        specs["llm"].option_value("eager")


def test_bench_pipelines_follow_the_pipeline_kind() -> None:
    @dataclass
    class _P:
        kind: str
        methods: tuple[str, str]

    specs = bench_pipelines_of({"hf_whisper": _P("asr", ("encoder", "decoder"))})
    assert specs == [BenchPipeline("hf_whisper", "asr", ("encoder", "decoder"), 6)]
    assert specs[0].skip_methods == "encoder"


def test_models_records_have_the_documented_shape() -> None:
    spec = BenchPipeline("hf_llm", "llm", ("prefill", "decode"), 9)
    counted = pipeline_records.RunBytes(h2d=90_000, d2h=180_000, executes=9)
    eager = round_trips(bench_models.latency_record(spec, "eager", _latency(9e-3), None, None, batch=2))
    assert eager["name"] == "models[hf_llm-float32-eager]"
    assert eager["metrics"]["latency_per_token"]["value"] == pytest.approx(9e-3 * 1.005 / 9)
    assert "vs_eager" not in eager["metrics"]
    assert eager["conditions"]["skip_copy_option"] is None
    assert eager["conditions"]["batch"] == 2
    copy = round_trips(
        bench_models.latency_record(
            spec, "copy", _latency(18e-3), counted, summarize([2.0, 2.1, 1.9], "x"), batch=2
        )
    )
    assert copy["metrics"]["vs_eager"]["value"] == pytest.approx(2.0)
    assert copy["metrics"]["vs_eager"]["better"] == "lower"
    assert copy["metrics"]["runtime_d2h_bytes_per_token"]["value"] == pytest.approx(20_000)
    assert copy["conditions"]["skip_copy_option"] == ""

    runs = 100
    traffic = pcie_checks.PerRunTraffic.from_measurement(_traffic(180_000 * runs, 90_000 * runs), runs)
    baseline = pcie_checks.PerRunTraffic.from_measurement(_traffic(1_800 * runs, 900 * runs), runs)
    pcie = round_trips(bench_models.pcie_record(spec, "copy", traffic, baseline, "bytes"))
    assert pcie["name"] == "models[hf_llm-float32-copy-pcie]"
    assert pcie["metrics"]["nvml_d2h_bytes_per_token"]["value"] == pytest.approx(20_000)
    assert pcie["metrics"]["d2h_vs_eager"]["value"] == pytest.approx(100.0)
    assert pcie["metrics"]["h2d_vs_eager"]["value"] == pytest.approx(100.0)
    none = pcie_checks.PerRunTraffic.unsupported("no NVML")
    blind = round_trips(bench_models.pcie_record(spec, "skip_copy", none, none, "bytes"))
    assert blind["metrics"]["d2h_vs_eager"]["value"] is None
    assert blind["metrics"]["nvml_h2d_bytes_per_token"]["note"] == "unsupported: no NVML"

    costs = bench_lowering.ModelCosts("hf_llm", cold_s=[30.0, 32.0], warm_s=[0.5], first_load_s=[2.0])
    lowering = round_trips(bench_models.lowering_record(spec, costs, eager_ready_s=0.5))
    assert lowering["name"] == "models[hf_llm-float32-lowering]"
    assert lowering["metrics"]["compile_cold_vs_eager"]["value"] == pytest.approx(62.0)
    assert lowering["metrics"]["first_load_vs_eager"]["value"] == pytest.approx(4.0)
    assert lowering["metrics"]["warm_load"]["value"] is None
    missing = round_trips(bench_models.lowering_record(spec, bench_lowering.ModelCosts("hf_llm"), None))
    assert missing["metrics"]["compile_cold_vs_eager"]["value"] is None
    assert missing["metrics"]["eager_ready"]["value"] is None


class _EagerBackend:
    """Handles are method names; execute runs the zoo's eager modules (what the replay must stand in for)."""

    def __init__(self, methods: dict[str, Any]) -> None:
        self.methods = methods
        self.calls = 0

    def execute(self, handle: str, inputs: list[Any], outputs: Any = None) -> list[Any]:
        import torch

        self.calls += 1
        module = self.methods[handle][0]
        with torch.no_grad():
            out = module(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def execute_stats(self, handle: str) -> dict[str, int]:
        return {"h2d_bytes": 7, "d2h_bytes": 9}


def test_a_replayed_loop_sees_the_recorded_outputs_and_moves_nothing_itself() -> None:
    """The loop-only windows of the pipelines bench: one real run recorded, then the loop replayed on its
    outputs gives the same tokens with the backend never called and no bytes counted."""
    import torch

    from conformance.models import get_model

    eager = get_model("llm").build(torch.float32, torch.device("cpu"))
    backend = _EagerBackend(eager)
    spec = next(p for p in bench_pipelines.PIPELINES if p.model == "llm")
    first_input = eager["prefill"][1][0]
    recorder = bench_pipelines._Recorder(backend)
    stats: list[Any] = []
    real = spec.run(recorder, ["prefill", "decode"], first_input, stats)
    assert backend.calls == len(recorder.outputs) == spec.steps  # prefill + decodes
    assert stats[0][1] == {"h2d_bytes": 7, "d2h_bytes": 9}
    # Every tensor in and out of the CPU backend is on the host: one PCIe copy each for a CUDA program.
    assert recorder.copies == {
        "h2d_copy": 1 + 4 * (spec.steps - 1),  # the prompt; then token, position and both caches
        "d2h_copy": sum(len(out) for out in recorder.outputs),
    }
    replay = bench_pipelines._Replay(recorder.outputs)
    replay_stats: list[Any] = []
    for _ in range(2):  # a window replays the run again and again
        assert torch.equal(spec.run(replay, ["prefill", "decode"], first_input, replay_stats), real)
    assert backend.calls == spec.steps
    assert {k: v for _, row in replay_stats for k, v in row.items() if v} == {}


def test_whole_run_savings_are_net_of_the_loop() -> None:
    runs = 100
    copy_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(310_000 * runs, 152_000 * runs), runs)
    skip_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(4_000 * runs, 21_000 * runs), runs)
    loop_copy = pcie_checks.PerRunTraffic.from_measurement(_traffic(1_000 * runs, 1_000 * runs), runs)
    loop_skip = pcie_checks.PerRunTraffic.from_measurement(_traffic(3_000 * runs, 20_000 * runs), runs)
    net_copy, net_skip = copy_t.minus(loop_copy), skip_t.minus(loop_skip)
    assert net_copy.h2d == pytest.approx(151_000)
    assert net_copy.h2d_drift_noise == pytest.approx(math.hypot(1e3, 1e3))
    spec = bench_pipelines.PIPELINES[1]
    counted_copy = pipeline_records.RunBytes(h2d=150_000, d2h=309_000, executes=9)
    counted_skip = pipeline_records.RunBytes(h2d=0, d2h=0, executes=9)
    record = round_trips(
        pipeline_records.saving_record(
            spec, counted_copy, counted_skip, net_copy, net_skip, "skip_copy",
            loop={"copy": loop_copy, "skip_copy": loop_skip},
        )
    )  # fmt: skip
    # Without the loop the h2d saving would read 131,000 B (0.87); net of it, 150,000 B.
    assert record["metrics"]["h2d_saved_nvml"]["value"] == pytest.approx(150_000)
    assert record["metrics"]["h2d_saved_agreement"]["value"] == pytest.approx(1.0)
    assert record["conditions"]["loop_bytes_per_run"]["skip_copy"]["h2d"] == pytest.approx(20_000)
    assert "net of the loop" in record["conditions"]["note"]
    invalid = copy_t.minus(pcie_checks.PerRunTraffic.from_measurement(_traffic(1, 1, valid=False), runs))
    assert not invalid.valid
    assert invalid.h2d is None


def test_per_method_agreement_counts_the_fixed_cost_of_each_copy_saved() -> None:
    """A 2.5 kB saving is mostly fixed costs: held to payload + copies x per-copy PCIe bytes (measured in the
    same run), NVML agrees where the payload-only ratio reads 1.13."""
    runs = 2_000
    copy_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(2_600 * runs, 2_890 * runs), runs)
    placed_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(2_600 * runs, 0), runs)
    spec = bench_pipelines.PIPELINES[0]
    counted_copy = pipeline_records.RunBytes(h2d=2_560, d2h=2_560, executes=1)
    counted_placed = pipeline_records.RunBytes(h2d=0, d2h=2_560, executes=1)
    overheads = {"h2d_copy": {"h2d": 330.0, "d2h": 0.0}, "d2h_copy": {"h2d": 10.0, "d2h": 40.0}}
    per_copy = pipeline_records.PerCopy({"h2d_copy": 1, "d2h_copy": 0}, overheads)
    assert per_copy.expected("h2d", 2_560) == pytest.approx(2_890)
    record = round_trips(
        pipeline_records.saving_record(
            spec,
            counted_copy,
            counted_placed,
            copy_t,
            placed_t,
            "placed",
            method="encoder",
            per_copy=per_copy,
        )
    )
    metrics = record["metrics"]
    assert metrics["h2d_saved_agreement"]["value"] == pytest.approx(2_890 / 2_560)
    assert metrics["h2d_saved_expected_nvml"]["value"] == pytest.approx(2_890)
    assert metrics["h2d_saved_agreement_per_copy"]["value"] == pytest.approx(1.0)
    assert record["conditions"]["per_copy"]["copies_saved"] == {"h2d_copy": 1, "d2h_copy": 0}
    unmeasured = pipeline_records.PerCopy({"h2d_copy": 1}, None, "meter unavailable")
    assert unmeasured.expected("h2d", 2_560) is None
    import torch

    assert bench_pipelines.host_tensors([torch.zeros(1), torch.zeros(1, device="meta")]) == 1
