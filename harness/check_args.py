"""Check a run's arguments before the run touches anything: ``python -m harness.check_args [pytest args]``.

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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        # -n 0: collect here, not in xdist workers; usage errors still go to stderr as pytest writes them.
        code = pytest.main([*args, "--collect-only", "-q", "-n", "0"])
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
        + (f"; {len(errors)} collection error(s)" if errors else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
