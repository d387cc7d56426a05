"""Lower every zoo model × dtype ahead of the suite, in parallel processes.

    python -m conformance.suite.prelower --device cuda --device cpu --jobs 15 \
        [--backend module:attr] [--dtype ...]

The suite's workers would compile programs as cases ask for them, several workers waiting on one compile
(45-60 s each for CUDA on our H200 image). Compiling is CPU work: this runs the same
``backend.lower`` calls the chapters make, many at once, and a backend that caches its artifacts by
content (the reference does) then serves the chapters from its cache. A backend without a cache only
loses the time; set ``CONFORMANCE_PRELOWER=0`` for ``nox -s conformance`` to skip this step. The table it
prints (seconds per compile) is also the cold-compile figure of a run.

A backend that caches each method apart (protocol attribute ``caches_methods``) gets a program of several
methods as a job per method (``asr.encoder``, ``asr.decoder``), each lowered exactly as the whole program
lowers it: the chapters' later ``lower`` of the program finds both in the cache. The run's longest compile
is then one method, not a program: on a machine of many cores, the pool's tail was a few whole ``asr`` or
``llm`` compiles with most cores idle.

A run that lowered every program leaves a stamp (``$CONFORMANCE_CACHE_DIR/prelower/<hash>.done``; the hash
covers the backend's package files, the zoo's sources, the task list, torch and ``$CXX``). A later run
with the same stamp skips the step: on a warm cache it would only export every model again to find its
cache key. Where the backend's own cache was emptied meanwhile, the cases compile what they need.

``--is-done`` only asks: it computes the same tasks and stamp as a run with the same options would, says so
in one line and exits 0 where the stamp is there (nothing to lower) and 1 where not; it lowers nothing. The
front door asks it before sizing a GPU run, so that a warm run gives the cases every core.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from conformance.common.tolerances import DTYPES_BY_NAME
from conformance.models import ZOO
from conformance.protocol import caches_methods
from conformance.suite.toolchain import run_preflight
from harness.backend_loader import backend_path, backend_spec, load_backend, use_backend_path
from harness.caches import artifact_dir
from harness.progress import heartbeat
from harness.stacks import dump_stacks_on_signal

#: Programs beside the zoo that a chapter lowers: the metamorphic chapter's model and its variants.
VARIANT_PREFIX = "variant:"


def _extra_models(device: str) -> list[str]:
    """The metamorphic chapter's programs for ``device`` (its ``VARIANT_CASES``: every variant on the CPU,
    the weight variant on CUDA)."""
    from conformance.models.variants import VARIANTS

    kinds = VARIANTS if device == "cpu" else ("weight",)
    return [f"{VARIANT_PREFIX}{kind}" for kind in ("base", *kinds)]


def prelower_tasks(
    devices: Sequence[str], models: Sequence[str] | None = None, dtypes: Sequence[str] | None = None
) -> list[tuple[str, str, str]]:
    """The programs a pre-lowering of ``devices`` lowers, as (model, dtype, device), the biggest first:
    ``models`` (default: the whole zoo, then the metamorphic chapter's programs in float32) × ``dtypes``
    (default: all). The one list both a run and ``--is-done`` stamp."""
    # The big programs first: the pool's tail is then short ones, not one asr compile with 14 idle processes.
    ordered = sorted(models or list(ZOO), key=lambda m: -len(ZOO[m].methods))
    dtypes = dtypes or list(DTYPES_BY_NAME)
    tasks = [(m, d, dev) for m in ordered for dev in devices for d in dtypes]
    if not models:  # the metamorphic chapter's programs (float32 only), after the zoo's big ones
        tasks += [(m, "float32", dev) for dev in devices for m in _extra_models(dev)]
    return tasks


#: One unit of the pool's work: (model, dtype, device, method); method "" is the whole program.
Job = tuple[str, str, str, str]


def prelower_jobs(tasks: Iterable[tuple[str, str, str]], *, split: bool) -> list[Job]:
    """The pool's jobs for ``tasks``, in their order: where ``split`` (the backend caches each method apart,
    ``caches_methods``), a zoo program of several methods is a job per method, so that the run's longest
    compile is one method (an ``asr`` encoder, not the whole ``asr``); else a job per program."""
    jobs: list[Job] = []
    for model, dtype, device in tasks:
        methods = ZOO[model].methods if split and model in ZOO else ()
        jobs += (
            [(model, dtype, device, m) for m in methods] if len(methods) > 1 else [(model, dtype, device, "")]
        )
    return jobs


def _lower_one(spec: str, model: str, dtype: str, device: str, method: str = "") -> tuple[float, int, str]:
    """In a worker process: lower one program, or one method of it; (seconds, bytes, error or "")."""
    from conformance.common.programs import lower_method, lowered

    start = time.perf_counter()
    try:
        backend = load_backend(spec)
        if model.startswith(VARIANT_PREFIX):
            from conformance.models.variants import build_variant

            methods = build_variant(model.removeprefix(VARIANT_PREFIX), device)
            size = len(backend.lower(methods, device=device))
        elif method:
            size = len(lower_method(backend, model, DTYPES_BY_NAME[dtype], device, method))
        else:
            size = len(lowered(backend, model, DTYPES_BY_NAME[dtype], device).program)
    except Exception as exc:  # reported in the table; the chapter will report it properly
        return time.perf_counter() - start, 0, f"{type(exc).__name__}: {exc}"[:200]
    return time.perf_counter() - start, size, ""


#: Files whose text is hashed into the stamp; any other file of the backend's package counts by size and
#: modification time (compiled libraries of an installed package: large, and stable once installed).
_HASHED_SUFFIXES = {".py", ".cpp", ".h", ".cu", ".toml", ".json"}


def _package_root(spec: str) -> Path | None:
    """The directory (or single file) of the top-level package the backend ``module:attr`` lives in."""
    found = importlib.util.find_spec(spec.partition(":")[0].split(".")[0])
    if found is None:
        return None
    if found.submodule_search_locations:
        return Path(next(iter(found.submodule_search_locations)))
    return Path(found.origin) if found.origin else None


def _digest_tree(digest: Any, root: Path) -> None:
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for path in paths:
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(root.parent)).encode())
        if path.suffix in _HASHED_SUFFIXES:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        else:
            stat = path.stat()
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())


def sources_stamp(spec: str, tasks: Iterable[tuple[str, ...]]) -> str:
    """What a pre-lowering's result depends on, as one hash: the backend spec and its package's files, the
    zoo's sources, the task list, torch's version and the C++ compiler. Equal stamps: an earlier run
    already lowered all of it."""
    import torch

    import conformance.models

    digest = hashlib.sha256()
    digest.update(repr((spec, sorted(tasks), torch.__version__, os.environ.get("CXX", ""))).encode())
    for root in (Path(conformance.models.__file__).parent, _package_root(spec)):
        if root is not None:
            _digest_tree(digest, root)
    return digest.hexdigest()[:32]


def stamp_path(stamp: str) -> Path:
    """Where a finished pre-lowering leaves its stamp: next to the artifact cache it filled."""
    return artifact_dir() / "prelower" / f"{stamp}.done"


def found(stamp: Path) -> bool:
    """Whether ``stamp`` exists, marking it used now where it does (its mtime): a cache kept between CI runs
    is pruned of what no recent run read (``python -m harness.caches --prune-unused-runs``)."""
    if not stamp.exists():
        return False
    with contextlib.suppress(OSError):  # read-only: the stamp still says what it says
        os.utime(stamp)
    return True


def _machine(device: str) -> tuple[str, ...]:
    """What a toolchain verdict also depends on beyond the sources: the GPU it loaded on."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return (props.name, f"{props.major}.{props.minor}", str(torch.version.cuda))
    return ("cpu",)


def _preflight(spec: str, device: str, *, force: bool) -> int:
    """The backend's toolchain preflight for ``device``; exit 3 if it fails. A passed verdict is stamped
    like a pre-lowering (backend files, torch, ``$CXX``) plus the GPU: the same check on the same inputs
    is not repeated (14 s of a warm run), and anything it depends on changing runs it again."""
    done = stamp_path(sources_stamp(spec, [("preflight", device, *_machine(device))]))
    if found(done) and not force:
        print(f"preflight [{device}]: toolchain OK, as an earlier run found with the same backend, torch, "
              f"$CXX and GPU ({done}; --force checks again)", flush=True)  # fmt: skip
        return 0
    with heartbeat(f"preflight [{device}]: the toolchain check (a compile)"):
        ok, lines = run_preflight(load_backend(spec), device)
    print("\n".join(lines) or f"prelower: backend {spec} has no toolchain preflight", flush=True)
    if ok and lines:
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text("\n".join(lines) + "\n")
    return 0 if ok else 3


def _parser() -> argparse.ArgumentParser:
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
        "--backend-path", action="append", default=[], metavar="DIR", help="where the backend's package is"
    )
    parser.add_argument(
        "--dtype", action="append", choices=list(DTYPES_BY_NAME), help="repeatable; default: all"
    )
    parser.add_argument("--model", action="append", choices=list(ZOO), help="repeatable; default: all")
    parser.add_argument(
        "--force",
        action="store_true",
        help="lower (or run the preflight) even where an earlier run with the same sources left its stamp",
    )
    parser.add_argument(
        "--is-done",
        action="store_true",
        help="lower nothing: exit 0 where an earlier run left the stamp of these programs, 1 where not",
    )
    parser.add_argument(
        "--preflight-only",
        action="store_true",
        help="run the backend's toolchain preflight for the first --device and stop (exit 3 if it fails)",
    )
    return parser


def _lower_all(spec: str, tasks: list[tuple[str, str, str]], jobs: int, targets: str, done: Path) -> None:
    """Lower ``tasks`` in ``jobs`` processes (a job per method where the backend caches methods), a line per
    job; write the stamp ``done`` only if none failed."""
    start = time.perf_counter()
    work = prelower_jobs(tasks, split=caches_methods(load_backend(spec)))
    failed: set[tuple[str, str, str]] = set()
    # spawn: a forked child would inherit the parent's CUDA state, which CUDA does not allow.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=dump_stacks_on_signal) as pool:
        futures = {pool.submit(_lower_one, spec, *job): job for job in work}
        for future in as_completed(futures):
            model, dtype, device, method = futures[future]
            seconds, size, error = future.result()
            if error:
                failed.add((model, dtype, device))
            name = f"{model}.{method}" if method else model
            print(
                f"  {name:16} {device:4} {dtype:9} {seconds:7.1f} s  {size / 2**20:7.2f} MiB  {error}",
                flush=True,
            )
        # The stamp and the summary before the pool's shutdown (its processes' exit takes seconds): the
        # front door stops a pre-lowering still running when the cases end, and a run stopped there
        # without its stamp made the next, warm run export every model again.
        total = time.perf_counter() - start
        if not failed:
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(f"{len(tasks)} programs for {targets} with {spec} in {total:.0f} s\n")
        split = f", {len(work)} compiles (a process per method)" if len(work) > len(tasks) else ""
        print(
            f"prelower: {len(tasks) - len(failed)} lowered, {len(failed)} failed, {total:.0f} s wall{split}",
            flush=True,
        )
        end_pool(pool)


#: Seconds to wait for one killed pool process to be gone before killing the next.
END_WAIT_S = 10.0


def end_pool(pool: ProcessPoolExecutor) -> None:
    """End the pool's processes, idle once every job is done, one at a time. Shut down as usual they all
    exit at once, and so do killed ones: each tears down an interpreter with torch, a CUDA context and its
    memory on a core of its own. On two H200s, 31 of them were busy at one moment beside the 24 case
    workers that the last program woke (32 cores); on one H100, 10 beside 7 (16 cores). One at a time, the
    pool takes a core at most. All are stopped first: once one is gone, the executor ends the others at
    once. (``_processes`` is the executor's own table of them; where it is missing, the pool shuts down as
    usual.)"""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(OSError, AttributeError, TypeError):
            os.kill(process.pid, signal.SIGSTOP)
    for process in processes:  # a stopped process dies of SIGKILL, never of the executor's SIGTERM
        with contextlib.suppress(OSError, AttributeError, ValueError):
            process.kill()
            process.join(END_WAIT_S)


def main(argv: list[str] | None = None) -> int:
    dump_stacks_on_signal()  # $CONFORMANCE_STACKS_SIGNAL (harness/stacks.py); its pool's processes too
    args = _parser().parse_args(argv)
    spec = backend_spec(args.backend)
    use_backend_path(backend_path(args.backend_path))  # exported: the pool's processes find it too
    if args.preflight_only:
        return _preflight(spec, (args.device or ["cuda"])[0], force=args.force)
    devices = args.device or ["cuda"]
    tasks = prelower_tasks(devices, args.model, args.dtype)
    targets = "+".join(devices)
    done = stamp_path(sources_stamp(spec, tasks))
    stamped = found(done) and not args.force
    if args.is_done:
        # runner/prelowering.py reads the stamp from this line: keep "(stamp PATH)" at its end.
        if stamped:
            print(f"prelower: done, {len(tasks)} programs for {targets} (stamp {done})", flush=True)
        else:
            why = "--force lowers anyway" if args.force else "no stamp"
            print(f"prelower: not done, {len(tasks)} programs for {targets} ({why}: {done})", flush=True)
        return 0 if stamped else 1
    if stamped:
        # A warm run: every program is in the cache already, and finding each one's key means exporting
        # it again (about 65 s of 15 processes on a 16-core runner) for nothing.
        print(
            f"prelower: skipped, {len(tasks)} programs for {targets}: an earlier run with the same backend, "
            f"zoo, torch and compiler lowered them all ({done}; --force lowers anyway)",
            flush=True,
        )
        return 0
    print(f"prelower: {len(tasks)} programs for {targets} with {spec}, {args.jobs} processes", flush=True)
    _lower_all(spec, tasks, args.jobs, targets, done)
    return 0  # failures are the chapters' to report, with their rule and repro line


if __name__ == "__main__":
    sys.exit(main())
