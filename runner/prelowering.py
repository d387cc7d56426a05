"""The background pre-lowering of a GPU run, and the toolchain preflight started beside it.

Compiling is CPU work the cases would otherwise do one program at a time. On a GPU runner the zoo is
compiled for both targets in the background, overlapping the parallel phase, by the compile processes the
run's sizing gives it beside the case workers (``sizing.size_gpu_run``): a case
that needs a program still being compiled waits on the backend's per-program cache lock (the reference's
artifact cache), and cases that need none run meanwhile. It runs at a lower CPU priority: it takes the
cycles the workers leave (a worker waiting for a program sleeps), not the workers'.
It is stopped once the parallel phase is over: every program a case needed is built by then, and its GPU
work must end before any phase that measures the GPU alone.

Before the run is sized, ``earlier_prelowering`` asks ``conformance.suite.prelower --is-done`` whether an
earlier run already lowered every program this one would (its stamp): then there is nothing to compile, the
pre-lowering is not started and the cases get the whole budget.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.run_control import EXIT_DEADLINE
from runner import sizing
from runner.console import Console

#: Seconds the pre-lowering gets to end after SIGTERM before its process group is killed.
STOP_WAIT_S = 30
#: The niceness it runs at: below the workers, so a warm cache's re-exports take idle cycles only.
NICENESS = 10
#: conformance.suite.prelower's last line when it finished (``prelower: 54 lowered …`` or ``prelower: skipped
#: …``).
_SUMMARY = re.compile(r"prelower: (\d+ lowered|skipped)")
#: A row of its table: one compile done, a program or one of its methods (``  mlp  cuda  float32 …``,
#: ``  asr.encoder  cpu  float16 …``).
_COMPILE_ROW = re.compile(r"^  \S+\s+(cuda|cpu)\s")
#: The targets it compiles the zoo for: the suite runs it on both.
TARGETS = ("--device=cuda", "--device=cpu")
#: ``--is-done``'s line where an earlier run lowered everything (``prelower: done, 54 programs … (stamp P)``).
_DONE = re.compile(r"^prelower: done, .*\(stamp (?P<stamp>.+)\)$", re.MULTILINE)
#: Seconds ``--is-done`` may take (an interpreter importing torch and hashing the zoo's and the backend's
#: sources, a few seconds) before the run stops waiting and pre-lowers as it would without the answer.
DONE_QUERY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Prelowering:
    """The background pre-lowering while it runs."""

    process: subprocess.Popen[bytes]
    #: Where its table goes (``results/<run>.prelower.log``).
    log: Path
    #: ``time.perf_counter()`` when it was started, for the phase table.
    started: float


def _prelower(python: str, backend: Sequence[str], *options: str) -> list[str]:
    """``conformance.suite.prelower`` for both targets and the run's backend: the one command line the
    pre-lowering and the question whether it is needed share, so they name the same programs."""
    return [python, "-m", "conformance.suite.prelower", *TARGETS, *options, *backend]


def prelower_command(python: str, jobs: int, backend: Sequence[str]) -> list[str]:
    """Compile the zoo for both targets with ``jobs`` processes, for the run's backend."""
    return _prelower(python, backend, f"--jobs={jobs}")


def is_done_command(python: str, backend: Sequence[str]) -> list[str]:
    """Ask, compiling nothing, whether an earlier run left the stamp of what ``prelower_command`` would
    compile (exit 0) or not (exit 1)."""
    return _prelower(python, backend, "--is-done")


def earlier_prelowering(
    console: Console, python: str, backend: Sequence[str], timeout: float | None
) -> str | None:
    """The stamp an earlier run left when it lowered every program the pre-lowering would compile
    (``--is-done`` exited 0), or None: not done (exit 1), or no answer (any other exit, no interpreter, or
    none within ``timeout`` seconds, capped at ``DONE_QUERY_TIMEOUT_S``): the pre-lowering then runs as it
    would without asking, and finds its stamp itself."""
    cmd = is_done_command(python, backend)
    limit = DONE_QUERY_TIMEOUT_S if timeout is None else min(timeout, DONE_QUERY_TIMEOUT_S)
    try:
        answer = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", timeout=limit
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        console.log(f"{shlex.join(cmd)}: no answer ({type(exc).__name__}); pre-lowering as usual")
        return None
    lines = answer.stdout.strip().splitlines()
    console.log(f"{shlex.join(cmd)}: exit {answer.returncode}, {lines[-1] if lines else 'no output'}")
    if answer.returncode != 0:
        return None
    found = _DONE.search(answer.stdout)
    return found["stamp"] if found else "unnamed"


def _in_a_group_of_its_own() -> None:
    """In the pre-lowering's process, before it runs: a process group of its own (stopped as one, pool
    workers included; in the front door's session, so that the preflight can join it, ``check_toolchain``),
    at a lower priority."""
    os.setpgid(0, 0)
    os.nice(NICENESS)


def start_prelowering(
    console: Console, python: str, jobs: int, log: Path, backend: Sequence[str]
) -> Prelowering | None:
    """Start the pre-lowering in the background with ``jobs`` compile processes (the run's sizing), its
    table to ``log``; None where the sizing left none (``plan.prelowers`` said no, or too few cores)."""
    started = time.perf_counter()
    if jobs <= 0:
        return None
    cmd = prelower_command(python, jobs, backend)
    console.log(f"{shlex.join(cmd)} > {log}  (in the background, nice {NICENESS})")
    with open(log, "wb") as out:
        process = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **sizing.COMPILE_ENV, **sizing.COMPILE_PROCESS_ENV},
            preexec_fn=_in_a_group_of_its_own,
        )
    return Prelowering(process, log, started)


def stop_prelowering(console: Console, job: Prelowering) -> str:
    """End the pre-lowering (its whole process group) if it still runs, say how far it got, and return
    that for the phase table (``54 lowered …``, or how many programs were done when it was stopped)."""
    process = job.process
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    summary = summarize(job.log.read_text(errors="replace").splitlines())
    console.log(f"{summary} (table: {job.log})")
    return summary.removeprefix("prelower: ")


def summarize(lines: Sequence[str]) -> str:
    """The pre-lowering's own summary line, or for one stopped early the compiles its table lists."""
    summary = next((line for line in lines if _SUMMARY.match(line)), None)
    if summary is None:
        done = sum(1 for line in lines if _COMPILE_ROW.match(line))
        summary = f"prelower: stopped after the parallel phase, {done} compiles done"
    return summary


def preflight_command(python: str, backend: Sequence[str]) -> list[str]:
    """The backend's toolchain preflight alone (conformance/suite/toolchain.py, through
    conformance.suite.prelower)."""
    return [python, "-m", "conformance.suite.prelower", "--device=cuda", "--preflight-only", *backend]


def check_toolchain(
    python: str,
    backend: Sequence[str],
    env: Mapping[str, str],
    timeout: float | None,
    group: int | None = None,
) -> int:
    """Run the preflight once, before any case (later phases then skip their own); its exit code, or
    ``EXIT_DEADLINE`` when it outlived ``timeout`` (what is left of the run's deadline). ``group``: the
    pre-lowering's process group, which the preflight joins: it is background work like the compiles (no
    case waits for it), counted with them in the phase table's runnable tasks."""

    command, full_env = preflight_command(python, backend), {**os.environ, **env}
    # Python 3.11's process_group (safe beside the front door's threads, unlike a preexec_fn).
    joined = {"process_group": group} if group is not None and sys.version_info >= (3, 11) else {}
    try:
        try:
            return subprocess.run(command, env=full_env, timeout=timeout, **joined).returncode
        except (OSError, subprocess.SubprocessError) as exc:  # the group has ended: run it in ours
            if not joined or isinstance(exc, subprocess.TimeoutExpired):
                raise
            return subprocess.run(command, env=full_env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return EXIT_DEADLINE


def toolchain_detail(code: int) -> str:
    """The preflight's row in the phase table."""
    return "toolchain OK" if code == 0 else f"toolchain check failed (exit {code})"
