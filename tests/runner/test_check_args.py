"""The front door's argument check suggests the option a misspelt one meant (issue 48 item 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runner.check_args import PhaseCounts, suggestions

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
        [sys.executable, "-m", "runner.check_args", "conformance", "--backnd", "reference_impl:BACKEND"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "--backnd: did you mean --backend?" in done.stderr


def test_the_selected_count_says_how_a_gpu_runs_phases_split_it() -> None:
    """Issue 48 item 7: "1135 cases selected" then the shared phase's "[1112 items]" is explained where the
    count is printed."""
    counts = PhaseCounts()
    counts.total, counts.alone, counts.several = 1135, 17, 6
    assert counts.words(1) == (
        ": 1112 share the GPU, 17 then have it alone, 6 need 2 GPUs (this machine has 1: not run)"
    )
    assert counts.words(2) == (
        ": 1112 share the GPUs, 17 then have one alone, 6 need 2 GPUs (run beside the shared ones)"
    )
    assert counts.words(0) == ""  # one phase runs every case (those needing a GPU skip, with the reason)
    counts.alone = counts.several = 0
    assert counts.words(1) == ""
