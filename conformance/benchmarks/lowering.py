"""Suite ``lowering``: what lowering and loading cost, for the zoo's ``linear`` and ``llm`` (float32, CUDA;
the CPU target on a machine without CUDA).

Every measurement runs in a fresh subprocess (``python -m conformance.benchmarks.lowering compile|load``),
so "cold" and "first" mean what a new process on a new machine sees, and the user's caches are never
touched: each cold repeat gets a new, empty temporary directory holding the artifact cache
(``$CONFORMANCE_CACHE_DIR``, which the reference backend honours), inductor's cache
(``$TORCHINDUCTOR_CACHE_DIR``) and Triton's (``$TRITON_CACHE_DIR``), deleted afterwards. A backend that
caches elsewhere is only as cold as its own cache allows. In each subprocess torch is imported, the
backend loaded and the CUDA context created before any clock starts.

Figures (benchmark record ``lowering[<model>-float32]``), median and IQR over the samples:

* ``compile_cold``: ``lower(methods, device="cuda")`` in a fresh process with all caches empty — includes
  export, the backend's passes, the compile, and the first use of torch's lazily imported compiler
  modules. One sample per cold repeat (1 with ``--quick``, 2 without).
* ``compile_warm``: ``lower`` again of the same model in the same process, with the artifact cache now
  filled (3 per cold process): what a re-run of the suite pays per model.
* ``program_size``: bytes of the program file ``lower`` returned (exact; the protocol gives no
  per-method size). A spread means the cold repeats produced programs of different sizes.
* ``first_load``: ``init`` of every method of the program in a fresh process (after CUDA is up): the
  backend's lazy imports and the loading of the compiled code (1 or 2 processes).
* ``warm_load``: ``init`` of every method again in that process while the first handles are alive
  (then ``destroy``), 5 or 10 samples per process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import settings
from conformance.benchmarks import timing_metric
from conformance.protocol import part_attributes
from harness.bench import BenchContext, Suite
from harness.records import BenchRecord, Metric, case_name

SUITE = "lowering"
MODELS = ("linear", "llm")
DTYPE_NAME = "float32"
ROOT = Path(__file__).resolve().parents[2]
# Where the reference backend keeps its artifact cache (reference_impl.artifact_cache); named
# here, not imported, because the suite never imports a backend's code.
CACHE_ENV_VAR = settings.CACHE_DIR.name
COLD_CACHE_VARS = {
    CACHE_ENV_VAR: "artifacts",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
}
WORKER_TIMEOUT_S = 1200.0

# Protocol parts are all-or-nothing, as for the chapters.
NEEDS = part_attributes("lowering", "runtime")


@dataclass(frozen=True)
class Repeats:
    cold: int  # fresh processes with empty caches, one cold compile each
    warm: int  # warm compiles after each cold one, same process
    load_processes: int  # fresh processes timing the first load
    warm_loads: int  # warm loads in each of those processes


QUICK_REPEATS = Repeats(cold=1, warm=3, load_processes=1, warm_loads=5)
FULL_REPEATS = Repeats(cold=2, warm=3, load_processes=2, warm_loads=10)


@dataclass
class ModelCosts:
    """Samples gathered for one model across the worker processes."""

    model: str
    cold_s: list[float] = field(default_factory=list)
    warm_s: list[float] = field(default_factory=list)
    program_bytes: list[int] = field(default_factory=list)
    first_load_s: list[float] = field(default_factory=list)
    warm_load_s: list[float] = field(default_factory=list)
    first_load_per_method_s: list[dict[str, float]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    setup_s: list[float] = field(default_factory=list)
    warm_identical: list[bool] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- worker


def _ready_device(device_index: int) -> str:
    """Bring the device up outside any timed window; the device string for ``lower`` ("cuda" or "cpu")."""
    if device_index < 0:
        return "cpu"
    import torch

    torch.cuda.set_device(device_index)
    torch.empty(1, device="cuda").add_(1)  # the CUDA context and the caching allocator exist now
    torch.cuda.synchronize()
    return "cuda"


def _methods_spec(model: str, dtype_name: str, device: str) -> dict[str, tuple[Any, ...]]:
    import torch

    from conformance.models import get_model

    entry = get_model(model)
    eager = entry.build(getattr(torch, dtype_name), torch.device(device))
    return {name: (mod, inputs, entry.dynamic_shapes_for(name)) for name, (mod, inputs) in eager.items()}


def worker_compile(
    backend_spec: str, model: str, dtype_name: str, device_index: int, program_out: str, warm: int
) -> dict[str, Any]:
    start = time.perf_counter()
    from harness.bench import load_backend

    backend = load_backend(backend_spec)
    device = _ready_device(device_index)
    setup_s = time.perf_counter() - start
    spec = _methods_spec(model, dtype_name, device)
    start = time.perf_counter()
    program = backend.lower(spec, device=device)
    cold_s = time.perf_counter() - start
    Path(program_out).write_bytes(program)
    warm_s, identical = [], True
    for _ in range(warm):
        spec = _methods_spec(model, dtype_name, device)  # fresh modules and dynamic-shape objects
        start = time.perf_counter()
        again = backend.lower(spec, device=device)
        warm_s.append(time.perf_counter() - start)
        identical = identical and again == program
    return {
        "cold_s": cold_s,
        "warm_s": warm_s,
        "program_bytes": len(program),
        "methods": list(spec),
        "setup_s": setup_s,
        "warm_identical": identical,
    }


def worker_load(
    backend_spec: str, program_path: str, methods: Sequence[str], device_index: int, warm: int
) -> dict[str, Any]:
    start = time.perf_counter()
    from harness.bench import load_backend

    backend = load_backend(backend_spec)
    _ready_device(device_index)
    setup_s = time.perf_counter() - start
    program = Path(program_path).read_bytes()
    first: list[object] = []
    per_method: dict[str, float] = {}
    try:
        for method in methods:
            start = time.perf_counter()
            first.append(backend.init(program, method))
            per_method[method] = time.perf_counter() - start
        warm_s = []
        for _ in range(warm):
            start = time.perf_counter()
            made = [backend.init(program, method) for method in methods]
            warm_s.append(time.perf_counter() - start)
            for handle in made:
                backend.destroy(handle)
    finally:
        for handle in first:
            backend.destroy(handle)
    return {
        "first_load_s": sum(per_method.values()),
        "first_load_per_method_s": per_method,
        "warm_load_s": warm_s,
        "setup_s": setup_s,
    }


def worker_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.benchmarks.lowering")
    parser.add_argument("what", choices=("compile", "load"))
    parser.add_argument("--backend", required=True)
    parser.add_argument("--device", type=int, required=True, help="CUDA index, or -1 for the CPU")
    parser.add_argument("--result", required=True, help="JSON file the figures are written to")
    parser.add_argument("--model")
    parser.add_argument("--dtype", default=DTYPE_NAME)
    parser.add_argument("--program", required=True, help="program file: written by compile, read by load")
    parser.add_argument("--methods", default="")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.what == "compile":
        if not args.model:
            parser.error("compile needs --model")
        result = worker_compile(args.backend, args.model, args.dtype, args.device, args.program, args.repeats)
    else:
        methods = [m for m in args.methods.split(",") if m]
        result = worker_load(args.backend, args.program, methods, args.device, args.repeats)
    Path(args.result).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------- parent


def cold_env(root: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment with every compile cache under ``root`` and the repository importable."""
    env = dict(os.environ if base is None else base)
    for var, sub in COLD_CACHE_VARS.items():
        env[var] = str(root / sub)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
    return env


class WorkerFailed(RuntimeError):
    """A worker process exited non-zero or timed out; the message has its stderr tail."""


def run_worker(args: Sequence[str], env: Mapping[str, str], result: Path, timeout_s: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "conformance.benchmarks.lowering", *args, "--result", str(result)]
    try:
        done = subprocess.run(
            command, env=dict(env), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise WorkerFailed(f"{' '.join(args[:1])} worker timed out after {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise WorkerFailed(f"{args[0]} worker exited {done.returncode}:\n{tail}")
    return json.loads(result.read_text())


def measure_model(
    backend_spec: str,
    model: str,
    device_index: int,
    repeats: Repeats,
    log: Callable[[str], None] = print,
    timeout_s: float = WORKER_TIMEOUT_S,
) -> ModelCosts:
    """All samples for ``model``: cold+warm compiles, then first/warm loads of the first cold program."""
    costs = ModelCosts(model)
    common = ["--backend", backend_spec, "--device", str(device_index)]
    with tempfile.TemporaryDirectory(prefix="bench-lowering-") as keep_dir:
        program = Path(keep_dir) / f"{model}.program"
        for index in range(repeats.cold):
            with tempfile.TemporaryDirectory(prefix="bench-lowering-cold-") as tmp:
                root = Path(tmp)
                out = program if index == 0 else root / "program"
                compiled = run_worker(
                    [
                        *("compile", *common, "--model", model, "--dtype", DTYPE_NAME),
                        *("--program", str(out), "--repeats", str(repeats.warm)),
                    ],
                    cold_env(root),
                    root / "compile.json",
                    timeout_s,
                )
            costs.cold_s.append(compiled["cold_s"])
            costs.warm_s.extend(compiled["warm_s"])
            costs.program_bytes.append(compiled["program_bytes"])
            costs.methods = compiled["methods"]
            costs.setup_s.append(compiled["setup_s"])
            costs.warm_identical.append(compiled["warm_identical"])
            log(f"  {model}: cold compile {compiled['cold_s']:.2f} s, {compiled['program_bytes']:,} B")
        for _ in range(repeats.load_processes):
            with tempfile.TemporaryDirectory(prefix="bench-lowering-load-") as tmp:
                root = Path(tmp)
                loaded = run_worker(
                    [
                        *("load", *common, "--program", str(program)),
                        *("--methods", ",".join(costs.methods), "--repeats", str(repeats.warm_loads)),
                    ],
                    cold_env(root),
                    root / "load.json",
                    timeout_s,
                )
            costs.first_load_s.append(loaded["first_load_s"])
            costs.first_load_per_method_s.append(loaded["first_load_per_method_s"])
            costs.warm_load_s.extend(loaded["warm_load_s"])
            costs.setup_s.append(loaded["setup_s"])
    return costs


def cost_timings(costs: ModelCosts) -> dict[str, Metric]:
    """The four timings of one model's lowering costs, as suites ``lowering`` and ``models`` record them."""
    return {
        "compile_cold": timing_metric(costs.cold_s, "no cold compile finished"),
        "compile_warm": timing_metric(costs.warm_s, "no warm compile finished"),
        "first_load": timing_metric(costs.first_load_s, "no first load finished"),
        "warm_load": timing_metric(costs.warm_load_s, "no warm load finished"),
    }


def lowering_record(
    costs: ModelCosts, repeats: Repeats, conditions: Mapping[str, Any] | None = None, device: str = "cuda"
) -> BenchRecord:
    # The CPU target's records are named apart (lowering[linear-float32-cpu]): never compared with a GPU's.
    params = {"model": costs.model, "dtype": DTYPE_NAME, **({"device": device} if device != "cuda" else {})}
    sizes = sorted(set(costs.program_bytes))
    if not sizes:
        size = Metric.missing("B", "lower", "no program was produced")
    else:
        # Lowering is expected to be deterministic; different sizes across cold repeats show as a spread.
        size = Metric(
            unit="B",
            value=sizes[len(sizes) // 2],
            spread=float(sizes[-1] - sizes[0]),
            better="lower",
            n=len(costs.program_bytes),
        )
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="compile_cold",
        metrics={**cost_timings(costs), "program_size": size},
        conditions={
            **(dict(conditions) if conditions else {}),
            "methods": list(costs.methods),
            "first_load_per_method_s": costs.first_load_per_method_s,
            "warm_program_identical": all(costs.warm_identical) if costs.warm_identical else None,
            "repeats": {
                "cold_processes": repeats.cold,
                "warm_compiles_per_process": repeats.warm,
                "load_processes": repeats.load_processes,
                "warm_loads_per_process": repeats.warm_loads,
            },
            "worker_setup_s": [round(s, 3) for s in costs.setup_s],
            "cold": (
                "fresh process; empty "
                + ", ".join(f"${v}" for v in COLD_CACHE_VARS)
                + " (temporary directories)"
            ),
            "timing": "wall clock in the worker process; torch import, backend load and CUDA init excluded",
            "spread": "IQR over samples; program_size spread = max - min over cold repeats",
        },
    )


def run_lowering(ctx: BenchContext) -> None:
    from harness.gpu_state import capture_gpu_state

    repeats = QUICK_REPEATS if ctx.quick else FULL_REPEATS
    on_gpu = ctx.device == "cuda"
    for model in MODELS:
        try:
            index = ctx.device_index if on_gpu else -1  # -1: the workers lower for the CPU
            costs = measure_model(ctx.backend_spec, model, index, repeats, ctx.log)
        except (WorkerFailed, OSError, ValueError, KeyError) as exc:
            ctx.fail(f"lowering[{model}]: {exc}")
            continue
        machine = capture_gpu_state(ctx.device_index).to_conditions() if on_gpu else {}
        record = lowering_record(costs, repeats, machine, ctx.device)
        ctx.emit(record, "benchmark")
        m = record.metrics
        ctx.log(
            f"  {record.name}: compile cold {_shown(m['compile_cold'])}, warm {_shown(m['compile_warm'])}, "
            f"program {_shown(m['program_size'])}, first load {_shown(m['first_load'])}, "
            f"warm load {_shown(m['warm_load'])}"
        )


def _shown(metric: Metric) -> str:
    if metric.value is None:
        return "n/a"
    if metric.unit == "B":
        return f"{metric.value:,.0f} B"
    return f"{metric.value * 1e3:.1f} ms" if metric.value < 1 else f"{metric.value:.2f} s"


SUITES: dict[str, Suite] = {
    SUITE: Suite(
        name=SUITE,
        description=(
            "compile time cold (fresh process, empty caches) and warm, program size, first load (fresh "
            "process) and warm load, for linear and llm"
        ),
        run=run_lowering,
        needs_cuda=False,
        needs_backend=NEEDS,
    ),
}


if __name__ == "__main__":
    sys.exit(worker_main())
