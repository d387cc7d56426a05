"""Check a run's arguments before the run touches anything: ``python -m runner.check_args [pytest args]``.

The front door calls this first, with the selection and options the run will get. It is pytest's own
collection (``--collect-only``, no case runs, no preflight), so it judges exactly what the run would:
the backend loads (``--backend`` / ``$CONFORMANCE_BACKEND``), every option is known and valid (``--dtype``,
``--known-failures``, ``-k`` syntax, ...), and the selection selects at least one case. Exit 0 prints
``N cases selected``; a mistake exits non-zero with pytest's own message, so the previous run's result
files are still where they were. A chapter that fails to import is not stopped here: the run records it.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import re
import subprocess
import sys
from collections.abc import Sequence

import pytest

from runner.plan import EXCLUSIVE_MARKS

#: ``1102 tests collected``, ``12/1102 tests selected (1090 deselected)`` ... as pytest words it.
_COUNT = re.compile(r"(?:(\d+)/)?(\d+) tests? (?:collected|selected)")
#: Exit codes that stop a run before it starts: a usage error, nothing selected.
STOPPING = (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.NO_TESTS_COLLECTED)


def selected_count(output: str) -> int | None:
    """How many cases pytest's collection summary says were selected."""
    for line in reversed(output.splitlines()):
        match = _COUNT.search(line)
        if match:
            return int(match.group(1) or match.group(2))
    return None


#: A long option as ``--help`` lists it.
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def suggestions(args: Sequence[str], help_text: str) -> list[str]:
    """``--opt: did you mean --option?`` for each long option of ``args`` that ``help_text`` does not list
    and one it lists is close to."""
    known = set(_OPTION.findall(help_text))
    found = []
    for arg in args:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
            if close:
                found.append(f"{name}: did you mean {close[0]}?")
    return found


def _help_text(args: Sequence[str]) -> str:
    """pytest's ``--help`` for the same paths (their conftest adds the suite's options); "" if it fails."""
    paths = [a for a in args if not a.startswith("-")][:1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--help", *paths], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


class PhaseCounts:
    """How a GPU run's phases split the selected cases (``runner.plan``): those that need the
    GPU alone (``EXCLUSIVE_MARKS``) run after the shared phase, those that need several GPUs beside it; so
    the shared phase's ``[N items]`` is fewer than the cases selected."""

    def __init__(self) -> None:
        self.total = self.alone = self.several = 0

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        for item in session.items:
            if item.get_closest_marker("multi_gpu"):
                self.several += 1
            elif any(item.get_closest_marker(mark) for mark in EXCLUSIVE_MARKS):
                self.alone += 1

    def words(self, gpus: int) -> str:
        """``: 1112 share the GPU, 17 then have it alone, 6 need 2 GPUs (this machine has 1: not run)``;
        nothing without a GPU (one phase runs them all) or where every case shares it."""
        if gpus < 1 or not (self.alone or self.several):
            return ""
        parts = [f"{self.total - self.alone - self.several} share the GPU{'s' if gpus > 1 else ''}"]
        if self.alone:
            parts.append(f"{self.alone} then have {'one' if gpus > 1 else 'it'} alone")
        if self.several:
            beside = "run beside the shared ones" if gpus > 1 else "this machine has 1: not run"
            parts.append(f"{self.several} need 2 GPUs ({beside})")
        return ": " + ", ".join(parts)


def _gpus() -> int:
    """CUDA devices, where the collection imported torch (the suite's conftest does); else 0."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.device_count()) if torch is not None else 0
    except Exception:  # a broken driver: the run itself will say so
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    captured = io.StringIO()
    counts = PhaseCounts()
    with contextlib.redirect_stdout(captured):
        # -n 0: collect here, not in xdist workers; usage errors still go to stderr as pytest writes them.
        code = pytest.main([*args, "--collect-only", "-q", "-n", "0"], plugins=[counts])
    output = captured.getvalue()
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(f"error: the selection selects no case: {' '.join(args)}", file=sys.stderr)
        print(
            "  check -k / -m / --dtype / the chapter path (`python -m pytest --collect-only ...` lists them)"
        )
        return int(code)
    if code == pytest.ExitCode.USAGE_ERROR:
        print(output.strip(), file=sys.stderr)
        for line in suggestions(args, _help_text(args)):
            print(f"  {line}", file=sys.stderr)
        return int(code)
    count = selected_count(output)
    errors = [line for line in output.splitlines() if line.startswith("ERROR ")]
    print(
        f"{count if count is not None else '?'} cases selected"
        + (counts.words(_gpus()) if counts.total == count else "")
        + (f"; {len(errors)} collection error(s)" if errors else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
