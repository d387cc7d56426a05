"""harness/stacks.py: a process asked for its stacks prints every thread's and goes on; without the
variable the signal is not taken over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.stacks import STACKS_SIGNAL_ENV, dump_stacks_on_signal

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, signal, threading, time
from harness.stacks import dump_stacks_on_signal
assert dump_stacks_on_signal() == signal.SIGUSR2
threading.Thread(target=time.sleep, args=(5,), name="waiting", daemon=True).start()
os.kill(os.getpid(), signal.SIGUSR2)
time.sleep(0.2)
print("went on")
"""


def test_a_process_prints_every_threads_stack_on_the_signal_and_goes_on() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), STACKS_SIGNAL_ENV: "usr2"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "went on"
    assert done.stderr.count("hread 0x") >= 2  # the main ("Current thread") and the waiting one
    assert "most recent call first" in done.stderr


def test_nothing_is_registered_without_a_signal_name() -> None:
    assert dump_stacks_on_signal({}) is None
    assert dump_stacks_on_signal({STACKS_SIGNAL_ENV: "NOT_A_SIGNAL"}) is None
