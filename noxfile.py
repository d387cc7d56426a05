"""The front door: ``nox -s conformance`` (the suite), ``nox -s tests`` (self-tests), ``nox -s lint``.

On a machine with CUDA torch already installed and no network (a GPU CI image), add ``--no-venv``:
the sessions then run with the interpreter that runs nox and install nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"

ROOT = Path(__file__).parent
RESULTS = ROOT / "results"
# A CPU build for fresh venvs: an unpinned torch would pull the newest CUDA build (gigabytes).
# Override with e.g. CONFORMANCE_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu".
TORCH_SPEC = os.environ.get("CONFORMANCE_TORCH", "torch==2.13.0")


def _matrix_cells() -> list[tuple[str, str]]:
    """(chapter, dtype cell) pairs that select cases, read from the chapters' source (conformance/cells.py,
    loaded by path: no torch, no change to sys.path). New chapters join the matrix without touching this."""
    spec = importlib.util.spec_from_file_location("_conformance_cells", ROOT / "conformance" / "cells.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.matrix_cells(ROOT / "conformance")


MATRIX_CELLS = _matrix_cells()


def _uses_venv(session: nox.Session) -> bool:
    return session.venv_backend != "none"


def _python(session: nox.Session) -> str:
    # Without a venv, "python" on PATH may be another interpreter than the one with CUDA torch.
    return "python" if _uses_venv(session) else sys.executable


def _install(session: nox.Session, extras: str = "") -> None:
    """Install the project (torch pinned first, so its unpinned dependency is already met)."""
    if not _uses_venv(session):
        session.log("--no-venv: using this interpreter's packages as they are (torch, pytest, xdist, ...)")
        return
    session.install(*shlex.split(TORCH_SPEC))
    session.install("-e", f".[{extras}]" if extras else ".")


def _install_executorch(session: nox.Session) -> None:
    """Upstream ExecuTorch and exactly what its AOT path imports (pyproject's ``executorch`` extra), with
    ``--no-deps``: its metadata would also pull coremltools, pandas, scikit-learn, torchao and more."""
    if not _uses_venv(session):
        return
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: nox itself depends on tomli there
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    session.install("--no-deps", *extras["executorch"])


def _cuda_device_count(session: nox.Session) -> int:
    out = session.run(
        _python(session), "-c", "import torch; print(torch.cuda.device_count())", silent=True, log=False
    )
    return int(str(out).strip().splitlines()[-1])


def _visible_gpu_ids(count: int) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(count)]
    return ids[:count]


def _pytest(session: nox.Session, name: str, args: list[str], env: dict[str, str]) -> CommandFailed | None:
    """One pytest run writing results/<name>.json and .junit.xml; returns its failure instead of raising."""
    try:
        session.run(
            _python(session), "-m", "pytest", *args,
            "-p", "harness.pytest_plugin",
            f"--results-json={RESULTS / f'{name}.json'}",
            f"--junitxml={RESULTS / f'{name}.junit.xml'}",
            *session.posargs,
            env=env,
        )  # fmt: skip
    except CommandFailed as exc:
        return exc
    return None


def _prelower(session: nox.Session, gpus: int) -> None:
    """On a GPU runner, compile the zoo in parallel first (the GPU workers would compile one at a time)."""
    jobs = min(8, (os.cpu_count() or 1) // 2)
    if gpus == 0 or jobs < 2 or os.environ.get("CONFORMANCE_PRELOWER") == "0":
        return
    args: list[str] = []
    for i, arg in enumerate(session.posargs):  # the same backend as the suite: --backend X or --backend=X
        if arg.startswith("--backend="):
            args = ["--backend", arg.partition("=")[2]]
        elif arg == "--backend" and i + 1 < len(session.posargs):
            args = ["--backend", session.posargs[i + 1]]
    session.run(_python(session), "-m", "conformance.prelower", "--device=cuda", f"--jobs={jobs}", *args)


def _run_suite(session: nox.Session, name: str, selection: list[str], *, prelower: bool = True) -> None:
    """Run the conformance suite, then render the summary page even if cases failed or crashed.

    ``prelower=False`` skips compiling the zoo up front (for a backend whose zoo cases cannot run).

    One pytest-xdist worker per GPU, each pinned to its own GPU (xdist also turns a crashed case into a
    record instead of a lost run). With two or more GPUs, the cases that need several GPUs at once run
    afterwards in one unpinned worker, into a second result file (a shard) that the report merges.
    """
    RESULTS.mkdir(exist_ok=True)
    # A run that stops before writing (a backend that does not load, a bad option) must not leave the last
    # run's files to be rendered and reported as this one's.
    for shard in (name, f"{name}-multi-gpu"):  # exactly this run's files, not another session's
        for suffix in (".json", ".json.journal.jsonl", ".junit.xml", ".html"):
            (RESULTS / f"{shard}{suffix}").unlink(missing_ok=True)
    gpus = _cuda_device_count(session)
    workers = gpus or min(2, os.cpu_count() or 1)
    session.log(f"{gpus} CUDA device(s) visible; {workers} pytest-xdist worker(s)")
    if prelower:
        _prelower(session, gpus)
    shards = [name]
    if gpus >= 2:
        pinned = {"CONFORMANCE_WORKER_GPUS": ",".join(_visible_gpu_ids(gpus))}
        failures = [
            _pytest(session, name, [*selection, "-n", str(workers), "-m", "not multi_gpu"], pinned),
            _pytest(session, f"{name}-multi-gpu", [*selection, "-n", "1", "-m", "multi_gpu"], {}),
        ]
        shards.append(f"{name}-multi-gpu")
    else:
        failures = [_pytest(session, name, [*selection, "-n", str(workers)], {})]
    files = [str(RESULTS / f"{s}.json") for s in shards]
    present = [f for f in files if Path(f).exists() or Path(f"{f}.journal.jsonl").exists()]
    if present:
        html = RESULTS / f"{name}.html"
        session.run(_python(session), "-m", "reports", *present, "-o", str(html))
        session.log(f"results: {', '.join(present)}  page: {html}")
    # pytest exit 5 (nothing selected) is fine for the multi-GPU shard alone, never for the main run.
    real = [f for i, f in enumerate(failures) if f and not (i > 0 and f.return_code == 5)]
    if real:
        session.error(f"conformance run failed: pytest exit code {real[0].return_code}")


def _ensure_chromium(session: nox.Session) -> None:
    """The dashboard's browser test needs a real Chromium; install Debian's where we may (root + apt).

    Elsewhere the test skips and says why; Playwright's own browser download is never used.
    """
    if shutil.which("chromium") or os.environ.get("DASHBOARD_CHROMIUM"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.warn("no Chromium and no root apt-get: the dashboard browser test will be skipped")
        return
    session.log("installing Debian's chromium for the dashboard browser test")
    session.run("apt-get", "update", "-qq", external=True, silent=True)
    apt_install = ("apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium")
    session.run(*apt_install, external=True, silent=True)


@nox.session
def tests(session: nox.Session) -> None:
    """Self-tests of our own machinery; run on any CPU machine."""
    _install(session, extras="test")
    _install_executorch(session)  # 19 MB: the adapter's self-tests run upstream's real pass
    _ensure_chromium(session)
    # Several self-tests compile real artifacts or run the suite in a subprocess: spread them out.
    workers = str(min(4, os.cpu_count() or 1))
    session.run(_python(session), "-m", "pytest", "tests", "-n", workers, *session.posargs)


@nox.session
def conformance(session: nox.Session) -> None:
    """The whole conformance matrix against the backend (``-- --backend module:attr`` picks another)."""
    _install(session)
    _run_suite(session, "conformance", ["conformance"])


@nox.session(tags=["matrix"])
@nox.parametrize(("chapter", "dtype"), MATRIX_CELLS)
def conformance_cell(session: nox.Session, chapter: str, dtype: str) -> None:
    """One cell of the matrix (chapter × dtype), for CI fan-out from ``nox -l --json``."""
    _install(session)
    _run_suite(session, f"cell-{chapter}-{dtype}", [f"conformance/test_{chapter}.py", f"--dtype={dtype}"])


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    if _uses_venv(session):
        session.install("ruff")
    session.run(_python(session), "-m", "ruff", "check", ".")


@nox.session
def report(session: nox.Session) -> None:
    """Render the dashboard from result files (default: results/*.json) into site/.

    ``-- --baseline DIR_OR_JSON --fail-on-regression`` compares with a baseline and exits non-zero on a
    regression or a newly failing case, so CI can gate on it.
    """
    inputs = [a for a in session.posargs if not a.startswith("-")]
    if not inputs and not list(RESULTS.glob("*.json")):
        session.error(f"no result files in {RESULTS}: run `nox -s conformance` (or `nox -s bench`) first")
    _install(session)
    session.run(_python(session), "-m", "reports.dashboard", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (mm_out vs torch.mm, thread scaling, pipelines, lowering costs) into results/bench.json."""
    _install(session)
    RESULTS.mkdir(exist_ok=True)
    session.run(_python(session), "-m", "harness.bench", f"--out={RESULTS / 'bench.json'}", *session.posargs)


@nox.session
def conformance_executorch(session: nox.Session) -> None:
    """Upstream ExecuTorch (PyPI) through the adapter ``upstream_executorch:BACKEND``: its self-tests, then
    the lowering chapter (the view pass everywhere; CUDA lowering on a GPU) into conformance-executorch.json.

    executorch is installed with ``--no-deps``: its metadata pulls coremltools, pandas, scikit-learn, torchao
    and more that the AOT path never imports; pyproject's ``executorch`` extra lists what it does import.
    """
    _install(session)
    _install_executorch(session)
    session.run(_python(session), "-m", "pytest", "tests/test_upstream_executorch.py", "-q")
    # The zoo cases need a runtime part, which the adapter lacks: prelowering the zoo would be lost work.
    # Upstream's known defects are declared (strict: a fixed one fails the run until its entry goes).
    known = ROOT / "upstream_executorch" / "known_failures.toml"
    selection = ["conformance/test_lowering.py", "--backend=upstream_executorch:BACKEND"]
    selection.append(f"--known-failures={known}")
    _run_suite(session, "conformance-executorch", selection, prelower=False)
