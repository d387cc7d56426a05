"""Realistic synthetic result sets for the dashboard tests: every outcome, benchmarks with spreads,
traffic, hostile strings in every field a result file lets a backend or test author fill in."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from harness.results import CaseResult, ResultJournal, RunResult, new_run, write_results

HOSTILE = "<script>window.__pwned=1</script>"
HOSTILE_IMG = '"><img src=x onerror="window.__pwned=2">'


def environment(host: str = "gpu-node-1", gpus: int = 2, hostile: bool = False) -> dict[str, Any]:
    return {
        "hostname": host,
        "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
        "python": "3.12.3",
        "python_implementation": "CPython",
        "cpu": "AMD EPYC 9654 96-Core Processor",
        "cpu_count": 192,
        "torch": "2.13.0+cu130",
        "torch_cuda": "13.0",
        "cuda_available": True,
        "gpus": [
            {
                "index": i,
                "name": "NVIDIA H200",
                "total_memory_bytes": 150_754_820_096,
                "capability": "9.0",
                "uuid": f"GPU-5f1c{i}a2e-7b3d-4c1e-9a8f-{host[-1]}0000000000{i}",
            }
            for i in range(gpus)
        ],
        "driver_version": "580.65.06",
        "env": {"CUDA_VISIBLE_DEVICES": HOSTILE_IMG if hostile else "0,1", "CXX": None},
    }


def case(
    chapter: str, test: str, params: dict[str, str], outcome: str, message: str = "", worker: str = "gw0"
) -> CaseResult:
    param_id = "-".join(params.values())
    case_id = f"conformance/{chapter}/test_{chapter}.py::{test}" + (f"[{param_id}]" if param_id else "")
    return CaseResult(
        id=case_id,
        chapter=chapter,
        params=params,
        outcome=outcome,
        message=message,
        repro=f"python -m pytest '{case_id}' -p harness.pytest_plugin",
        duration_s=0.25,
        worker=worker,
    )


def cases(hostile: bool = True, regress: bool = True) -> list[CaseResult]:
    out: list[CaseResult] = []
    for dtype in ("float32", "float16", "bfloat16"):
        for shape in ("1x64x48", "33x17x9", "257x129x65", "4096x4096x4096"):
            for layout in ("row", "col"):
                params = {"dtype": dtype, "shape": shape, "layout": layout}
                outcome, message = "passed", ""
                if regress and dtype == "bfloat16" and shape == "257x129x65" and layout == "col":
                    outcome = "failed"
                    message = (
                        "AssertionError: mm_out result differs from the float64 reference beyond the "
                        "bfloat16 tolerance (rule MM-3)\n"
                        "  max abs error 0.0625 at (12, 40); atol 0.0156, rtol 0.0078"
                    )
                if shape == "4096x4096x4096" and dtype == "float32":
                    outcome, message = "skipped", "large shapes need 40 GiB free GPU memory (found 12 GiB)"
                out.append(case("mm_out", "test_values_match_float64_reference", params, outcome, message))
    out.append(
        case(
            "mm_out",
            "test_streams_interleave",
            {"dtype": "float16", "shape": "512x512x512"},
            "crashed",
            "worker 'gw1' crashed while running this case (signal 11: SIGSEGV)",
            worker="gw1",
        )
    )
    for model in ("simple_ops", "slicing_block", "tiny_asr", "tiny_llm"):
        for dtype in ("float32", "float16", "bfloat16"):
            out.append(
                case("multi_method", "test_methods_match_eager", {"dtype": dtype, "model": model}, "passed")
            )
    out.append(
        case(
            "multi_method",
            "test_kv_cache_stays_on_gpu",
            {"dtype": "bfloat16", "model": "tiny_llm"},
            "error",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        )
    )
    for test in ("test_rejects_unknown_option", "test_skip_copy_outputs_alias", "test_options_roundtrip"):
        out.append(case("runtime", test, {}, "passed"))
    out.append(
        case("runtime", "test_two_gpus_share_nothing", {}, "skipped", "needs two or more CUDA devices")
    )
    for n in ("1", "2", "8"):
        out.append(case("streams_threads", "test_threads_match_serial", {"threads": n}, "passed"))
    out.append(
        case("bad_inputs", "test_wrong_dtype_is_rejected", {"dtype": "float16"}, "xfailed", "known gap")
    )
    if hostile:
        out.append(
            case("bad_inputs", "test_hostile", {"dtype": HOSTILE, "shape": HOSTILE_IMG}, "failed", HOSTILE)
        )
        out.append(case("bad_inputs", "test_hostile_skip", {}, "skipped", f"skip reason {HOSTILE}"))
    return out


def metric(
    unit: str, value: float | None, spread: float | None = None, better: str | None = "lower", **extra: Any
):
    data: dict[str, Any] = {"unit": unit, "value": value, "better": better}
    if spread is not None:
        data["spread"] = spread
    data.update(extra)
    return data


def mm_out_conditions(number: int) -> dict[str, Any]:
    """What the real bench records per ``mm_out`` figure (examples/runs/*/bench.json): the GPU, clocks and
    policy every record shares, plus nested dicts and long sentences, some of them different per record.
    Twenty-odd conditions of this kind once made every benchmark row 600 px tall."""
    return {
        "blocking_kernel": {
            "batches": 2,
            "discarded_released_early": 0,
            "kept_uncovered": 0,
            "last_hold_s": 0.001,
        },
        "converged": True,
        "gpu_uuid": "GPU-cb0b0038-3f41-ae94-266e-db7ebcd5ac4b",
        "host_time": "host seconds per call, 21 repeats of back-to-back calls",
        "launch_overhead": "hidden: every batch queued behind a blocking kernel (GPU time only)",
        "matmul_settings": {"allow_bf16_reduced_precision_reduction": True, "allow_tf32": False},
        "mem_clock_mhz": 3201,
        "peak_reference": {
            "tflops": 793.29,
            "what": "best TFLOP/s of torch.mm at 8192x8192x8192 in bfloat16",
        },
        "power_w": 122.5 + 10 * number,
        "shape_order": "MxKxN",
        "sm_clock_mhz": 1980,
        "spread": "IQR of per-sample values; speed ratios from per-round (per-repeat) ratios",
        "stop_reason": f"converged: relative IQR 0.00{19 + number} <= 0.02",
        "temperature_c": 43 + number,
        "throttle_reasons": [],
    }


def sweep(count: int) -> list[dict[str, Any]]:
    """A suite of ``count`` records (more than a chart draws: ``reports.charts.MAX_BARS``)."""
    return [
        {
            "suite": "sweep",
            "name": f"copy[{size}]",
            "params": {"size": f"{size}x{size}"},
            "primary": "time",
            "metrics": {"time": metric("s", 1e-6 * (1 + number), 1e-8, n=20)},
            "conditions": {"sm_clock_mhz": 1980},
        }
        for number, size in enumerate(range(64, 64 * (count + 1), 64))
    ]


def benchmarks(scale: float = 1.0, hostile: bool = True, sweep_records: int = 0) -> list[dict[str, Any]]:
    records = []
    for dtype, base in (("float32", 0.0105), ("float16", 0.00131), ("bfloat16", 0.00123)):
        for shape, factor in (("4096x4096x4096", 0.125), ("8192x8192x8192", 1.0)):
            t = base * factor * scale
            torch_t = base * factor * 0.99
            flops = 2 * math.prod(int(d) for d in shape.split("x")) / t / 1e12
            records.append(
                {
                    "suite": "mm_out",
                    "name": f"mm_out[{dtype}-{shape}]",
                    "params": {"dtype": dtype, "shape": shape},
                    "primary": "time",
                    "metrics": {
                        "time": metric("s", t, t * 0.01, n=50),
                        "torch_mm_time": metric("s", torch_t, torch_t * 0.01, n=50),
                        "speed_vs_torch_mm": metric("x", torch_t / t, 0.01, "higher"),
                        "tflops": metric("TFLOP/s", flops, None, "higher"),
                    },
                    "conditions": mm_out_conditions(len(records)),
                }
            )
    for threads in (1, 2, 4, 8):
        records.append(
            {
                "suite": "thread_scaling",
                "name": f"execute[threads={threads}]",
                "params": {"threads": str(threads)},
                "primary": "throughput",
                "metrics": {
                    "throughput": metric("calls/s", 5200.0 * threads**0.8 / scale, 60.0, "higher", n=30)
                },
                "conditions": {
                    "sm_clock_mhz": 1755,
                    "throttle_reasons": ["sw_thermal"] if threads == 8 else [],
                },
            }
        )
    if hostile:
        records.append(
            {
                "suite": f"lowering {HOSTILE}",
                "name": f"lower[{HOSTILE}]",
                "params": {"model": HOSTILE_IMG},
                "primary": "time",
                "metrics": {"time": metric("s", 0.42, 0.01)},
                "conditions": {"note": HOSTILE},
            }
        )
    records += sweep(sweep_records)
    return records


def traffic() -> list[dict[str, Any]]:
    return [
        {
            "suite": "pcie",
            "name": "execute[tiny_llm-decode]",
            "params": {"model": "tiny_llm", "method": "decode"},
            "primary": "h2d_bytes",
            "metrics": {
                "h2d_bytes": metric("bytes", 4096.0, 512.0),
                "d2h_bytes": metric("bytes", 2048.0, 256.0),
                "h2d_rate": metric("B/s", 1.2e9, 1e8, "higher"),
            },
            "conditions": {"calibration": "pinned 256 MiB copy: 1.09x payload"},
        },
        {
            "suite": "pcie",
            "name": "execute[tiny_asr-encode]",
            "params": {"model": "tiny_asr", "method": "encode"},
            "primary": "h2d_bytes",
            "metrics": {
                "h2d_bytes": metric("bytes", None, None, note="unsupported: NVML field not available")
            },
            "conditions": {},
        },
    ]


def sample_run(
    host: str = "gpu-node-1",
    started_at: str = "2025-06-02T09:30:00+00:00",
    scale: float = 1.0,
    hostile: bool = True,
    regress: bool = True,
    run_id: str | None = None,
    sweep_records: int = 0,
    phases: bool = False,
) -> RunResult:
    backend_name = f"reference {HOSTILE}" if hostile else "reference_impl"
    run = new_run(
        environment(host, hostile=hostile),
        {"backend": {"name": backend_name, "version": "0.1.0", "spec": "reference_impl:BACKEND"}},
    )
    run = dataclasses.replace(run, run_id=run_id or run.run_id, started_at=started_at)
    run.cases = cases(hostile=hostile, regress=regress)
    run.benchmarks = benchmarks(scale, hostile=hostile, sweep_records=sweep_records)
    if phases:
        run.metadata["phases"] = PHASES
    run.traffic = traffic()
    run.complete = True
    run.finished_at = (datetime.fromisoformat(started_at) + timedelta(minutes=12, seconds=10)).isoformat()
    return run


#: ``metadata["phases"]`` as ``nox -s conformance`` stores it (``harness.phases.store_phases``): prelower
#: overlaps the shared phase; the run ends with the report at 730 s.
PHASES = [
    {"name": "prelower", "start_s": 0.0, "wall_s": 180.0, "detail": "15 processes"},
    {"name": "cases (shared GPU)", "start_s": 5.0, "wall_s": 540.0, "detail": "8 workers on 2 GPUs"},
    {"name": "cases (GPU alone)", "start_s": 545.0, "wall_s": 150.0, "detail": "1 worker per GPU"},
    {"name": "cases (multi-GPU)", "start_s": 695.0, "wall_s": 30.0, "detail": "2 GPUs"},
    {"name": "report", "start_s": 725.0, "wall_s": 5.0, "detail": ""},
]

#: A hand-written rule coverage table in the shape ``python -m tests.rule_coverage --json`` prints
#: (one object per rule id), with each status, including the two the self-test fails on, and a hostile
#: string where a person writes prose.
RULE_COVERAGE = [
    {
        "rule": "mm_out/values",
        "level": "must",
        "chapters": ["mm_out"],
        "cases": [
            "conformance/mm_out/test_mm_out.py::test_values_match_float64_reference[float32-1x64x48-row]",
            "conformance/mm_out/test_mm_out.py::test_values_match_float64_reference[float16-1x64x48-row]",
            "conformance/mm_out/test_mm_out.py::test_values_match_float64_reference[bfloat16-1x64x48-row]",
        ],
        "broken_backends": [
            "tests.broken.basic:WRONG_VALUES",
            "tests.broken.chapter:TRANSPOSES_THE_SECOND_OPERAND_FOR_COLUMN_MAJOR_LAYOUTS",
        ],
        "spec": ["§2 mm_out matches a float64 reference within the dtype's tolerance"],
        "exemption": None,
        "exemption_reason": None,
        "status": "proven",
    },
    {
        "rule": "bad_inputs/corrupt-program",
        "level": "must",
        "chapters": ["bad_inputs"],
        "cases": [
            "conformance/bad_inputs/test_bad_inputs.py::test_init_with_a_corrupt_program_is_rejected[reversed]"
        ],
        "broken_backends": [],
        "spec": [],
        "exemption": "gap",
        "exemption_reason": f"program_format/* broken loaders would show it; none written yet {HOSTILE}",
        "status": "gap",
    },
    {
        "rule": "traffic_meter/calibration",
        "level": "must",
        "chapters": [],
        "cases": [],
        "broken_backends": [],
        "spec": [],
        "exemption": "not-checkable",
        "exemption_reason": "the meter's own self-check: no backend is involved",
        "status": "not-checkable",
    },
    {
        "rule": "runtime_options/no-host-sync",
        "level": "should",
        "chapters": ["runtime_options"],
        "cases": ["conformance/runtime_options/test_runtime_options.py::test_no_host_sync[cuda]"],
        "broken_backends": [],
        "spec": [],
        "exemption": None,
        "exemption_reason": None,
        "status": "NO BROKEN BACKEND",
    },
    {
        "rule": "lowering/spec-only",
        "level": "must",
        "chapters": [],
        "cases": [],
        "broken_backends": [],
        "spec": ["§3 a rule the SPEC states and no case checks"],
        "exemption": None,
        "exemption_reason": None,
        "status": "NO CASE",
    },
]


def write_rule_coverage(path: Path, rows: list[dict[str, Any]] | None = None) -> Path:
    path.write_text(json.dumps(RULE_COVERAGE if rows is None else rows, indent=2), encoding="utf-8")
    return path


def write_run(path: Path, run: RunResult) -> Path:
    write_results(path, run)
    return path


def write_interrupted(path: Path, started_at: str = "2025-06-03T10:00:00+00:00") -> Path:
    """A run killed midway: only its journal exists, its last line cut short."""
    run = sample_run("gpu-node-2", started_at=started_at, hostile=False, regress=False)
    journal = ResultJournal(path)
    journal.start(
        dataclasses.replace(run, cases=[], benchmarks=[], traffic=[], complete=False, finished_at=None)
    )
    for item in run.cases[:20]:
        journal.add_case(item)
    journal.add_benchmark(run.benchmarks[0])
    journal.close()
    with open(journal.path, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "case", "case": {"id": "conformance/test_mm')  # the write the kill interrupted
    return journal.path


def baseline_run(started_at: str = "2025-06-01T09:30:00+00:00") -> RunResult:
    """The run before ``sample_run``: one time it beats (slower now), one it loses to (faster now), one
    within noise (ambiguous), the rest the same; and the bfloat16 case that fails now still passed."""
    run = sample_run(started_at=started_at, hostile=True, regress=False)
    by_name = {record["name"]: record for record in run.benchmarks}
    changes = {
        "mm_out[float32-4096x4096x4096]": (0.90, 0.01),  # current is 11% slower, spreads apart
        "mm_out[float16-8192x8192x8192]": (1.15, 0.01),  # current is 13% faster
        "mm_out[bfloat16-4096x4096x4096]": (0.93, 0.08),  # 7.5% slower, but the baseline was noisy
    }
    for name, (factor, rel_spread) in changes.items():
        time = by_name[name]["metrics"]["time"]
        time["value"] *= factor
        time["spread"] = time["value"] * rel_spread
    return run


def other_backend_run(started_at: str = "2025-06-02T11:00:00+00:00") -> RunResult:
    """``sample_run``'s suite against another backend, for side-by-side pages: the case that errors in
    the sample passes here, one that passes there fails here, one case of the sample is absent and one is
    new, and the rest carries the outcomes only rule levels and known failures give (should-failed,
    coverage, a declared known failure)."""
    run = sample_run(started_at=started_at, hostile=True, regress=True, run_id="upstream-run-1")
    run.metadata["backend"] = {
        "name": f"executorch {HOSTILE}",
        "version": "1.5.1",
        "spec": "upstream_executorch:BACKEND",
    }
    changed: list[CaseResult] = []
    for item in run.cases:
        if "test_streams_interleave" in item.id:
            continue  # only in the sample
        if "test_kv_cache_stays_on_gpu" in item.id:
            item = dataclasses.replace(item, outcome="passed", message="")
        elif item.id.endswith("[float32-1x64x48-row]"):
            item = dataclasses.replace(item, outcome="failed", message=f"[mm_out/values] {HOSTILE}")
        elif item.id.endswith("[8]"):
            item = dataclasses.replace(
                item,
                outcome="should-failed",
                message="[mm_out/no-host-sync] returned only after the caller's stream drained",
                rule="mm_out/no-host-sync",
                level="should",
            )
        elif item.id.endswith("[bfloat16-tiny_llm]"):
            item = dataclasses.replace(
                item, outcome="coverage", message="[lowering/ops] op aten::_scaled_dot_product not mapped"
            )
        changed.append(item)
    changed.append(
        dataclasses.replace(
            case("lowering", "test_zoo_model", {"dtype": "float16", "model": "conv"}, "xfailed"),
            message="[lowering/zoo] relative L2 error 0.02 against eager float64 exceeds 0.005 (float16)",
            rule="lowering/zoo",
            level="must",
            known_failure={
                "case": "conformance/lowering/test_lowering.py::test_zoo_model[float16-*]",
                "rule": "lowering/zoo",
                "reason": f"fp16 conv accumulates in fp16 {HOSTILE}",
                "link": "javascript:window.__pwned=3",
                "source": "known.toml #1",
            },
        )
    )
    run.cases = changed
    return run
