"""The bench suites' plumbing on the CPU, without compiles: the registry resolves every suite into
``conformance.benchmarks``, ``harness`` stays free of static ``conformance`` imports, the CUDA suites skip
with "no CUDA device" here (a run that measured nothing fails unless allowed) while the view-pass and
lowering suites run on the CPU, and the records each suite builds (from synthetic figures) have the
documented shape. The lowering suite's worker processes run for real against a fake backend on the CPU."""

from __future__ import annotations

import ast
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance import pcie_checks
from conformance.benchmarks import BENCH_STEPS, BenchPipeline, exact_metric, pipeline_records, ratio_metric
from conformance.benchmarks import bench_pipelines as bench_pipelines_of
from conformance.benchmarks import lowering as bench_lowering
from conformance.benchmarks import models as bench_models
from conformance.benchmarks import pipelines as bench_pipelines
from conformance.benchmarks import view_pass as bench_view_pass
from harness.bench import SUITE_MODULES, Suite, main, resolve_suite
from harness.nvml_traffic import TrafficMeasurement
from harness.records import BenchRecord
from harness.results import load_results
from harness.timing import summarize

ROOT = Path(__file__).resolve().parents[2]
NEW_SUITES = ("pipelines", "view_pass", "lowering", "models")


def round_trips(record: BenchRecord) -> dict[str, Any]:
    data = record.to_dict()
    assert BenchRecord.from_dict(data).to_dict() == data
    assert data["primary"] in data["metrics"]
    assert all(isinstance(v, str) for v in data["params"].values())
    return data


# ---------------------------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", list(SUITE_MODULES))
def test_registry_resolves_every_suite(name: str) -> None:
    module = SUITE_MODULES[name]
    assert module.startswith("conformance.benchmarks."), module
    suite = resolve_suite(name)
    assert isinstance(suite, Suite)
    assert suite.name == name
    assert callable(suite.run)
    assert suite.needs_cuda == (name not in ("view_pass", "lowering"))  # those two run on the CPU too
    assert all(isinstance(a, str) for a in suite.needs_backend)


def test_harness_imports_no_conformance_or_backend_statically() -> None:
    offenders = []
    for path in sorted((ROOT / "harness").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in ("conformance", "reference_impl")
            ]
    assert offenders == []
    assert not (ROOT / "harness" / "bench_mm.py").exists()


def test_a_cpu_run_that_measures_nothing_fails_unless_allowed(tmp_path: Path, capsys) -> None:
    """`nox -s bench` on a CPU machine used to exit 0 having measured nothing; it says so and fails now."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the suites would run for real")
    out = tmp_path / "bench.json"
    cuda_only = [name for name in NEW_SUITES if resolve_suite(name).needs_cuda]
    assert cuda_only == ["pipelines", "models"]
    assert main(["--out", str(out), "--quick", "--suite", ",".join(cuda_only)]) == 1
    assert "bench: measured nothing, every suite skipped" in capsys.readouterr().err
    run = load_results(out)
    assert run.benchmarks == []
    assert run.traffic == []
    for case in run.cases:
        assert case.outcome == "skipped", case
        assert case.message.startswith("no CUDA device"), case.message
    assert [c.id for c in run.cases] == [f"bench::{n}" for n in cuda_only]
    # Asked for: exit 0; and the dashboard does not show such a file as a run, it says why.
    assert main(["--out", str(out), "--quick", "--suite", ",".join(cuda_only), "--allow-empty"]) == 0
    from reports.inputs import load_inputs

    loaded = load_inputs([out])
    assert loaded.runs == []
    assert "a bench run that measured nothing is not shown as a run" in loaded.notices[0]
    assert "no CUDA device" in loaded.notices[0]


def test_a_suite_that_meets_a_missing_protocol_part_is_skipped_with_the_reason(tmp_path: Path) -> None:
    """The suites use the chapters' helpers (programs.option ...): where one finds a protocol part missing
    (the runtime option, on a current backend) the suite is skipped with that reason, not an error."""
    from conformance.programs import option
    from harness.bench import BenchContext, BenchRun, run_suite
    from harness.results import ResultJournal, new_run
    from harness.timing import QUICK_POLICY
    from tests.minimal_backends import MinimalBackend

    backend = MinimalBackend({"runtime_options": "absent"})
    out = tmp_path / "bench.json"
    bench = BenchRun(str(out), new_run({}), ResultJournal(out), ["python", "-m", "harness.bench"])
    bench.journal.start(bench.run)

    def suite(ctx: BenchContext) -> None:
        with option(ctx.backend, "skip_copy_output_to_cpu_for_method", "forward"):
            raise AssertionError("unreachable: the option needs the part")

    def context() -> BenchContext:
        def emit(record: BenchRecord, kind: str) -> None:
            raise AssertionError("nothing to emit")

        return BenchContext(backend, "tests.minimal_backends:x", 0, True, QUICK_POLICY, emit)

    fake = Suite("fake", "a suite", suite, needs_cuda=False)
    original = SUITE_MODULES.copy()
    SUITE_MODULES["fake"] = __name__
    globals()["SUITES"] = {"fake": fake}
    try:
        assert run_suite("fake", bench, context, "") == "skipped"
    finally:
        SUITE_MODULES.clear()
        SUITE_MODULES.update(original)
        del globals()["SUITES"]
    assert "does not implement protocol part 'runtime_options'" in bench.run.cases[0].message


class EagerBackend:
    """A whole backend in a few lines, for the CPU suites' plumbing: a "program" names modules kept in this
    process, ``execute`` runs them eagerly. The view pass is the reference's."""

    name, version = "eager-bench", "0"

    def __init__(self) -> None:
        self.programs: dict[bytes, dict[str, Any]] = {}

    def lower(self, methods: Any, *, device: str, options: Any = None) -> bytes:
        program = f"eager:{device}:{len(self.programs)}:{','.join(methods)}".encode()
        self.programs[program] = {name: entry[0] for name, entry in methods.items()}
        return program

    def view_copy_pass(self, graph_module: Any) -> Any:
        from reference_impl import BACKEND

        return BACKEND.view_copy_pass(graph_module)

    def init(self, program: bytes, method: str) -> object:
        return (self.programs.get(program, {}).get(method), method)

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[Any]:
        result = handle[0](*inputs)
        return list(result) if isinstance(result, (tuple, list)) else [result]

    def destroy(self, handle: object) -> None:
        pass

    def execute_stats(self, handle: object) -> dict[str, int]:
        return {"h2d_bytes": 0, "d2h_bytes": 0}


EAGER_BACKEND = EagerBackend()


def test_the_view_pass_and_lowering_suites_run_on_the_cpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the suites run there on the GPU")
    assert not resolve_suite("view_pass").needs_cuda
    assert not resolve_suite("lowering").needs_cuda
    out = tmp_path / "bench.json"
    backend = "tests.harness.test_bench_suites:EAGER_BACKEND"
    assert main(["--out", str(out), "--quick", "--suite", "view_pass", "--backend", backend]) == 0
    (record,) = load_results(out).benchmarks
    assert record["name"] == "view_pass[slicing_block-float32-cpu]"  # never compared with a GPU's record
    assert record["metrics"]["time_with_pass"]["value"] > 0
    assert record["metrics"]["time_without_pass"]["value"] > 0
    assert record["conditions"]["timing"] == "host wall clock per call (the work runs on the CPU)"
    assert record["conditions"]["outputs"] == "CPU target: outputs are host tensors, nothing to copy"
    costs = bench_lowering.ModelCosts("linear", cold_s=[1.0], warm_s=[0.1], first_load_s=[0.1])
    named = bench_lowering.lowering_record(costs, bench_lowering.QUICK_REPEATS, device="cpu")
    assert named.name == "lowering[linear-float32-cpu]"


# ---------------------------------------------------------------------------------------------- shared


def test_ratio_metric_needs_a_nonzero_denominator() -> None:
    assert ratio_metric(110.0, 5.0, 100, what="x").value == pytest.approx(1.1)
    assert ratio_metric(110.0, 5.0, 100, what="x").spread == pytest.approx(0.05)
    zero = ratio_metric(110.0, 5.0, 0, what="device→host")
    assert zero.value is None
    assert "counted 0 bytes" in (zero.note or "")
    missing = ratio_metric(None, None, 100, what="x", missing_reason="unsupported: no NVML")
    assert missing.value is None
    assert missing.note == "unsupported: no NVML"
    assert exact_metric(3, "B").spread == 0.0


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


# ---------------------------------------------------------------------------------------------- view_pass


class _NoOptions:
    name, version = "no-options", "0"

    def lower(self, methods: Any, *, device: str) -> bytes:
        return b""


class _WithOptions:
    name, version = "options", "0"

    def lower(self, methods: Any, *, device: str, options: dict[str, Any] | None = None) -> bytes:
        return b""


class _OnlyKwargs:
    name, version = "kwargs", "0"

    def lower(self, methods: Any, *, device: str, **kwargs: Any) -> bytes:
        return b""


def test_lower_accepts_options_only_an_explicit_keyword() -> None:
    assert bench_view_pass.lower_accepts_options(_WithOptions()) == (True, "")
    for backend in (_NoOptions(), _OnlyKwargs()):
        ok, why = bench_view_pass.lower_accepts_options(backend)
        assert not ok
        assert "no 'options' keyword" in why
    assert bench_view_pass.lower_accepts_options(object())[0] is False


def test_view_pass_record_shapes() -> None:
    with_pass, without = _latency(20e-6), _latency(30e-6)
    full = round_trips(
        bench_view_pass.view_pass_record(
            with_pass,
            without,
            (23, 55, 32),
            dram={"with_pass": 1.5, "without_pass": None},
            peak_bytes={"with_pass": [4096, 4096, 4096], "without_pass": [9216, 9216, 8704]},
        )
    )
    assert full["name"] == "view_pass[slicing_block-float32]"
    assert full["metrics"]["speed_from_pass"]["value"] == pytest.approx(1.5, rel=0.05)
    assert full["metrics"]["rewrites"]["value"] == 23
    assert full["metrics"]["copies"]["value"] == 55
    assert "dram_bw_util_with_pass" in full["metrics"]
    assert "dram_bw_util_without_pass" not in full["metrics"]  # not measurable: omitted
    assert full["metrics"]["peak_memory_with_pass"] == {
        "unit": "B",
        "value": 4096,
        "spread": 0,
        "better": "lower",
        "n": 3,
    }
    assert (
        full["metrics"]["peak_memory_without_pass"]["value"],
        full["metrics"]["peak_memory_without_pass"]["spread"],
    ) == (9216, 512)
    unsupported = round_trips(
        bench_view_pass.view_pass_record(
            with_pass, None, "no view_copy_pass", unsupported="unsupported by backend 'x': no options"
        )
    )
    for key in ("time_without_pass", "speed_from_pass"):
        assert unsupported["metrics"][key]["value"] is None
        assert unsupported["metrics"][key]["note"].startswith("unsupported by backend")
    assert unsupported["metrics"]["rewrites"]["note"] == "no view_copy_pass"


@dataclass
class _Outcome:
    graph_module: Any
    rewritten: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


class _CountingPass:
    name, version = "counting", "0"

    def view_copy_pass(self, graph_module: Any) -> _Outcome:
        from conformance.edge_form import view_twin

        copies = [n.name for n in graph_module.graph.nodes if view_twin(n.target) is not None]
        return _Outcome(graph_module, copies[:3], {name: "kept" for name in copies[3:]})


def test_count_rewrites_runs_the_backend_pass_on_the_block() -> None:
    import torch

    done, copies, refused = bench_view_pass.count_rewrites(_CountingPass(), torch.float32)
    assert done == 3
    assert copies > 10  # the block is slicing-heavy
    assert refused == copies - 3
    assert "view_copy_pass" in bench_view_pass.count_rewrites(_NoOptions(), torch.float32)


# ---------------------------------------------------------------------------------------------- lowering


class FakeBackend:
    """Lowers to the method names, loads instantly: exercises the lowering workers without a compile."""

    name, version = "fake-bench", "0"

    def lower(self, methods: Any, *, device: str) -> bytes:
        return ("fake:" + device + ":" + ",".join(methods)).encode()

    def init(self, program: bytes, method: str) -> object:
        if method.encode() not in program:
            raise ValueError(f"method {method!r} not in the program")
        return [method]

    def destroy(self, handle: object) -> None:
        pass


FAKE_BACKEND = FakeBackend()


def test_cold_env_redirects_every_cache_and_leaves_ours_alone(tmp_path: Path) -> None:
    before = dict(os.environ)
    env = bench_lowering.cold_env(tmp_path, {"PYTHONPATH": "/x", "CONFORMANCE_CACHE_DIR": "/home/u/cache"})
    assert env["CONFORMANCE_CACHE_DIR"] == str(tmp_path / "artifacts")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert env["PYTHONPATH"] == f"{ROOT}{os.pathsep}/x"
    assert dict(os.environ) == before


@pytest.mark.proof
def test_lowering_workers_with_a_fake_backend_on_the_cpu() -> None:
    repeats = bench_lowering.Repeats(cold=1, warm=2, load_processes=1, warm_loads=3)
    logged: list[str] = []
    costs = bench_lowering.measure_model(
        "tests.harness.test_bench_suites:FAKE_BACKEND", "llm", -1, repeats, logged.append, timeout_s=120
    )
    assert costs.methods == ["prefill", "decode"]
    assert len(costs.cold_s) == 1
    assert len(costs.warm_s) == 2
    assert costs.program_bytes == [len(b"fake:cpu:prefill,decode")]
    assert len(costs.first_load_s) == 1
    assert len(costs.warm_load_s) == 3
    assert set(costs.first_load_per_method_s[0]) == {"prefill", "decode"}
    assert costs.warm_identical == [True]
    assert any("cold compile" in line for line in logged)
    data = round_trips(bench_lowering.lowering_record(costs, repeats))
    assert data["name"] == "lowering[llm-float32]"
    assert data["primary"] == "compile_cold"
    assert data["metrics"]["program_size"]["value"] == len(b"fake:cpu:prefill,decode")
    assert data["metrics"]["program_size"]["spread"] == 0.0
    assert data["metrics"]["warm_load"]["n"] == 3


def test_lowering_worker_failure_carries_its_stderr() -> None:
    repeats = bench_lowering.Repeats(cold=1, warm=0, load_processes=0, warm_loads=0)
    with pytest.raises(bench_lowering.WorkerFailed, match="no_such_backend_module"):
        bench_lowering.measure_model("no_such_backend_module:X", "linear", -1, repeats, timeout_s=120)


def test_lowering_record_without_samples_says_why() -> None:
    costs = bench_lowering.ModelCosts("linear")
    data = round_trips(bench_lowering.lowering_record(costs, bench_lowering.QUICK_REPEATS))
    assert data["metrics"]["compile_cold"]["value"] is None
    assert data["metrics"]["program_size"]["note"] == "no program was produced"


def test_per_method_saving_below_resolution_says_so() -> None:
    spec = bench_pipelines.PIPELINES[0]
    copy_bytes = pipeline_records.RunBytes(h2d=96, d2h=2_560, executes=1)
    kept = pipeline_records.RunBytes(h2d=96, d2h=0, executes=1)
    runs = 1_000
    # Noise per execute (2e5 / 1000 = 200 B, plus calibration) is more than a tenth of 2,560 B.
    copy_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(3_000 * runs, 500 * runs), runs)
    kept_t = pcie_checks.PerRunTraffic.from_measurement(_traffic(400 * runs, 500 * runs), runs)
    saving = round_trips(
        pipeline_records.saving_record(spec, copy_bytes, kept, copy_t, kept_t, "skip_copy", method="encoder")
    )
    assert saving["name"] == "pipelines[asr-float32-skip_copy_saving-encoder]"
    assert saving["params"]["method"] == "encoder"
    agreement = saving["metrics"]["d2h_saved_agreement"]
    assert agreement["value"] is None
    assert "below the meter's resolution" in agreement["note"]
    assert "2,560 B per execute" in agreement["note"]
    assert saving["metrics"]["h2d_saved_agreement"]["value"] is None  # nothing saved: no ratio


# ---------------------------------------------------------------------------------------------- models


def test_models_suite_covers_every_pipeline_model_or_says_why_not() -> None:
    from conformance.models import HF_MODELS, HF_UNAVAILABLE
    from conformance.pipelines import PIPELINE_MODELS

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
