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
import io
import re
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
