"""All suite configuration in one place: backend selection, device gating, matrix cells, run header."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
import torch

import settings
from conformance.common import declared_rules, generation
from conformance.common.contract_monitor import ContractMonitor, MonitorFailure
from conformance.common.oracle import DEFAULT_ORACLE, ORACLE_KEY, ORACLE_SPEC_KEY
from conformance.common.parts import part_fixture
from conformance.common.session import BACKEND_KEY, SPEC_KEY, cuda_device_count
from conformance.protocol import Backend
from conformance.suite import known_failures
from conformance.suite import outcomes as case_outcomes
from conformance.suite.crash_replay import CrashReplays
from conformance.suite.toolchain import run_preflight
from harness import causes, cuda_sync, progress
from harness.backend_loader import (
    BACKEND_PATH_ENV_VAR,
    DEFAULT_BACKEND,
    BackendLoadError,
    backend_path,
    backend_spec,
    load_backend,
    use_backend_path,
)
from harness.outcomes import SUITE_CHECK_MARKER, Outcome, count_words, is_suite_check
from harness.pytest_plugin import recorded_run, worker_of
from harness.results import chapter_of
from harness.stacks import dump_stacks_on_signal

#: Each case's time limit (harness/case_limits.py; ``--case-timeout`` overrides): ten minutes, about 4x the
#: slowest case of a cold H100 run (158 s: a case that waited on the zoo's compiles); twice that for the
#: cases marked slow (large shapes, compiles of their own).
CASE_TIMEOUTS = ("default=600", "marker:slow=1200")
#: Set by ``nox -s conformance`` on multi-GPU machines: the GPU ids the xdist workers share out, one each.
WORKER_GPUS_ENV = settings.WORKER_GPUS.name
DTYPE_PARAM = "dtype"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption(
        "--backend",
        default=None,
        help=f"backend under test as module:attr (default: $CONFORMANCE_BACKEND or {DEFAULT_BACKEND})",
    )
    group.addoption(
        "--backend-path",
        action="append",
        default=[],
        metavar="DIR",
        help=f"directory holding the backend's package, when it lives outside this repository (searched "
        f"first; repeatable; default: ${BACKEND_PATH_ENV_VAR}); carried into every repro line",
    )
    group.addoption(
        "--no-preflight",
        action="store_true",
        help="skip the backend's toolchain preflight (run once before any case when it has one)",
    )
    group.addoption(
        "--dtype",
        default=None,
        choices=("float32", "float16", "bfloat16", "independent"),
        help="run one matrix cell: only cases of this dtype (float32, float16, bfloat16), or "
        "'independent' for the cases that have no dtype parameter",
    )
    case_outcomes.add_options(group)  # --strict-should, --known-failures
    generation.add_options(group)  # --generated-examples (Hypothesis's own: --hypothesis-seed)
    group.addoption(
        "--oracle",
        default=None,
        help=f"the differential chapter's oracle backend as module:attr (default: {DEFAULT_ORACLE})",
    )
    progress.add_option(group)  # --progress-every
    group.addoption(
        "--no-contract-monitor",
        action="store_true",
        help="call the backend directly instead of through the contract monitor, which checks on every call "
        "what the contract states for every call (inputs untouched, results owned, result signature, error "
        "classes); for measuring its cost",
    )


def worker_gpu(worker: str, gpu_ids: list[str]) -> str:
    """The GPU id xdist worker ``gwN`` is pinned to: worker N takes id N, round robin."""
    return gpu_ids[int(worker.removeprefix("gw")) % len(gpu_ids)]


def _gpu_ids() -> list[str]:
    return [g.strip() for g in os.environ.get(WORKER_GPUS_ENV, "").split(",") if g.strip()]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # xdist gives workers `workerinput`; the environment variable may be inherited from an outer run.
    worker = config.workerinput["workerid"] if hasattr(config, "workerinput") else None
    dump_stacks_on_signal()  # $CONFORMANCE_STACKS_SIGNAL: what a waiting worker waits on
    # Also where the chapters run under another rootdir's ini than pyproject.toml (which declares it too).
    config.addinivalue_line(
        "markers", f"{SUITE_CHECK_MARKER}: checks the suite itself, no backend involved (counted apart)"
    )
    config.addinivalue_line("markers", declared_rules.MARKER_HELP)
    gpu_ids = _gpu_ids()
    generation.configure(config)
    if worker and gpu_ids:
        # Must precede CUDA's initialisation in this worker, which reads the variable once.
        if torch.cuda.is_initialized():
            raise pytest.UsageError(f"{worker}: CUDA initialised before the worker could be pinned to a GPU")
        os.environ["CUDA_VISIBLE_DEVICES"] = worker_gpu(worker, gpu_ids)
    if not torch.cuda.is_initialized():  # before the CUDA context, which takes its flags once
        cuda_sync.apply_from_env()  # the front door's shared phase: GPU waits sleep (harness/cuda_sync.py)
    if config.pluginmanager.hasplugin("harness.pytest_plugin"):
        from harness.run_end import set_suite_rules

        set_suite_rules(config, CASE_TIMEOUTS)
    spec = backend_spec(config.getoption("--backend"))
    directories = backend_path(config.getoption("--backend-path"))
    try:
        use_backend_path(directories)
        backend = load_backend(spec)
    except BackendLoadError as exc:
        raise pytest.UsageError(str(exc)) from exc
    if not config.getoption("--no-contract-monitor"):
        backend = ContractMonitor(
            backend
        )  # every chapter's calls checked (conformance/common/contract_monitor.py)
    config.stash[BACKEND_KEY] = backend
    config.stash[SPEC_KEY] = spec
    progress.register(config)  # a line every 30 s from here on, the preflight's compile included
    oracle_spec = config.getoption("--oracle") or DEFAULT_ORACLE
    try:
        config.stash[ORACLE_KEY] = load_backend(oracle_spec)
    except BackendLoadError as exc:
        raise pytest.UsageError(f"--oracle: {exc}") from exc
    config.stash[ORACLE_SPEC_KEY] = oracle_spec
    # Rule levels, coverage gaps and declared known failures decide each case's outcome (outcomes.py).
    files = list(config.getoption("--known-failures") or [])
    try:
        entries = known_failures.load_all(backend, files)
    except known_failures.KnownFailuresError as exc:
        raise pytest.UsageError(f"--known-failures: {exc}") from exc
    sources = (["backend attribute known_failures"] if known_failures.from_backend(backend) else []) + files
    plugin = case_outcomes.CaseOutcomes(config, entries, sources, backend)
    config.pluginmanager.register(plugin, "conformance-outcomes")
    if not worker:  # where pytest-xdist reports a dead worker: its crash is found again and shrunk
        config.pluginmanager.register(CrashReplays(config), "conformance-crash-replays")
    if config.pluginmanager.hasplugin("harness.pytest_plugin"):
        from harness.pytest_plugin import add_run_metadata

        identity = {"spec": spec, "name": backend.name, "version": backend.version}
        add_run_metadata(config, "backend", {**identity, **({"path": directories} if directories else {})})
        repro_args = [] if spec == DEFAULT_BACKEND else ["--backend", spec]
        repro_args += ["--backend-path", os.pathsep.join(directories)] if directories else []
        # A known failure (xfailed, or stale) reproduces as recorded only with its file.
        repro_args += [arg for path in files for arg in ("--known-failures", path)]
        # Generated cases draw the same examples only with the same oracle, seed and budget.
        repro_args += [] if oracle_spec == DEFAULT_ORACLE else ["--oracle", oracle_spec]
        seed = config.getoption("--hypothesis-seed", None)
        repro_args += [] if seed is None else [f"--hypothesis-seed={seed}"]
        scale = config.getoption("--generated-examples", 1.0)
        repro_args += [] if scale in (None, 1.0) else [f"--generated-examples={scale}"]
        add_run_metadata(config, "repro_args", repro_args)
        workers = getattr(config.option, "numprocesses", None)
        if gpu_ids and isinstance(workers, int) and not worker:
            pinned = {f"gw{i}": worker_gpu(f"gw{i}", gpu_ids) for i in range(workers)}
            add_run_metadata(config, "worker_gpus", pinned)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Toolchain preflight, once, in the controller, before any case: a broken compiler stops the run
    with the backend's diagnosis instead of crashing workers mid-run (SPEC §3)."""
    config = session.config
    backend = config.stash[BACKEND_KEY]
    if hasattr(config, "workerinput") or config.getoption("--no-preflight"):
        return
    if config.getoption("--collect-only"):
        return
    device = "cuda" if cuda_device_count() else "cpu"
    ok, lines = run_preflight(backend, device)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in lines if ok else lines[:2]:
            reporter.write_line(line)
    if not ok:
        details = "\n".join(lines)
        pytest.exit(f"toolchain preflight failed for {device}; no case was run.\n{details}", returncode=3)


def pytest_report_header(config: pytest.Config) -> list[str]:
    backend = config.stash[BACKEND_KEY]
    gpus = [torch.cuda.get_device_name(i) for i in range(cuda_device_count())]
    return [
        f"backend: {backend.name} {backend.version} ({config.stash[SPEC_KEY]})",
        f"torch: {torch.__version__}, CUDA: {torch.version.cuda or 'none (CPU build)'}",
        f"GPUs: {', '.join(gpus) if gpus else 'none: chapters that need CUDA are skipped'}",
    ]


def _case_dtype(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    if callspec is None or DTYPE_PARAM not in callspec.params:
        return "independent"
    return str(callspec.params[DTYPE_PARAM])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = config.getoption("--dtype")
    if wanted:
        selected = [item for item in items if _case_dtype(item) == wanted]
        deselected = [item for item in items if _case_dtype(item) != wanted]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    gpus = cuda_device_count()
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            generation.replayed(item.obj)  # --generated-replay: the @given case replays the example named
    for item in items:
        chapter = item.path.stem.removeprefix("test_")
        if item.get_closest_marker("gpu") and gpus == 0:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"{chapter} chapter needs CUDA and no CUDA device is present "
                    f"(torch {torch.__version__}, torch.cuda.is_available() is False)"
                )
            )
        elif item.get_closest_marker("multi_gpu") and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 or more CUDA devices; {gpus} present"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The contract monitor's record starts with the case (its fixtures' calls included)."""
    monitor = item.config.stash.get(BACKEND_KEY, None)
    if isinstance(monitor, ContractMonitor):
        monitor.begin()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    """A case whose calls broke an every-call invariant fails under the monitor's rule, ahead of whatever
    the case itself then found (kept in the message, and its rule for known-failure entries)."""
    __tracebackhide__ = True
    own: BaseException | None = None
    try:
        result = yield
    except BaseException as exc:  # a failure, a skip or an interruption: the monitor speaks first
        own = exc
    monitor = item.config.stash.get(BACKEND_KEY, None)
    found = monitor.violations() if isinstance(monitor, ContractMonitor) else []
    if found and not isinstance(own, (KeyboardInterrupt, SystemExit)):
        raise MonitorFailure.of(found, own) from None
    if own is not None:
        raise own
    return result


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test, loaded once from --backend / $CONFORMANCE_BACKEND."""
    return request.config.stash[BACKEND_KEY]


# Cases annotate it ``LoweringRuntimeBackend`` (conformance/common/parts.py).
runtime = part_fixture(
    "lowering",
    "runtime",
    doc="The backend, for chapters that lower programs and run them (parts ``lowering`` and ``runtime``).",
)


@dataclass(frozen=True)
class _Seen:
    """One case as the end-of-run lines count it."""

    id: str
    outcome: str
    suite_check: bool
    skip_reason: str | None
    rule: str | None
    worker: str | None
    started_s: float | None


def _seen_cases(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> list[_Seen]:
    """The run's cases: the result file's where the run records one (its outcomes are final: a crash or a
    device fault a known failure declares is ``xfailed`` there, not pytest's ``failed``), else pytest's
    report categories (a plain ``pytest conformance/...``)."""
    run = recorded_run(config)
    if run is not None:
        return [
            _Seen(c.id, c.outcome, c.suite_check, c.message if c.outcome == Outcome.SKIPPED else None,
                  c.rule, c.worker, c.started_s)
            for c in run.cases
        ]  # fmt: skip
    seen = []
    # pytest's categories, then the outcomes.py plugin's (should-failed, coverage; xfailed: declared known
    # failures) and the watchdog's and the run's end (timeout, device-fault, not-run: harness/run_end.py).
    for category in (*CHAPTER_LINE_OUTCOMES, case_outcomes.SUITE_CHECK_CATEGORY):
        outcome = Outcome.PASSED if category == case_outcomes.SUITE_CHECK_CATEGORY else category
        for report in terminalreporter.stats.get(category, []):
            when = getattr(report, "when", "call")
            if when == "teardown" or (outcome == Outcome.PASSED and when != "call"):
                continue
            reason = None
            if outcome == Outcome.SKIPPED and isinstance(report.longrepr, tuple):
                reason = report.longrepr[2].removeprefix("Skipped: ")
            rule = (case_outcomes.case_result(report) or {}).get("rule")
            start = getattr(report, "start", None)
            seen.append(
                _Seen(report.nodeid, outcome, is_suite_check(report), reason, rule, worker_of(report), start)
            )
    return seen


#: The outcomes a chapter's line always counts, then those it counts where some case had them.
CHAPTER_LINE_PLAIN = (Outcome.PASSED, Outcome.FAILED, Outcome.ERROR, Outcome.SKIPPED)
CHAPTER_LINE_EXTRAS = (
    Outcome.SHOULD_FAILED, Outcome.COVERAGE, Outcome.XFAILED, Outcome.CRASHED, Outcome.TIMEOUT,
    Outcome.DEVICE_FAULT, Outcome.NOT_RUN, Outcome.XPASSED,
)  # fmt: skip
CHAPTER_LINE_OUTCOMES = (*CHAPTER_LINE_PLAIN, *CHAPTER_LINE_EXTRAS)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """The failed rules, the likely cause first; then one line per chapter, with its skip reasons, so a CPU
    run says plainly what it skipped. One list of cases for both (``_seen_cases``)."""
    seen = _seen_cases(terminalreporter, config)
    _failed_rules_summary(terminalreporter, seen)
    cases = [c for c in seen if c.id.startswith("conformance/")]  # the chapters' (not a self-test's own)
    per_chapter: dict[str, Counter[str]] = defaultdict(Counter)
    suite_checks: dict[str, Counter[str]] = defaultdict(Counter)  # the suite's own: never the backend's
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for case in cases:
        chapter = chapter_of(case.id)
        if case.suite_check:
            per_chapter[chapter]  # the chapter has a line, its counts without these
            suite_checks[chapter][case.outcome] += 1
            continue
        per_chapter[chapter][case.outcome] += 1
        if case.skip_reason:
            reasons[chapter][case.skip_reason] += 1
    if not per_chapter:
        return
    terminalreporter.section("conformance chapters")
    for chapter in sorted(per_chapter):
        counts = per_chapter[chapter]
        line = f"{chapter}: " + ", ".join(f"{counts[o]} {o}" for o in CHAPTER_LINE_PLAIN)
        line += "".join(f", {counts[o]} {o}" for o in CHAPTER_LINE_EXTRAS if counts[o])
        if suite_checks[chapter]:
            line += f" (suite self-checks, no backend: {count_words(suite_checks[chapter])})"
        if reasons[chapter]:
            line += " — " + skip_reasons(reasons[chapter])
        terminalreporter.write_line(line)


#: Skip reasons a chapter's line names, most frequent first; the rest are counted.
SKIP_REASONS_SHOWN = 3


def skip_reasons(reasons: Counter[str]) -> str:
    """``N skipped because: R; M because: S; K more for 2 other reasons``: every reason's share, not only
    the most frequent one's."""
    shown = reasons.most_common(SKIP_REASONS_SHOWN)
    parts = [f"{shown[0][1]} skipped because: {shown[0][0]}"] + [f"{n} because: {r}" for r, n in shown[1:]]
    rest = reasons.most_common()[SKIP_REASONS_SHOWN:]
    if rest:
        parts.append(f"{sum(n for _, n in rest)} more for {len(rest)} other reason(s)")
    return "; ".join(parts)


def _failed_rules_summary(terminalreporter: pytest.TerminalReporter, cases: list[_Seen]) -> None:
    """One line per rule that failed, the rule explaining the most failures first, a failure after a broken
    every-call invariant in its worker counted under that invariant (``harness.causes``): what a reader wants
    before case ids. Every failure keeps its own rule in the result file and the repro list."""
    ranked = causes.likely_causes(cases)
    if not ranked:
        return
    explained = sum(cause.explained for cause in ranked)
    terminalreporter.section(
        f"failed rules: {len(ranked)} ({explained} cases), the likely cause first", red=True
    )
    for cause in ranked:
        terminalreporter.write_line(cause.words())


@pytest.fixture(autouse=True, scope="session")
def _float32_means_float32() -> None:
    """TF32 off for the whole suite: cuDNN allows it by default, which would blur every float32 check."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
