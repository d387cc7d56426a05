"""The phases after the shared one, started while it runs and held at their gate until their turn; and
the multi-GPU phase, started with the shared one and run beside it (``held=False``).

A pytest phase costs 5-10 s before its first case on the GPU image (the interpreter, torch's import,
xdist's workers, the collection): for the GPU-alone and multi-GPU phases that was a tenth of a warm run,
spent after the shared phase with the cores idle. Started beside the shared phase, each waits after its
collection (``harness/start_gate.py``) until the front door opens its gate: after the shared phase and the
pre-lowering ended, so nothing it measures overlaps them. Its output goes to ``results/<shard>.console.log``
and is shown as it comes once the gate is open. A phase that will not run (the run was stopped) is ended
at its gate and leaves no result file, as a phase never started.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from harness.start_gate import GATE_ENV, gate_value, open_gate
from runner.console import Console, Started
from runner.plan import PytestPhase

#: Seconds between looks at a released phase's output and exit.
ECHO_S = 0.2
#: Seconds a phase ended at its gate gets to exit after SIGTERM before it is killed.
CANCEL_WAIT_S = 10.0


@dataclass(frozen=True)
class EarlyPhase:
    """A pytest phase started before its turn, waiting at its gate."""

    phase: PytestPhase
    process: Started
    #: Where its console output goes (``results/<shard>.console.log``).
    output: Path
    #: The file whose existence lets it run (in a folder of its own, removed once it ended).
    gate: Path
    #: Its result files: removed when it never ran.
    files: tuple[Path, ...]


def start_early(
    console: Console,
    phase: PytestPhase,
    cmd: list[str],
    env: dict[str, str],
    results: Path,
    *,
    held: bool = True,
) -> EarlyPhase:
    """Start ``cmd`` (the phase's pytest command) now, held at a new gate; ``env``: its environment.
    ``held=False`` opens the gate at once: a phase whose cases may share the GPUs with the shared phase's
    (they measure nothing) runs beside it; ``release`` later shows its output and waits for its exit."""
    gate = Path(tempfile.mkdtemp(prefix="conformance-gate-")) / "open"
    if not held:
        open_gate(gate)
    output = results / f"{phase.shard}.console.log"
    process = console.start(cmd, env={**env, GATE_ENV: gate_value(gate)}, output=output)
    suffixes = (".json", ".junit.xml", ".json.journal.jsonl")
    files = tuple(results / f"{phase.shard}{suffix}" for suffix in suffixes)
    return EarlyPhase(phase, process, output, gate, files)


def stop_keeping(early: EarlyPhase, wait_s: float) -> None:
    """Stop a phase that ran, as a stopped run stops its pytest (SIGTERM, then SIGKILL after ``wait_s``):
    what its cases recorded stays."""
    _shut_down(early.process, [(signal.SIGTERM, wait_s)])
    shutil.rmtree(early.gate.parent, ignore_errors=True)


def release(console: Console, early: EarlyPhase, *, interrupt_s: float, terminate_s: float) -> int:
    """Open its gate, show its output as it comes, and wait for its exit code. A ``KeyboardInterrupt``
    (the front door was stopped) stops it as nox stops the pytest it runs (``interrupt_s`` to end on the
    signal the process group got, then SIGTERM and ``terminate_s``, then SIGKILL) and propagates."""
    open_gate(early.gate)
    try:
        with open(early.output, "rb") as out:
            try:
                while (code := early.process.poll()) is None:
                    _echo_new(console, out)
                    time.sleep(ECHO_S)
            except KeyboardInterrupt:
                _shut_down(early.process, [(None, interrupt_s), (signal.SIGTERM, terminate_s)])
                _echo_new(console, out)
                raise
            _echo_new(console, out)
    finally:
        shutil.rmtree(early.gate.parent, ignore_errors=True)
    return code


def cancel(early: EarlyPhase) -> None:
    """End a phase that will not run, at its gate (SIGTERM, then SIGKILL), and remove what it wrote but
    its console output: it ran nothing."""
    stop_keeping(early, CANCEL_WAIT_S)
    for path in early.files:
        path.unlink(missing_ok=True)


def _echo_new(console: Console, out: BinaryIO) -> None:
    text = out.read()
    if text:
        console.echo(text.decode(errors="replace"))


def _shut_down(process: Started, steps: list[tuple[int | None, float]]) -> None:
    """Each step: send its signal (None: none, the process group may have had one), wait its seconds for
    the process to end; then SIGKILL."""
    for sig, wait_s in steps:
        if process.poll() is not None:
            return
        if sig is not None:
            process.send_signal(sig)
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
    process.kill()
    process.wait()
