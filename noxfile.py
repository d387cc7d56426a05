"""The front door: ``nox -s conformance`` (the suite), ``nox -s tests`` (self-tests), ``nox -s lint``.

On a machine with CUDA torch already installed and no network (a GPU CI image), add ``--no-venv``:
the sessions then run with the interpreter that runs nox and install nothing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox
from nox.command import CommandFailed

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"
# A session's venv is kept between runs; the suite sessions share one (SUITE_VENV), rebuilt only when the
# torch pin or pyproject.toml changes, so a rerun installs nothing.
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).parent
RESULTS = ROOT / "results"
# A CPU build for fresh venvs: an unpinned torch would pull the newest CUDA build (gigabytes).
# Override with e.g. CONFORMANCE_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu".
TORCH_SPEC = os.environ.get("CONFORMANCE_TORCH", "torch==2.13.0")


def _by_path(relative: str) -> Any:
    """A standard-library-only module of the project, loaded by path: no torch, no change to sys.path."""
    spec = importlib.util.spec_from_file_location("_front_door_" + Path(relative).stem, ROOT / relative)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: (chapter, dtype cell) pairs that select cases, read from the chapters' source (conformance/cells.py).
#: New chapters join the matrix without touching this.
MATRIX_CELLS = _by_path("conformance/cells.py").matrix_cells(ROOT / "conformance")
#: The run's deadline, signals and exit codes (harness/run_control.py).
RUN_CONTROL = _by_path("harness/run_control.py")


def _uses_venv(session: nox.Session) -> bool:
    return session.venv_backend != "none"


def _python(session: nox.Session) -> str:
    """The session's interpreter as a full path: the venv's, or without one the Python that runs nox
    (``python`` on PATH may be another interpreter than the one with CUDA torch). A full path also makes
    the repro lines in the results runnable from a plain shell."""
    if not _uses_venv(session):
        return sys.executable
    return str(Path(session.bin) / "python")


def _shown(python: str) -> str:
    """``python`` as a repro line shows it: relative to the repository when inside it (``.nox/…``)."""
    path = Path(python)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else python


def _extra(name: str) -> list[str]:
    """The requirements of pyproject's optional-dependency group ``name``."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: nox itself depends on tomli there
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]


#: The one venv every suite session shares (tests, conformance and its cells, bench, conformance_executorch):
#: one torch on disk instead of one per session. Built on first use with everything any of them needs,
#: then reused; rebuilt only when what it was built from changes (the torch pin, pyproject.toml, Python),
#: which a stamp inside it records.
SUITE_VENV = ROOT / ".nox" / "_suite"


def _suite_python(session: nox.Session) -> str:
    """The interpreter of the shared suite venv (see ``SUITE_VENV``); under ``--no-venv`` the interpreter
    that runs nox, with its packages as they are. A lock keeps sessions started at once on one machine
    (CI fan-out cells) from building it twice."""
    if not _uses_venv(session):
        session.log("--no-venv: using this interpreter's packages as they are (torch, pytest, xdist, ...)")
        return sys.executable
    import fcntl
    import hashlib

    python = SUITE_VENV / "bin" / "python"
    stamp = SUITE_VENV / "installed.txt"
    pyproject = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    want = f"{TORCH_SPEC}\npyproject.toml {pyproject}\nPython {sys.version.split()[0]}\n"
    SUITE_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(SUITE_VENV.parent / "_suite.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == want:
            session.log(f"reusing {_shown(str(SUITE_VENV))} (same torch pin, pyproject.toml and Python)")
            return str(python)
        session.log(f"building the venv the suite sessions share: {_shown(str(SUITE_VENV))}")
        session.run(sys.executable, "-m", "venv", "--clear", str(SUITE_VENV), external=True)
        pip = (str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check")
        session.run(*pip, *shlex.split(TORCH_SPEC), external=True)  # first: the project's torch is then met
        session.run(*pip, "-e", ".[test,hf]", external=True)
        # Upstream ExecuTorch and exactly what its AOT path imports (pyproject's ``executorch`` extra), with
        # --no-deps: its metadata would also pull coremltools, pandas, scikit-learn, torchao and more.
        session.run(*pip, "--no-deps", *_extra("executorch"), external=True)
        stamp.write_text(want)
    return str(python)


def _install_report(session: nox.Session) -> None:
    """What rendering needs (pyproject's ``report`` extra) and the project without its dependencies: the
    reports never import torch, so this venv is tens of MB instead of a torch install."""
    if _uses_venv(session):
        session.install(*_extra("report"))
        session.install("--no-deps", "-e", ".")


def _cuda_device_count(session: nox.Session, python: str) -> int:
    code = "import torch; print(torch.cuda.device_count())"
    out = session.run(python, "-c", code, silent=True, log=False, external=True)
    return int(str(out).strip().splitlines()[-1])


def _visible_gpu_ids(count: int) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(count)]
    return ids[:count]


def _pytest(
    session: nox.Session, python: str, name: str, args: list[str], env: dict[str, str], door: Any
) -> CommandFailed | None:
    """One pytest run writing results/<name>.json and .junit.xml; returns its failure instead of raising.

    A SIGTERM or SIGINT to nox reaches it (harness/run_control.py's FrontDoor): nox sends it SIGTERM, and
    gives it time to write its files."""
    try:
        session.run(
            python, "-m", "pytest", *args,
            "-p", "harness.pytest_plugin",
            f"--results-json={RESULTS / f'{name}.json'}",
            f"--repro-prefix={_shown(python)} -m pytest",
            f"--junitxml={RESULTS / f'{name}.junit.xml'}",
            *door.phase_args(),
            env=env,
            external=True,
            interrupt_timeout=RUN_CONTROL.INTERRUPT_WAIT_S,
            terminate_timeout=RUN_CONTROL.TERMINATE_WAIT_S,
        )  # fmt: skip
    except CommandFailed as exc:
        door.phase_ended(exc.return_code)
        return exc
    except KeyboardInterrupt:  # nox stopped it after a signal (or the deadline's backstop)
        code = door.stop[1] if door.stop else RUN_CONTROL.EXIT_INTERRUPTED
        return CommandFailed(f"stopped: {door.stop[0] if door.stop else 'interrupted'}", return_code=code)
    return None


def _backend_args(session: nox.Session) -> list[str]:
    """The suite's ``--backend X`` and ``--backend-path DIR`` (or ``--opt=X``) from the posargs, for steps
    that need the same backend."""
    found: list[str] = []
    for i, arg in enumerate(session.posargs):
        for option in ("--backend", "--backend-path"):
            if arg.startswith(f"{option}="):
                found += [option, arg.partition("=")[2]]
            elif arg == option and i + 1 < len(session.posargs):
                found += [option, session.posargs[i + 1]]
    return found


def _start_prelower(
    session: nox.Session, python: str, gpus: int, log: Path
) -> subprocess.Popen[bytes] | None:
    """On a GPU runner, start compiling the zoo for both targets on all cores but one, in the background.

    Compiling is CPU work the cases would otherwise do one program at a time. It overlaps the parallel
    phase: a case that needs a program still being compiled waits on the backend's per-program cache lock
    (the reference's artifact cache), and cases that need none run meanwhile. It runs at a lower CPU
    priority, so on a warm cache (where it only re-exports models to find their cache keys) it takes idle
    cycles, not the workers'. Its table goes to ``log``.
    """
    jobs = max(1, (os.cpu_count() or 1) - 1)
    if gpus == 0 or jobs < 2 or os.environ.get("CONFORMANCE_PRELOWER") == "0":
        return None
    cmd = [python, "-m", "conformance.prelower", "--device=cuda", "--device=cpu", f"--jobs={jobs}"]
    cmd += _backend_args(session)
    session.log(f"{shlex.join(cmd)} > {log}  (in the background, nice 10)")
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **COMPILE_ENV},
            start_new_session=True,  # its own process group: stopped as one, pool workers included
            preexec_fn=lambda: os.nice(10),
        )


def _stop_prelower(session: nox.Session, process: subprocess.Popen[bytes], log: Path) -> str:
    """End the background pre-lowering once the parallel phase is over — every program a case needed is
    built by then, so what is left helps no one — before any phase that measures the GPU alone."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    lines = log.read_text(errors="replace").splitlines()
    summary = next((line for line in lines if re.match(r"prelower: (\d+ lowered|skipped)", line)), None)
    if summary is None:  # stopped early: count the programs its table lists
        done = sum(1 for line in lines if re.match(r"^  \S+\s+(cuda|cpu)\s", line))
        summary = f"prelower: stopped after the parallel phase, {done} programs done"
    session.log(f"{summary} (table: {log})")
    return summary.removeprefix("prelower: ")


#: Inductor starts a pool of compile subprocesses per compiling process (one per core); with a process per
#: core compiling, one each is enough and spares hundreds of torch imports.
COMPILE_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


def _workers_per_gpu() -> int:
    """Parallel-phase workers per GPU: the cases are mostly host work (exporting models, float64 eager
    references, small kernels), so the cores decide: three in four of them, leaving room for the background
    pre-lowering and the xdist controller; ``$CONFORMANCE_WORKERS_PER_GPU`` overrides."""
    configured = os.environ.get("CONFORMANCE_WORKERS_PER_GPU", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, (os.cpu_count() or 1) * 3 // 4)


#: Cases that need their GPU to themselves (device-wide NVML counters, recorded timings): they run after
#: the parallel phase, one worker per GPU (pyproject's markers ``traffic`` and ``timing``).
EXCLUSIVE = "traffic or timing"
#: harness/results.py's RUN_ID_ENV (nox cannot import the project): the shards of one run share its id.
RUN_ID_ENV = "CONFORMANCE_RUN_ID"


def _run_id(name: str) -> str:
    """The id every shard of this session records: ``$CONFORMANCE_RUN_ID`` when CI set one, so cells run on
    several runners (README "Sharding the matrix over several CI runners") merge into one run on the
    dashboard; else a new one, sortable by time and unique per session."""
    shared = os.environ.get(RUN_ID_ENV, "").strip()
    return shared or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid():x}-{name}"


def _modules_marking(selection: list[str], marks: tuple[str, ...]) -> list[str] | None:
    """The chapter modules under ``selection``'s directories whose source applies one of ``marks``
    (``pytest.mark.<mark>``), with ``selection``'s options; None (use ``selection`` as it is) when it names
    anything but directories, e.g. one chapter file."""
    dirs = [a for a in selection if not a.startswith("-")]
    if not dirs or not all((ROOT / d).is_dir() for d in dirs):
        return None
    pattern = re.compile(r"pytest\.mark\.(" + "|".join(map(re.escape, marks)) + r")\b")
    found = [
        str(path.relative_to(ROOT))
        for d in dirs
        for path in sorted((ROOT / d).glob("test_*.py"))
        if pattern.search(path.read_text())
    ]
    return [*found, *(a for a in selection if a.startswith("-"))] if found else None


class _Phases:
    """When each step of a run started and how long it took, for the table at its end (harness/phases.py)."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.entries: list[str] = []
        self.failures: list[CommandFailed | None] = []  # each pytest phase's failure (None: it passed)
        self.shards: list[str] = []  # the result files' names the phases started
        self.background: subprocess.Popen[bytes] | None = None  # the pre-lowering, while it runs

    def add(self, name: str, start: float, detail: str) -> None:
        end = time.perf_counter()
        self.entries.append(f"{name}@{start - self.origin:.2f}={end - start:.2f}={detail}")

    def timed(self, name: str, step: Callable[[], str]) -> None:
        start = time.perf_counter()
        self.add(name, start, step())


def _run_suite(
    session: nox.Session, name: str, selection: list[str], *, prelower: bool = True, python: str | None = None
) -> None:
    """Run the conformance suite in phases, then render the summary page even if cases failed or crashed.

    ``prelower=False`` skips compiling the zoo up front (for a backend whose zoo cases cannot run).
    ``python``: the interpreter (default: the session's).

    On a GPU machine: (1) the zoo pre-lowered for both targets on all cores but one, in the background at a
    lower priority, started first; (0) beside it the backend's toolchain preflight, before any case; (1)
    then overlaps (2) every case that may share its GPU, several pytest-xdist workers per GPU, each pinned
    to its GPU with ``CUDA_VISIBLE_DEVICES`` before CUDA starts; (3) once (2) is done and (1) stopped, the
    cases that need their GPU alone (``EXCLUSIVE``), one worker per GPU; (4) with two or more GPUs, the
    cases that need several at once, in one unpinned worker. (0) and (1) are skipped for a narrowed
    selection (``-k``, ``-m``, a file or a case id). Each pytest run writes a shard
    (``results/<name>[-exclusive|-multi-gpu].json``); all share one run id (``$CONFORMANCE_RUN_ID`` when CI
    sets it, so cells on several runners share it too), so every report merges them into one run. The
    per-phase table is printed at the end and stored in each shard.

    ``--run-deadline S`` (or ``$CONFORMANCE_RUN_DEADLINE``) bounds the whole run: each phase gets what is
    left; after the deadline, or a SIGTERM / SIGINT, the result files, JUnit and the page are still written
    and the session exits with the run's code (``harness/run_control.py``, README "Exit codes").
    """
    RESULTS.mkdir(exist_ok=True)
    python = python or _python(session)
    try:
        door = RUN_CONTROL.FrontDoor(session.posargs, os.environ)
    except ValueError as exc:
        session.error(str(exc))
    _check_arguments(session, python, [*selection, *door.args])
    # Only now, with a run that can start: the last run's files move to results/runs/<its run id>/.
    _keep_previous_run(session, python, [name, f"{name}-exclusive", f"{name}-multi-gpu"])
    phases = _Phases()
    door.install()
    try:
        _run_phases(session, name, selection, prelower, python, phases, door)
    except KeyboardInterrupt:  # a signal or the deadline's backstop outside a pytest phase
        session.warn(f"stopped: {door.stop[0] if door.stop else 'interrupted'}")
    door.finishing()
    if phases.background is not None:
        _stop_prelower(session, phases.background, RESULTS / f"{name}.prelower.log")
    _report_run(session, name, phases.shards, python, phases, door)


def _run_phases(
    session: nox.Session,
    name: str,
    selection: list[str],
    prelower: bool,
    python: str,
    phases: _Phases,
    door: Any,
) -> None:
    """The phases of ``_run_suite``, noted in ``phases`` (shards started, the pre-lowering while it runs)."""
    gpus = _cuda_device_count(session, python)
    run_id = _run_id(name)
    env = {RUN_ID_ENV: run_id}
    session.log(f"run id {run_id}" + (f" (${RUN_ID_ENV})" if os.environ.get(RUN_ID_ENV, "").strip() else ""))
    pinned = {"CONFORMANCE_WORKER_GPUS": ",".join(_visible_gpu_ids(gpus))} if gpus >= 2 else {}
    failures = phases.failures

    preflight: list[bool] = []  # the toolchain check's verdict, once it ran

    def check_toolchain() -> str:
        """The backend's preflight, once, before any case (beside the pre-lowering's start; later phases
        then skip their own). A failure stops the pre-lowering and the first phase reports why."""
        cmd = [python, "-m", "conformance.prelower", "--device=cuda", "--preflight-only"]
        try:
            code = subprocess.run(
                [*cmd, *_backend_args(session)], env={**os.environ, **env}, timeout=door.time_left()
            ).returncode
        except subprocess.TimeoutExpired:
            code = RUN_CONTROL.EXIT_DEADLINE
        preflight.append(code == 0)
        return "toolchain OK" if code == 0 else f"toolchain check failed (exit {code})"

    def phase(
        shard: str,
        workers: int,
        marks: str,
        extra_env: dict[str, str],
        detail: str,
        paths: list[str] | None = None,
    ) -> Callable[[], str]:
        def run() -> str:
            if not door.go_on:
                return f"not started: {door.stop[0]}"
            args = [*(paths or selection), "-n", str(workers), "--dist", "worksteal", "-m", marks]
            checked = any(preflight) or any(f is None or f.return_code != 3 for f in failures)
            if checked:  # exit 3 is the preflight's: then every phase says why itself
                args.append("--no-preflight")
            failures.append(_pytest(session, python, shard, args, {**env, **extra_env}, door))
            return detail

        return run

    ran = phases.shards
    ran.append(name)
    if gpus == 0:
        workers = min(2, os.cpu_count() or 1)
        session.log(f"no CUDA device; {workers} pytest-xdist worker(s)")
        phases.timed("cases", phase(name, workers, "not multi_gpu", {}, f"{workers} workers, CPU"))
    else:
        per_gpu = _workers_per_gpu()
        log = RESULTS / f"{name}.prelower.log"
        narrowed = any(a.startswith(("-k", "-m")) or "::" in a or a.endswith(".py") for a in session.posargs)
        background = None
        if prelower and not narrowed:
            # The pre-lowering first, then the preflight beside it: on a cold machine the preflight's one
            # compile took 75-98 s alone while 16 cores idled, and the pre-lowering (300 s of compiles) is
            # what the cases wait for. The cases still start only once the toolchain is known to work.
            started, background = time.perf_counter(), _start_prelower(session, python, gpus, log)
            phases.background = background
            phases.timed("preflight", check_toolchain)
            if not all(preflight) and background is not None:  # nothing worth compiling with this toolchain
                phases.add("prelower (overlapped)", started, _stop_prelower(session, background, log))
                background = phases.background = None
        # Each worker gets its share of the cores for CPU-target programs and eager checks.
        cores = str(max(1, (os.cpu_count() or 1) // per_gpu // gpus))
        shared = {**pinned, **COMPILE_ENV, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", cores)}
        session.log(
            f"{gpus} CUDA device(s); {per_gpu} pytest-xdist worker(s) per GPU, then {EXCLUSIVE!r} alone"
        )
        parallel = f"{per_gpu * gpus} workers, {per_gpu} per GPU"
        marks = f"not multi_gpu and not ({EXCLUSIVE})"
        phases.timed("cases (shared GPU)", phase(name, per_gpu * gpus, marks, shared, parallel))
        if background is not None:  # its GPU work must end before the NVML measurements
            phases.add("prelower (overlapped)", started, _stop_prelower(session, background, log))
            phases.background = None
        exclusive = f"{gpus} worker(s), one per GPU"
        marks = f"not multi_gpu and ({EXCLUSIVE})"
        # Only the modules that mark cases so (collecting the whole suite again costs more than they run).
        alone = _modules_marking(selection, ("traffic", "timing"))
        ran.append(f"{name}-exclusive")
        phases.timed("cases (GPU alone)", phase(f"{name}-exclusive", gpus, marks, pinned, exclusive, alone))
        if gpus >= 2:
            multi = phase(f"{name}-multi-gpu", 1, "multi_gpu", {}, "1 worker, all GPUs")
            ran.append(f"{name}-multi-gpu")
            phases.timed("cases (multi-GPU)", multi)


def _report_run(
    session: nox.Session, name: str, ran: list[str], python: str, phases: _Phases, door: Any
) -> None:
    """After the phases, whatever stopped them: every shard's files (a shard whose pytest died has only a
    journal: ``harness.finalize`` writes its result file and JUnit), the summary page, the phase table,
    and the session's verdict."""
    failures = phases.failures
    for shard in ran:
        result = RESULTS / f"{shard}.json"
        if not result.exists() and Path(f"{result}.journal.jsonl").exists():
            junit = f"--junit={RESULTS / f'{shard}.junit.xml'}"
            finalize = (python, "-m", "harness.finalize", str(result), junit)
            session.run(*finalize, external=True, success_codes=[0, 1])
    files = [str(RESULTS / f"{s}.json") for s in ran]
    present = [f for f in files if Path(f).exists() or Path(f"{f}.journal.jsonl").exists()]
    if present:
        html = RESULTS / f"{name}.html"

        def report() -> str:
            session.run(python, "-m", "reports", *present, "-o", str(html), external=True)
            return "summary page"

        phases.timed("report", report)
        phase_args = [f"--phase={entry}" for entry in phases.entries]
        session.run(python, "-m", "harness.phases", *present, *phase_args, external=True)
        session.log(f"results: {', '.join(present)}  page: {html}")
    door.uninstall()
    if door.stop is not None:  # the run's own exit code (README "Exit codes"), the page written first
        session.log(f"conformance run stopped: {door.stop[0]} (exit {door.stop[1]})")
        raise SystemExit(door.stop[1])
    # pytest's exit 5 (nothing selected) is fine for a phase, as long as some phase ran cases.
    real = [f for f in failures if f and f.return_code != 5]
    if real:
        session.error(f"conformance run failed: pytest exit code {real[0].return_code}")
    if failures and all(f and f.return_code == 5 for f in failures):
        session.error(
            "conformance run selected no case (pytest exit code 5): check -k / -m / the chapter path"
        )


def _check_arguments(session: nox.Session, python: str, args: list[str]) -> None:
    """Before anything is moved or written: the backend loads, every option is valid and the selection
    selects cases (pytest's own collection, harness/check_args.py); a mistake stops the session here."""
    try:
        session.run(python, "-m", "harness.check_args", *args, external=True)
    except CommandFailed:
        session.error("nothing was run and results/ is as it was: fix the arguments above")


def _keep_previous_run(session: nox.Session, python: str, shards: list[str]) -> None:
    """The previous run of these shards moves to results/runs/<run id>/ (bounded: harness/run_history.py)."""
    cmd = [python, "-m", "harness.run_history", "archive", f"--results={RESULTS}"]
    session.run(*cmd, *(f"--name={shard}" for shard in shards), external=True)


@nox.session(venv_backend="none")
def browser(session: nox.Session) -> None:
    """Install a real browser for the dashboard's browser self-test: Debian's ``chromium`` via apt-get.

    This changes the host system (root, apt), so it is its own session that you ask for; ``nox -s tests``
    never installs one and skips that test with this command as the reason. Playwright's own browser
    download is not used (its CDN is often unreachable from CI machines; the distribution's is not).
    """
    if found := _chromium():
        session.log(f"a browser is already there: {found}")
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.error("needs root and apt-get; or install Chromium yourself and set DASHBOARD_CHROMIUM")
    session.log("installing Debian's chromium with apt-get (system packages, about 250 MB)")
    session.run("apt-get", "update", "-qq", external=True, silent=True)
    apt_install = ("apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium")
    session.run(*apt_install, external=True, silent=True)


def _chromium() -> str | None:
    """The browser the dashboard test would use (tests/test_dashboard_browser.py looks in the same places)."""
    candidates = [os.environ.get("DASHBOARD_CHROMIUM"), "/usr/bin/chromium"]
    candidates += [shutil.which("chromium"), shutil.which("chromium-browser")]
    return next((c for c in candidates if c and os.path.exists(c)), None)


@nox.session
def tests(session: nox.Session) -> None:
    """Self-tests of our own machinery; run on any CPU machine."""
    python = _suite_python(session)  # with executorch (19 MB): the adapter's self-tests run upstream's pass
    if not _chromium():
        session.warn("no Chromium: the dashboard's browser test will skip (`nox -s browser` installs one)")
    # Several self-tests compile real artifacts or run the suite in a subprocess; others wait on purpose
    # (hangs, deadlines, signals): one worker more than cores keeps the CPU busy while they wait.
    workers = str(min(4, (os.cpu_count() or 1) + 1))
    session.run(python, "-m", "pytest", "tests", "-n", workers, *session.posargs, external=True)


@nox.session
def conformance(session: nox.Session) -> None:
    """The whole conformance matrix against the backend (``-- --backend module:attr`` picks another)."""
    python = _suite_python(session)
    _write_rule_coverage(session, python)
    _run_suite(session, "conformance", ["conformance"], python=python)


def _write_rule_coverage(session: nox.Session, python: str) -> None:
    """results/rule-coverage.json: which cases and broken backends prove each rule (read from the suite's
    code, a few seconds; the broken backends are the self-tests', so ``tests.rule_coverage`` writes it);
    the dashboard shows it as its coverage page."""
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / "rule-coverage.json"
    with open(target, "w") as out:
        code = subprocess.run([python, "-m", "tests.rule_coverage", "--json"], stdout=out).returncode
    if code != 0:
        target.unlink(missing_ok=True)
        session.warn(
            f"rule coverage table not written (exit {code}); the dashboard will have no coverage page"
        )
    else:
        session.log(f"rule coverage table: {target}")


@nox.session(tags=["matrix"])
@nox.parametrize(("chapter", "dtype"), MATRIX_CELLS)
def conformance_cell(session: nox.Session, chapter: str, dtype: str) -> None:
    """One cell of the matrix (chapter × dtype), for CI fan-out from ``nox -l --json -t matrix``.

    The cells share the suite's venv (``SUITE_VENV``) instead of a torch install each. Each writes
    ``results/cell-<chapter>-<dtype>*.json``, a name no other cell uses, so the files of every runner can be
    gathered into one folder; with one ``$CONFORMANCE_RUN_ID`` for all of them, ``nox -s report`` shows them
    as one run (README "Sharding the matrix over several CI runners")."""
    selection = [f"conformance/test_{chapter}.py", f"--dtype={dtype}"]
    python = _suite_python(session)
    # No pre-lowering: a cell compiles only the programs of its chapter and dtype, as its cases need them.
    _run_suite(session, f"cell-{chapter}-{dtype}", selection, prelower=False, python=python)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    if _uses_venv(session):
        session.install("ruff")
    session.run(_python(session), "-m", "ruff", "check", ".")


@nox.session
def report(session: nox.Session) -> None:
    """Render the dashboard from result files (default: results/*.json) into site/.

    Files of one run id are one run: a run's phases, and CI cells run on several runners with one
    ``$CONFORMANCE_RUN_ID`` whose files were gathered into one folder (``-- results``).

    ``-- --baseline DIR_OR_JSON --fail-on-regression`` compares with a baseline and exits non-zero on a
    regression or a newly failing case, so CI can gate on it.
    """
    inputs = [a for a in session.posargs if not a.startswith("-")]
    if not inputs and not list(RESULTS.glob("*.json")):
        session.error(f"no result files in {RESULTS}: run `nox -s conformance` (or `nox -s bench`) first")
    _install_report(session)
    session.run(_python(session), "-m", "reports.dashboard", *session.posargs)


@nox.session(name="clean-cache", venv_backend="none")
def clean_cache(session: nox.Session) -> None:
    """Remove the compile caches (compiled programs, inductor's, Triton's): the next run is a cold one.
    ``-- --all`` also removes the venvs and the kept runs. ``python -m harness.caches`` lists them, sized."""
    session.run(sys.executable, "-m", "harness.caches", "--clear", *session.posargs, external=True)


@nox.session(venv_backend="none")
def compare(session: nox.Session) -> None:
    """Two runs in the terminal: newly failing, newly skipped, lost, fixed, timing ratios, benchmarks.

    Default: the latest ``nox -s conformance`` run against the one before it (``results/runs/``); ``--
    BASELINE [CURRENT]`` names others (a file, a directory, a run id), ``-- --list`` lists them. It needs
    only the standard library, so it runs with the interpreter that runs nox (no venv)."""
    session.run(sys.executable, "-m", "reports.compare", *session.posargs, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (mm_out vs torch.mm, thread scaling, pipelines, models, lowering costs) into
    results/bench.json (the previous one kept in results/runs/). Without a GPU the view-pass and lowering
    suites run on the CPU; a run that measured nothing fails unless ``-- --allow-empty``."""
    python = _suite_python(session)
    RESULTS.mkdir(exist_ok=True)
    out = f"--out={RESULTS / 'bench.json'}"
    session.run(python, "-m", "harness.bench", out, "--keep-runs", *session.posargs, external=True)


@nox.session
def conformance_executorch(session: nox.Session) -> None:
    """Upstream ExecuTorch (PyPI) through the adapter ``upstream_executorch:BACKEND``: its self-tests, then
    the lowering chapter (the view pass everywhere; CUDA lowering on a GPU) and the differential chapter (its
    view pass section; the adapter has no runtime part) into conformance-executorch.json.

    executorch is installed with ``--no-deps``: its metadata pulls coremltools, pandas, scikit-learn, torchao
    and more that the AOT path never imports; pyproject's ``executorch`` extra lists what it does import.
    """
    python = _suite_python(session)
    session.run(python, "-m", "pytest", "tests/test_upstream_executorch.py", "-q", external=True)
    # The zoo cases need a runtime part, which the adapter lacks: prelowering the zoo would be lost work.
    # Upstream's known defects are declared (strict: a fixed one fails the run until its entry goes).
    known = ROOT / "upstream_executorch" / "known_failures.toml"
    selection = ["conformance/test_lowering.py", "conformance/test_differential.py"]
    selection.append("--backend=upstream_executorch:BACKEND")
    selection.append(f"--known-failures={known}")
    _run_suite(session, "conformance-executorch", selection, prelower=False, python=python)
