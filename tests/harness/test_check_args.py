"""The front door's argument check suggests the option a misspelt one meant (issue 48 item 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.check_args import suggestions

ROOT = Path(__file__).resolve().parents[2]
HELP = "  --backend=MOD  --backend-path=DIR  --known-failures=FILE  --dtype=D  --generated-examples=S"


def test_a_misspelt_long_option_gets_the_nearest_known_one() -> None:
    args = ["conformance", "--backnd=x", "--known-failure", "f", "-k", "mm", "--dtype=float32", "--zzz"]
    assert suggestions(args, HELP) == [
        "--backnd: did you mean --backend?",
        "--known-failure: did you mean --known-failures?",
    ]


def test_the_check_prints_the_suggestion_from_the_suites_own_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.check_args", "conformance", "--backnd", "reference_impl:BACKEND"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "--backnd: did you mean --backend?" in done.stderr
