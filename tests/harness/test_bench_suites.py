"""The bench suites' plumbing on the CPU, without compiles: the registry resolves every suite into
``conformance.benchmarks``, ``harness`` stays free of static ``conformance`` imports, the CUDA suites skip
with "no CUDA device" here (a run that measured nothing fails unless allowed) while the view-pass and
lowering suites run on the CPU, and the records the view-pass and lowering suites build (from synthetic
figures) have the documented shape. The lowering suite's worker processes run for real against a fake
backend on the CPU. The pipelines and models suites' records are in test_bench_pipelines.py."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.benchmarks import exact_metric, pipeline_records, ratio_metric
from conformance.benchmarks import lowering as bench_lowering
from conformance.benchmarks import pipelines as bench_pipelines
from conformance.benchmarks import view_pass as bench_view_pass
from conformance.common import pcie_checks
from harness.bench import SUITE_MODULES, Suite, main, resolve_suite
from harness.records import BenchRecord
from harness.results import load_results
from tests.harness.bench_support import ROOT, _latency, _traffic, round_trips

NEW_SUITES = ("pipelines", "view_pass", "lowering", "models")


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
    from conformance.common.programs import option
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
        from conformance.common.edge_form import view_twin

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


def test_the_view_pass_line_says_why_a_pair_was_not_measured() -> None:
    """Issue 48 item 7: the bench printed ``omitted/omitted`` with no reason on a CPU target."""
    lines: list[str] = []
    ctx = SimpleNamespace(log=lines.append)
    record = bench_view_pass.view_pass_record(
        _latency(20e-6), _latency(30e-6), (23, 55, 32), device="cpu",
        conditions={"dram_bw_reason": "CPU target: no GPU counters"},
    )  # fmt: skip
    bench_view_pass._log(ctx, record)  # type: ignore[arg-type]
    assert "omitted" not in lines[0], lines
    assert "peak memory: not measured (CPU target: no device memory)" in lines[0]
    assert "DRAM util: not measured (CPU target: no GPU counters)" in lines[0]
