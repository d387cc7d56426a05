"""The front door: ``nox -s conformance`` (the suite), ``nox -s tests`` (self-tests), ``nox -s lint``.

On a machine with CUDA torch already installed and no network (a GPU CI image), add ``--no-venv``:
the sessions then run with the interpreter that runs nox and install nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

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


def _front(dotted: str) -> Any:
    """A standard-library-only module of this checkout's runner (``runner.run``) or harness, imported as
    itself without a change to sys.path: the packages it stands on (``settings``, ``harness``, ``runner``)
    are registered from ROOT first, so the module's own imports find this checkout's modules too."""
    for name in ("settings", "harness", "runner"):
        if name not in sys.modules:
            init = ROOT / name / "__init__.py"
            spec = importlib.util.spec_from_file_location(
                name, init, submodule_search_locations=[str(init.parent)]
            )
            assert spec is not None
            assert spec.loader is not None
            package = importlib.util.module_from_spec(spec)
            sys.modules[name] = package
            spec.loader.exec_module(package)
    return importlib.import_module(dotted)


#: The chapters, name -> test module: the folders ``conformance/<name>/test_<name>.py``
#: (conformance/catalogue/chapters.py). A new chapter folder joins the matrix without touching this.
CHAPTERS = _by_path("conformance/catalogue/chapters.py").chapter_files(ROOT / "conformance")
#: (chapter, dtype cell) pairs that select cases, read from the chapters' source (conformance/suite/cells.py).
MATRIX_CELLS = _by_path("conformance/suite/cells.py").matrix_cells(CHAPTERS)
#: A run's phases, its report and its process counts (runner/): this file picks the session
#: and passes its arguments.
PLAN = _front("runner.plan")
RUN = _front("runner.run")
SIZING = _front("runner.sizing")
CACHES = _front("harness.caches")


def _uses_venv(session: nox.Session) -> bool:
    return session.venv_backend != "none"


def _python(session: nox.Session) -> str:
    """The session's interpreter as a full path: the venv's, or without one the Python that runs nox
    (``python`` on PATH may be another interpreter than the one with CUDA torch). A full path also makes
    the repro lines in the results runnable from a plain shell."""
    if not _uses_venv(session):
        return sys.executable
    return str(Path(session.bin) / "python")


def _shown(path: str) -> str:
    """``path`` as the log shows it: relative to the repository when inside it (``.nox/…``)."""
    return str(Path(path).relative_to(ROOT)) if Path(path).is_relative_to(ROOT) else path


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
#: The bytecode the suite venv's sessions share where $PYTHONDONTWRITEBYTECODE is set (``_share_bytecode``).
VENV_PYCACHE = ROOT / ".nox" / "pycache"


def _suite_python(session: nox.Session) -> str:
    """The interpreter of the shared suite venv (see ``SUITE_VENV``); under ``--no-venv`` the interpreter
    that runs nox, with its packages as they are. A lock keeps sessions started at once on one machine
    (CI fan-out cells) from building it twice."""
    if not _uses_venv(session):
        session.log("--no-venv: using this interpreter's packages as they are (torch, pytest, xdist, ...)")
        return sys.executable
    # Where $PYTHONDONTWRITEBYTECODE is set (CI images often set it) Python caches no bytecode, and every
    # process compiled torch again: the sessions' processes share VENV_PYCACHE instead. Python then reads
    # bytecode only there, so byte-compiling the venv up front (47 s on two cores) would be lost time.
    _share_bytecode(session, VENV_PYCACHE)
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
        pip = (str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile")
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


class _NoxConsole:
    """nox's session as a run's console (runner/console.py): nox shows each command line, runs
    it in the session's environment, and fails the session on a step's failure as it does anywhere."""

    def __init__(self, session: nox.Session) -> None:
        self.session = session

    def log(self, message: str) -> None:
        self.session.log(message)

    def warn(self, message: str) -> None:
        self.session.warn(message)

    def error(self, message: str) -> NoReturn:
        self.session.error(message)

    def run(self, cmd: Sequence[str], *, success_codes: Sequence[int] = (0,)) -> None:
        self.session.run(*cmd, external=True, success_codes=list(success_codes))

    def output(self, cmd: Sequence[str]) -> str:
        return str(self.session.run(*cmd, silent=True, log=False, external=True))

    def exit_code(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        interrupt_s: float | None = None,
        terminate_s: float | None = None,
    ) -> int:
        # nox's own waits unless given: a stopped pytest gets the run's (harness/run_control.py).
        waits = {"interrupt_timeout": interrupt_s, "terminate_timeout": terminate_s}
        try:
            self.session.run(
                *cmd, env=env, external=True, **{k: v for k, v in waits.items() if v is not None}
            )
        except CommandFailed as exc:
            return 1 if exc.return_code is None else exc.return_code  # None: it could not start
        return 0

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str], output: Path) -> subprocess.Popen[bytes]:
        self.session.log(f"{shlex.join(cmd)} > {_shown(str(output))}  (in the background)")
        with open(output, "wb") as out:
            return subprocess.Popen(cmd, env=self._environment(env), stdout=out, stderr=subprocess.STDOUT)

    def _environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """What ``session.run(..., env=env)`` gives its command: the session's environment and, in a
        venv, its bin folder first on ``PATH`` (the fork server's workers must match their controller's)."""
        compute = getattr(self.session.virtualenv, "_get_env", None)  # nox's own, where this nox has it
        if compute is not None:
            full = compute(dict(env))
        else:
            full = {**os.environ, **(self.session.env or {}), **env}
        return {k: v for k, v in full.items() if v is not None}

    def echo(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()


def _run_suite(
    session: nox.Session,
    name: str,
    selection: list[str],
    *,
    python: str,
    prelower: bool = True,
    coverage: tuple[str, ...] = (),
) -> None:
    """Run the conformance suite in phases, then render the summary page even if cases failed or crashed
    (runner/run.py says what the phases are). ``prelower=False`` skips compiling the zoo up
    front (for a backend whose zoo cases cannot run); ``python``: the interpreter that runs the cases;
    ``coverage``: the command that writes the rule coverage table, run beside the run."""
    run = PLAN.SuiteRun(ROOT, name, tuple(selection), python, tuple(session.posargs), prelower, coverage)
    _share_bytecode(session)  # each process compiled the suite and rewrote its tests again
    RUN.run_suite(_NoxConsole(session), run)


def _share_bytecode(session: nox.Session, folder: Path | None = None) -> None:
    """Where $PYTHONDONTWRITEBYTECODE is set, give the session's commands one bytecode prefix
    (``harness.caches.bytecode_env``; ``folder``, else the artifact cache's), unless one is set already."""
    bytecode = CACHES.bytecode_env({**os.environ, **(session.env or {})}, folder)
    session.env.update(bytecode)
    if prefix := bytecode.get("PYTHONPYCACHEPREFIX"):
        session.log(f"$PYTHONDONTWRITEBYTECODE is set: the session's processes share bytecode in {prefix}")


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
    """The browser the dashboard test would use (tests/reports/test_dashboard_browser.py looks in the same
    places)."""
    candidates = [os.environ.get("DASHBOARD_CHROMIUM"), "/usr/bin/chromium"]
    candidates += [shutil.which("chromium"), shutil.which("chromium-browser")]
    return next((c for c in candidates if c and os.path.exists(c)), None)


@nox.session
def tests(session: nox.Session) -> None:
    """Self-tests of our own machinery, the fast tier (a few minutes on two cores); run on any CPU machine.
    The end-to-end proofs (marker ``proof``) are ``nox -s proofs``; CI runs both."""
    _self_tests(session, "not proof")


@nox.session
def proofs(session: nox.Session) -> None:
    """The self-tests that prove a check end to end in real processes (marker ``proof``): every broken
    backend's chapter run, the front door under signals and deadlines, faults, real compiles and builds."""
    _self_tests(session, "proof")


def _self_tests(session: nox.Session, marker: str) -> None:
    python = _suite_python(session)  # with executorch (19 MB): the adapter's self-tests run upstream's pass
    if not _chromium():
        session.warn("no Chromium: the dashboard's browser test will skip (`nox -s browser` installs one)")
    workers = str(SIZING.self_test_workers())  # one more than cores: some self-tests wait on purpose
    # Hundreds of processes (inner pytest sessions, front-door runs) would each compile the project again
    # where $PYTHONDONTWRITEBYTECODE is set (our CI sets it): one prefix for all of them (--no-venv too).
    _share_bytecode(session, VENV_PYCACHE)
    cmd = [python, "-m", "pytest", "tests", "-n", workers, "-m", marker, *session.posargs]
    session.run(*cmd, external=True)


@nox.session
def conformance(session: nox.Session) -> None:
    """The whole conformance matrix against the backend (``-- --backend module:attr`` picks another)."""
    python = _suite_python(session)
    # The table names the broken backends that prove each rule: they are the self-tests', so tests/ writes it.
    coverage = (python, "-m", "tests.rule_coverage", "--json")
    _run_suite(session, "conformance", ["conformance"], python=python, coverage=coverage)


@nox.session(tags=["matrix"])
@nox.parametrize(("chapter", "dtype"), MATRIX_CELLS)
def conformance_cell(session: nox.Session, chapter: str, dtype: str) -> None:
    """One cell of the matrix (chapter × dtype), for CI fan-out from ``nox -l --json -t matrix``.

    The cells share the suite's venv (``SUITE_VENV``) instead of a torch install each. Each writes
    ``results/cell-<chapter>-<dtype>*.json``, a name no other cell uses, so the files of every runner can be
    gathered into one folder; with one ``$CONFORMANCE_RUN_ID`` for all of them, ``nox -s report`` shows them
    as one run (README "Sharding the matrix over several CI runners")."""
    selection = [CHAPTERS[chapter].relative_to(ROOT).as_posix(), f"--dtype={dtype}"]
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
    session.run(
        python, "-m", "pytest", "tests/upstream_executorch/test_upstream_executorch.py", "-q", external=True
    )
    # The zoo cases need a runtime part, which the adapter lacks: prelowering the zoo would be lost work.
    # Upstream's known defects are declared (strict: a fixed one fails the run until its entry goes).
    known = ROOT / "upstream_executorch" / "known_failures.toml"
    selection = ["conformance/lowering/test_lowering.py", "conformance/differential/test_differential.py"]
    selection.append("--backend=upstream_executorch:BACKEND")
    selection.append(f"--known-failures={known}")
    _run_suite(session, "conformance-executorch", selection, prelower=False, python=python)


@nox.session
def conformance_torch_aoti(session: nox.Session) -> None:
    """PyTorch's own AOTInductor runtime through the adapter ``torch_aoti``: its self-tests, then every
    chapter twice, each mode in a process of its own (a compiled model reads ``AOTI_RUNTIME_CHECK_INPUTS``
    once): ``torch_aoti:BACKEND`` (as deployed: no input checks) into conformance-torch-aoti.json and
    ``torch_aoti:CHECKED`` (``AOTI_RUNTIME_CHECK_INPUTS=1``) into conformance-torch-aoti-checked.json, each
    with its mode's known failures (strict: a case PyTorch starts to reject fails as stale), and those of the
    running torch release alone where a file names it (``known_failures_torch2.11.toml``). The cases that
    can kill the process are declared there with ``crash = true`` and run like the rest: a worker that dies
    is replaced and its case recorded xfailed (the front door always runs pytest-xdist workers).
    """
    python = _suite_python(session)
    session.run(
        python, "-m", "pytest", "tests/torch_aoti/test_torch_aoti.py", "-q", "-m", "not proof", external=True
    )
    # Behaviours of one torch release (the GPU image's 2.11) live in files of their own, added for it only.
    version = session.run(
        python,
        "-c",
        "import torch; print('.'.join(torch.__version__.split('.')[:2]))",
        external=True,
        silent=True,
    )
    release = str(version or "").strip().splitlines()[-1] if version else ""
    failed: list[str] = []
    for name, attr, stem in (
        ("conformance-torch-aoti", "BACKEND", "known_failures"),
        ("conformance-torch-aoti-checked", "CHECKED", "known_failures_checked"),
    ):
        selection = ["conformance", f"--backend=torch_aoti:{attr}"]
        for known in (
            ROOT / "torch_aoti" / f"{stem}.toml",
            ROOT / "torch_aoti" / f"{stem}_torch{release}.toml",
        ):
            if known.is_file():
                selection.append(f"--known-failures={known}")
        try:  # the second mode runs even when the first failed: the two results are read side by side
            # No pre-lowering: the cases compile what they need into the adapter's package cache
            # (torch_aoti/package_cache.py), which the second mode then finds warm.
            _run_suite(session, name, selection, prelower=False, python=python)
        except Exception:
            failed.append(name)
    if failed:
        session.error(f"failed: {', '.join(failed)} (results/<name>.json)")
