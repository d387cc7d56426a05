"""Run one chapter against one backend in a fresh child process, as a user would, without paying for a
fresh interpreter each time.

The self-tests run a chapter some sixty times (every broken backend, the reference on each selection).
A new ``python -m pytest`` imports torch and transformers again every time: 4-5 s of a 6-second run on
a 2-core CI machine, most of the suite's wall time. Here the children come from a ``forkserver`` that
imported those once: each child is still a separate process with its own pytest session, backend,
options and crash isolation (a segfault kills the child, not the self-test), but starts warm.

Nothing is initialised before the fork beyond imports: no CUDA context, no OpenMP pool (torch starts both
lazily), so a child is as clean as a new interpreter for what the chapters do.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Heavy modules every chapter run imports; the fork server imports them once. Inductor and dynamo (the
#: lowering and the compiler check import them, ~2.8 s) and Hypothesis (the generated cases, ~2 s) cost more
#: than a short chapter's cases do.
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch._inductor",
    "torch.export",
    "hypothesis",
    "hypothesis.stateful",
    "transformers",
]

_context = None


def _ctx() -> multiprocessing.context.BaseContext:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([m for m in PRELOAD if _importable(m)])
        _context = context
    return _context


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _run(args: Sequence[str], cwd: str, env: Mapping[str, str], log: str) -> None:
    """In the child: the environment and directory a ``python -m pytest`` would have, then pytest itself;
    its exit code becomes the process's."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import pytest

    code = pytest.main(list(args))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(int(code))


class ChapterRun:
    """A started chapter run; ``wait`` gives its exit code (or a negative signal number)."""

    def __init__(self, args: Sequence[str], cwd: Path, env: Mapping[str, str], log: Path) -> None:
        self._process = _ctx().Process(target=_run, args=(list(args), str(cwd), dict(env), str(log)))
        self._process.start()

    def wait(self, timeout: float) -> int:
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
            raise TimeoutError(f"the chapter run did not finish in {timeout:.0f} s")
        return int(self._process.exitcode or 0)
