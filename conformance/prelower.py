"""Lower every zoo model × dtype ahead of the suite, in parallel processes.

    python -m conformance.prelower --device cuda --device cpu --jobs 15 [--backend module:attr] [--dtype ...]

The suite's workers would compile programs as cases ask for them, several workers waiting on one compile
(45-60 s each for CUDA on our H200 image). Compiling is CPU work: this runs the same
``backend.lower`` calls the chapters make, many at once, and a backend that caches its artifacts by
content (the reference does) then serves the chapters from its cache. A backend without a cache only
loses the time; set ``CONFORMANCE_PRELOWER=0`` for ``nox -s conformance`` to skip this step. The table it
prints (seconds per program) is also the cold- and warm-compile figure of a run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from conformance.models import ZOO
from conformance.tolerances import DTYPES_BY_NAME
from conformance.toolchain import run_preflight
from harness.backend_loader import backend_spec, load_backend


def _lower_one(spec: str, model: str, dtype: str, device: str) -> tuple[str, str, float, int, str]:
    """In a worker process: lower one program; (model, dtype, seconds, bytes, error or "")."""
    from conformance.programs import lowered

    start = time.perf_counter()
    try:
        program = lowered(load_backend(spec), model, DTYPES_BY_NAME[dtype], device)
    except Exception as exc:  # reported in the table; the chapter will report it properly
        return model, dtype, time.perf_counter() - start, 0, f"{type(exc).__name__}: {exc}"[:200]
    return model, dtype, time.perf_counter() - start, len(program.program), ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device", action="append", choices=["cuda", "cpu"], help="target device, repeatable (default: cuda)"
    )
    parser.add_argument("--jobs", type=int, default=4, help="parallel lowering processes")
    parser.add_argument(
        "--backend", default=None, help="module:attr (default: $CONFORMANCE_BACKEND or the reference)"
    )
    parser.add_argument(
        "--dtype", action="append", choices=list(DTYPES_BY_NAME), help="repeatable; default: all"
    )
    parser.add_argument("--model", action="append", choices=list(ZOO), help="repeatable; default: all")
    parser.add_argument(
        "--preflight-only",
        action="store_true",
        help="run the backend's toolchain preflight for the first --device and stop (exit 3 if it fails)",
    )
    args = parser.parse_args(argv)
    spec = backend_spec(args.backend)
    if args.preflight_only:
        # Alone, before the pre-lowering and the cases start: compiled under full load, the same check
        # took 130 s instead of 10 and held back every worker.
        ok, lines = run_preflight(load_backend(spec), (args.device or ["cuda"])[0])
        print("\n".join(lines) or f"prelower: backend {spec} has no toolchain preflight", flush=True)
        return 0 if ok else 3
    devices = args.device or ["cuda"]
    # The big programs first: the pool's tail is then short ones, not one asr compile with 14 idle processes.
    models = sorted(args.model or list(ZOO), key=lambda m: -len(ZOO[m].methods))
    dtypes = args.dtype or list(DTYPES_BY_NAME)
    tasks = [(m, d, dev) for m in models for dev in devices for d in dtypes]
    targets = "+".join(devices)
    print(f"prelower: {len(tasks)} programs for {targets} with {spec}, {args.jobs} processes", flush=True)
    start = time.perf_counter()
    rows = []
    # spawn: a forked child would inherit the parent's CUDA state, which CUDA does not allow.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        futures = {pool.submit(_lower_one, spec, m, d, dev): dev for m, d, dev in tasks}
        for future in as_completed(futures):
            row = future.result()
            rows.append(row)
            model, dtype, seconds, size, error = row
            where = f"{model:16} {futures[future]:4} {dtype:9}"
            print(f"  {where} {seconds:7.1f} s  {size / 2**20:7.2f} MiB  {error}", flush=True)
    failed = [r for r in rows if r[4]]
    total = time.perf_counter() - start
    print(
        f"prelower: {len(rows) - len(failed)} lowered, {len(failed)} failed, {total:.0f} s wall", flush=True
    )
    return 0  # failures are the chapters' to report, with their rule and repro line


if __name__ == "__main__":
    sys.exit(main())
