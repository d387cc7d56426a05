"""Benchmarks into a result file: ``python -m harness.bench --out results/bench.json [--suite ...]``.

The file has the same format as the conformance results (``harness.results``): each suite is one case
(chapter ``bench``; passed, failed, skipped or error, with the reason), and its figures go into
``run.benchmarks`` (timings) or ``run.traffic`` (PCIe bytes) in the shape of ``harness.records``.

Suites live in a registry: ``SUITE_MODULES`` maps a suite name to the module that defines it (by
path string, imported with importlib when the suite runs); that module exposes
``SUITES: dict[str, Suite]``. The suite definitions sit in ``conformance/benchmarks/`` (they use the
model zoo and the protocol helpers); ``harness`` keeps the runner and the measuring primitives. A
module that does not exist makes its suites skip with that reason.
The backend comes from ``--backend module:attr`` (or ``$CONFORMANCE_BACKEND``), imported here with
importlib: ``harness`` never imports ``conformance`` or ``reference_impl`` statically.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from harness.backend_loader import (
    BACKEND_ENV_VAR,
    BACKEND_PATH_ENV_VAR,
    DEFAULT_BACKEND,
    backend_path,
    backend_spec,
    load_backend,
    use_backend_path,
)
from harness.environment import capture_environment
from harness.formatting import show_relative
from harness.outcomes import FAILING, Outcome
from harness.records import BenchRecord
from harness.results import CaseResult, ResultJournal, RunResult, new_run, utc_now, write_results
from harness.run_history import archive
from harness.timing import QUICK_POLICY, StopPolicy

CHAPTER = "bench"
KINDS = ("benchmark", "traffic")

#: Suite name → module defining it (``SUITES: dict[str, Suite]``). Order is the default run order.
SUITE_MODULES: dict[str, str] = {
    "mm_out": "conformance.benchmarks.mm",
    "threads": "conformance.benchmarks.mm",
    "pipelines": "conformance.benchmarks.pipelines",
    "view_pass": "conformance.benchmarks.view_pass",
    "lowering": "conformance.benchmarks.lowering",
    "models": "conformance.benchmarks.models",
}

FULL_POLICY = StopPolicy(min_samples=10, max_samples=2000, target_rel_iqr=0.02, budget_s=1.0, batch=5)


class SuiteSkipped(Exception):
    """Raised by a suite that cannot run here; the message is the reason recorded."""


@dataclass
class BenchContext:
    """What a suite gets: the backend, the device, how hard to try, and where its records go."""

    backend: Any
    backend_spec: str
    device_index: int
    quick: bool
    policy: StopPolicy
    emit: Callable[[BenchRecord, str], None]
    log: Callable[[str], None] = print
    failures: list[str] = field(default_factory=list)
    #: Where a suite that runs anywhere (``needs_cuda=False``) runs: "cuda" with a GPU, else "cpu".
    device: str = "cuda"

    def fail(self, message: str) -> None:
        """A problem that makes the suite's case fail, without stopping its other measurements."""
        self.failures.append(message)
        self.log(f"  FAILED: {message}")


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    run: Callable[[BenchContext], None]
    needs_cuda: bool = True  # False: it runs on the CPU too (``ctx.device`` says where)
    needs_backend: tuple[str, ...] = ()  # backend attributes the suite calls


# ---------------------------------------------------------------------------------------------- registry


def resolve_suite(name: str) -> Suite:
    """The registered suite ``name``; raises SuiteSkipped when its module is not there yet."""
    module_name = SUITE_MODULES.get(name)
    if module_name is None:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITE_MODULES)}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise SuiteSkipped(f"suite {name!r} is not implemented yet (no module {module_name})") from None
    suites: dict[str, Suite] = getattr(module, "SUITES", {})
    if name not in suites:
        raise SuiteSkipped(f"suite {name!r} is not implemented yet ({module_name} does not define it)")
    return suites[name]


def cuda_status() -> tuple[int, str]:
    """(CUDA device count, why there are none) without allocating anything."""
    import torch

    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken driver must read as "no device", with the reason
        return 0, f"no CUDA device: {type(exc).__name__}: {exc}"
    if count:
        return count, ""
    build = torch.version.cuda or "none (CPU build)"
    return 0, f"no CUDA device: torch {torch.__version__} (CUDA {build}), torch.cuda.is_available() is False"


# ---------------------------------------------------------------------------------------------- running


@dataclass
class BenchRun:
    """The run being written: result file, journal, and the per-kind record lists."""

    path: str
    run: RunResult
    journal: ResultJournal
    repro_base: list[str]

    def emit(self, record: BenchRecord, kind: str = "benchmark") -> None:
        if kind not in KINDS:
            raise ValueError(f"record kind {kind!r} must be one of {KINDS}")
        entry = record.to_dict()
        if kind == "traffic":
            self.run.traffic.append(entry)
            self.journal.add_traffic(entry)
        else:
            self.run.benchmarks.append(entry)
            self.journal.add_benchmark(entry)

    def record_case(self, suite: str, outcome: str, message: str, duration_s: float, quick: bool) -> None:
        repro = shlex.join([*self.repro_base, "--suite", suite, *(["--quick"] if quick else [])])
        case = CaseResult(
            id=f"{CHAPTER}::{suite}",
            chapter=CHAPTER,
            params={"suite": suite, "quick": str(quick).lower()},
            outcome=outcome,
            message=message,
            repro=repro,
            duration_s=round(duration_s, 3),
            worker=None,
        )
        self.run.cases.append(case)
        self.journal.add_case(case)


def run_suite(
    name: str, bench: BenchRun, ctx_factory: Callable[[], BenchContext], cuda_reason: str
) -> Outcome:
    """Run one suite and record its case; returns the outcome."""
    start = time.monotonic()
    ctx = ctx_factory()
    outcome, message = Outcome.PASSED, ""
    try:
        suite = resolve_suite(name)
        if suite.needs_cuda and cuda_reason:
            raise SuiteSkipped(cuda_reason)
        missing = [a for a in suite.needs_backend if not callable(getattr(ctx.backend, a, None))]
        if missing:
            raise SuiteSkipped(f"backend {ctx.backend_spec!r} does not implement {', '.join(missing)}")
        ctx.log(f"[{name}] {suite.description}")
        suite.run(ctx)
        if ctx.failures:
            outcome, message = Outcome.FAILED, "\n".join(ctx.failures)
    except SuiteSkipped as exc:
        outcome, message = Outcome.SKIPPED, str(exc)
    except pytest.skip.Exception as exc:  # a helper shared with the chapters: a protocol part is missing
        outcome, message = Outcome.SKIPPED, str(exc.msg)
    except Exception as exc:
        outcome = Outcome.ERROR
        message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
    if outcome in FAILING:  # skips are listed once, with their reason, in the closing table
        ctx.log(f"[{name}] {outcome}: {message.splitlines()[0] if message else ''}")
    bench.record_case(name, outcome, message, time.monotonic() - start, ctx.quick)
    return outcome


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness.bench",
        description="Benchmark a backend (mm_out vs torch.mm, thread scaling, ...) into a result file.",
    )
    parser.add_argument("--out", default="results/bench.json", help="result file (default: %(default)s)")
    parser.add_argument(
        "--backend",
        default=None,
        help=f"backend as module:attr (default: ${BACKEND_ENV_VAR} or {DEFAULT_BACKEND})",
    )
    parser.add_argument(
        "--backend-path",
        action="append",
        default=[],
        metavar="DIR",
        help=f"directory holding the backend's package (default: ${BACKEND_PATH_ENV_VAR})",
    )
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="move the previous result file at --out into runs/<its run id>/ beside it first (bounded; "
        "harness/run_history.py), once the arguments are known to be good",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0 even when every suite skipped and nothing was measured (default: exit 1 saying so)",
    )
    parser.add_argument(
        "--suite",
        default=",".join(SUITE_MODULES),
        help="comma-separated suites (default: all: %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="a trimmed sweep with a short time budget")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index (default: %(default)s)")
    parser.add_argument("--budget-s", type=float, default=None, help="time budget per figure, seconds")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITE_MODULES]
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(SUITE_MODULES)}", file=sys.stderr)
        return 2
    spec = backend_spec(args.backend)
    directories = backend_path(args.backend_path)
    try:
        use_backend_path(directories)
        backend = load_backend(spec)
    except Exception as exc:
        print(f"cannot load backend {spec!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    policy = QUICK_POLICY if args.quick else FULL_POLICY
    if args.budget_s is not None:
        policy = replace(policy, budget_s=args.budget_s)
    gpus, cuda_reason = cuda_status()
    if not cuda_reason and args.device >= gpus:
        cuda_reason = f"--device {args.device} but only {gpus} CUDA device(s) visible"

    if args.keep_runs:
        out = Path(args.out)
        kept = archive(out.parent, [out.name.removesuffix(".json")])
        if kept is not None:
            print(f"previous run kept in {kept}/")
    metadata = {
        "kind": "bench",
        "backend": {"spec": spec, "name": backend.name, "version": backend.version},
        "suites": suites,
        "quick": args.quick,
        "device_index": args.device,
        "policy": asdict(policy),
    }
    run = new_run(capture_environment(), metadata)
    repro = [
        "python",
        "-m",
        "harness.bench",
        "--out",
        args.out,
        *(["--backend", spec] if args.backend else []),
        *(["--backend-path", os.pathsep.join(directories)] if directories else []),
    ]
    bench = BenchRun(args.out, run, ResultJournal(args.out), repro)
    bench.journal.start(run)

    def make_context() -> BenchContext:
        device = "cpu" if cuda_reason else "cuda"
        return BenchContext(backend, spec, args.device, args.quick, policy, bench.emit, device=device)

    outcomes = {name: run_suite(name, bench, make_context, cuda_reason) for name in suites}
    run.complete = True
    run.finished_at = utc_now()
    write_results(args.out, run)
    bench.journal.discard()
    print(format_table(run))
    print(f"results: {args.out} ({', '.join(f'{k}: {v}' for k, v in outcomes.items())})")
    if any(o in FAILING for o in outcomes.values()):
        return 1
    if not run.benchmarks and not run.traffic:
        verdict = "--allow-empty: exit 0" if args.allow_empty else "failing (--allow-empty accepts this)"
        print(
            f"bench: measured nothing, every suite skipped ({verdict}); the reasons are above",
            file=sys.stderr,
        )
        return 0 if args.allow_empty else 1
    return 0


# ---------------------------------------------------------------------------------------------- table


def format_value(value: float | None, spread: float | None, unit: str) -> str:
    """``1.23 ms ±1.0%``: scaled by the project's one formatter, spread as a percentage."""
    return show_relative(value, spread, unit)


def format_table(run: RunResult, extra_metrics: int = 3) -> str:
    """One line per record (primary figure first, a few others after), then one line per suite case."""
    lines = []
    for entry in [*run.benchmarks, *run.traffic]:
        metrics: dict[str, dict[str, Any]] = entry.get("metrics", {})
        primary = entry.get("primary", "")
        order = [primary, *[k for k in metrics if k != primary]][: 1 + extra_metrics]
        figures = [
            f"{key}={format_value(m.get('value'), m.get('spread'), m.get('unit', ''))}"
            for key in order
            if (m := metrics.get(key)) is not None
        ]
        lines.append(f"{entry.get('name', '?'):<44} " + "  ".join(figures))
    skipped: dict[str, list[str]] = {}  # one line per skip reason, not one per suite
    for case in run.cases:
        reason = case.message.splitlines()[0] if case.message and case.outcome != Outcome.PASSED else ""
        if case.outcome == Outcome.SKIPPED:
            skipped.setdefault(reason, []).append(case.id)
            continue
        lines.append(f"{case.id:<44} {case.outcome}{f' — {reason}' if reason else ''}")
    lines += [f"{', '.join(ids):<44} skipped — {reason}" for reason, ids in skipped.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    # Re-enter through the package name, so suite modules that import harness.bench share these classes.
    from harness.bench import main as _main

    sys.exit(_main())
