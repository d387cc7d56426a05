"""Where a run keeps what makes the next one fast, how big it is, and how to clear it.

``python -m harness.caches`` lists them with their sizes; ``--clear`` removes the compile caches (the next
run is a cold one again: 10-11 minutes for a CPU run on two cores instead of about a minute and a half).
``nox -s clean-cache`` runs ``--clear``. ``--prune-unused-runs N`` keeps a cache that lives between CI runs
bounded: every run notes its start in the artifact directory (``RUN_LOG``); what a run reads there is
marked used (its mtime: the backends' cache entries when they hand them out, the pre-lowering's and the
preflight's stamps, the reference's vector-ISA verdicts); what none of the last ``N`` runs used is removed
(lock files never: a deleted lock file breaks the locking of a process that holds it). Python's bytecode
and inductor's own cache files are not marked: pruned, they are written again when next needed. Nothing
here imports torch, so it runs with any Python.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import settings
from harness.formatting import show_bytes

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Cache:
    name: str
    path: Path
    what: str
    cleared_by_default: bool  # --clear removes it; the others need --all


def artifact_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$CONFORMANCE_CACHE_DIR`` as ``settings.CACHE_DIR`` resolves it for every reader."""
    return settings.CACHE_DIR.get(env)


#: One line per run that used the artifact directory: ``<epoch seconds> <run id>``, appended at its start.
RUN_LOG = "runs.log"


def note_run(run_id: str, now: float | None = None, env: Mapping[str, str] = os.environ) -> None:
    """Note a run's start in the artifact directory's ``RUN_LOG`` (what ``prune_unused`` counts runs by)."""
    root = artifact_dir(env)
    with contextlib.suppress(OSError):  # a read-only cache: nothing to prune, nothing to note
        root.mkdir(parents=True, exist_ok=True)
        with (root / RUN_LOG).open("a", encoding="utf-8") as log:
            log.write(f"{time.time() if now is None else now:.0f} {run_id}\n")


@dataclass(frozen=True)
class Pruned:
    files: int
    bytes: int
    #: The directory's size after pruning.
    left: int
    #: Why nothing was pruned, where nothing was.
    why_not: str = ""


def prune_unused(root: Path, runs: int) -> Pruned:
    """Remove every file under ``root`` that none of its last ``runs`` runs used (mtime before the start of
    the ``runs``-th last run in ``RUN_LOG``), lock files and the log itself kept; then empty folders."""
    try:
        starts = sorted(float(line.split()[0]) for line in (root / RUN_LOG).read_text().splitlines() if line)
    except (OSError, ValueError, IndexError):
        starts = []
    if runs < 1 or len(starts) < runs:
        return Pruned(
            0, 0, size_of(root), f"{len(starts)} run(s) noted, fewer than {runs}: nothing is stale yet"
        )
    cutoff = starts[-runs]
    files = removed = 0
    for path in sorted(root.rglob("*"), reverse=True):  # files before the folders that hold them
        if path.is_symlink() or path.is_file():
            if path.name == RUN_LOG or path.suffix == ".lock" or "locks" in path.relative_to(root).parts:
                continue
            with contextlib.suppress(OSError):
                stat = path.lstat()
                if stat.st_mtime < cutoff:
                    path.unlink()
                    files, removed = files + 1, removed + stat.st_size
        elif path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()  # only where empty
    return Pruned(files, removed, size_of(root))


def bytecode_env(env: Mapping[str, str] = os.environ, folder: Path | None = None) -> dict[str, str]:
    """What a run gives its processes where ``$PYTHONDONTWRITEBYTECODE`` is set (as on our GPU image) and
    no ``$PYTHONPYCACHEPREFIX`` says where bytecode goes: Python's bytecode and pytest's rewritten modules
    written once, under the artifact cache (``<it>/pycache``; the sources and site-packages stay as they
    are), and read by every later process. Without it each of a run's ~15 pytest processes compiled the
    suite and rewrote its test modules and every pytest plugin's package (hypothesis entire): 9.0 s to
    collect the suite here, 4.9 s with it. Elsewhere nothing: Python writes bytecode beside the sources.
    ``folder``: another place than the artifact cache (the self-tests': their runs' caches are temporary).
    The prefix's first process compiles what it imports, torch too (Python then reads no bytecode beside
    the sources): seconds, once per prefix."""
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return {}
    prefix = folder or artifact_dir(env) / "pycache"
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(prefix)}


def caches() -> list[Cache]:
    """Every cache a run fills, where it is on this machine (the environment variables honoured)."""
    user = getpass.getuser()
    artifacts = str(artifact_dir())
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(
        Path(tempfile.gettempdir()) / f"torchinductor_{user}"
    )
    triton = os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    what = {
        "artifacts": "compiled programs by content, preflight and pre-lowering stamps, the CPU ISA verdict, "
        "the run's Python bytecode where $PYTHONDONTWRITEBYTECODE is set ($CONFORMANCE_CACHE_DIR)",
        "inductor": "torch inductor's own compile cache ($TORCHINDUCTOR_CACHE_DIR)",
        "triton": "Triton kernels, GPU runs only ($TRITON_CACHE_DIR)",
        "venvs": "the nox venvs: torch and the project, reused between runs",
        "runs": "earlier runs kept for `nox -s compare` ($CONFORMANCE_KEEP_RUNS)",
    }
    return [
        Cache("artifacts", Path(artifacts), what["artifacts"], True),
        Cache("inductor", Path(inductor), what["inductor"], True),
        Cache("triton", Path(triton), what["triton"], True),
        Cache("venvs", ROOT / ".nox", what["venvs"], False),
        Cache("runs", ROOT / "results" / "runs", what["runs"], False),
    ]


def size_of(path: Path) -> int:
    """Bytes under ``path`` (0 when it does not exist); links are not followed."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.caches", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clear", action="store_true", help="remove the compile caches (artifacts, inductor, triton)"
    )
    parser.add_argument("--all", action="store_true", help="with --clear: the venvs and the kept runs too")
    parser.add_argument(
        "--prune-unused-runs",
        type=int,
        metavar="N",
        help="remove from the artifact directory what none of the last N runs used (a CI cache kept bounded)",
    )
    args = parser.parse_args(argv)
    if args.prune_unused_runs is not None:
        root = artifact_dir()
        done = prune_unused(root, args.prune_unused_runs)
        what = done.why_not or f"pruned {done.files} file(s), {show_bytes(done.bytes)} unused in the last "
        what += "" if done.why_not else f"{args.prune_unused_runs} runs"
        print(f"{root}: {what}; {show_bytes(done.left)} kept")
        return 0
    total = 0
    for cache in caches():
        size = size_of(cache.path)
        total += size
        clear = args.clear and (cache.cleared_by_default or args.all)
        state = "cleared" if clear and cache.path.exists() else ("absent" if not cache.path.exists() else "")
        print(f"{cache.name:<10} {show_bytes(size):>10}  {cache.path}  {state}".rstrip())
        print(f"{'':<10} {'':>10}  {cache.what}")
        if clear:
            shutil.rmtree(cache.path, ignore_errors=True)
    print(f"{'total':<10} {show_bytes(total):>10}")
    if not args.clear:
        print("clear the compile caches: nox -s clean-cache (or python -m harness.caches --clear [--all])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
