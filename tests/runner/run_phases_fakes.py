"""Fakes for the self-tests of a conformance run's phases (tests/runner/test_run_phases.py): a console that
records what the run asks for and plays pytest phases (those started early too), and the background
pre-lowering and preflight without their processes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.start_gate import GATE_ENV
from runner import run
from runner.prelowering import Prelowering


@contextlib.contextmanager
def front_door_signals_restored() -> Iterator[None]:
    """The front door installs its own signal handlers and deadline timer (harness/run_control.py): as
    they were, and no timer, once the block ends."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)}
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


class Failed(Exception):
    """The fake console's ``error``: the session failed."""


class FakeConsole:
    """Records what the run asks for; ``codes``: a pytest shard's exit code, ``"SIGTERM"`` to stop the
    front door while that shard runs (as a CI system cancelling the job), or ``"WAIT"`` to run until the
    front door is stopped (10 s at most), as the real console does: the ``KeyboardInterrupt`` propagates."""

    def __init__(self, gpus: int, codes: Mapping[str, int | str] | None = None, check_args: int = 0) -> None:
        self.gpus = gpus
        self.codes = dict(codes or {})
        self.check_args = check_args
        self.calls: list[tuple[str, object]] = []
        #: Set once a pytest phase runs.
        self.running = threading.Event()

    def log(self, message: str) -> None:
        self.calls.append(("log", message))

    def warn(self, message: str) -> None:
        self.calls.append(("warn", message))

    def error(self, message: str) -> None:
        self.calls.append(("error", message))
        raise Failed(message)

    def run(self, cmd: Sequence[str], *, success_codes: Sequence[int] = (0,)) -> None:
        self.calls.append(("run", list(cmd)))
        if tuple(success_codes) != (0,):
            self.calls.append(("success_codes", list(success_codes)))

    def output(self, cmd: Sequence[str]) -> str:
        return f"{self.gpus}\n"

    def exit_code(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        interrupt_s: float | None = None,
        terminate_s: float | None = None,
    ) -> int:
        if "runner.check_args" in cmd:
            self.calls.append(("check_args", list(cmd)))
            return self.check_args
        self.calls.append(("pytest", (list(cmd), dict(env or {}))))
        results = next(a for a in cmd if a.startswith("--results-json=")).partition("=")[2]
        code = self.codes.get(Path(results).stem, 0)
        Path(results).write_text("{}")  # pytest writes its files, a stopped one too
        self.running.set()
        if code == "WAIT":
            time.sleep(10)
            raise AssertionError("the phase was not stopped")
        if code == "SIGTERM":
            signal.raise_signal(signal.SIGTERM)  # the front door's handler raises KeyboardInterrupt
        return int(code)

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str], output: Path) -> FakeStarted:
        """A phase started early: it "runs" (is recorded as a pytest run) once its gate is open."""
        self.calls.append(("started early", Path(output).name))
        output.write_text("collected, waiting at the gate\n")
        results = Path(next(a for a in cmd if a.startswith("--results-json=")).partition("=")[2])
        code = self.codes.get(results.stem, 0)
        gate = env[GATE_ENV].partition(":")[2]
        return FakeStarted(self, (list(cmd), dict(env)), results, output, gate, code)

    def echo(self, text: str) -> None:
        self.calls.append(("echo", text))

    def of(self, kind: str) -> list[object]:
        return [value for k, value in self.calls if k == kind]

    def pytest_args(self) -> list[list[str]]:
        return [cmd for cmd, _ in self.of("pytest")]  # type: ignore[misc]


class FakeStarted:
    """A pytest phase started early: it ends with its code once its gate is open (writing its files and
    a line of output then), or, with code ``"RUNNING"``, runs from then until a signal stops it; it
    records what stopped it."""

    def __init__(
        self,
        console: FakeConsole,
        started: tuple[list[str], dict[str, str]],
        results: Path,
        output: Path,
        gate: str,
        code: int | str,
    ) -> None:
        self.console, self.started, self.results, self.output = console, started, results, output
        self.gate, self.code = gate, code
        self.pid = 0
        self.returncode: int | None = None
        self.ran = False
        self.poll()  # a phase started with its gate open runs from its start

    def poll(self) -> int | None:
        if not self.ran and Path(self.gate).exists():
            self.ran = True
            self.console.calls.append(("pytest", self.started))
            self.results.write_text("{}")
            with self.output.open("a") as out:
                out.write(f"{self.results.stem} ran\n")
            if self.code != "RUNNING":
                self.returncode = int(self.code)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its code once it ended; with no ``timeout``, waits for that (10 s at most, as the console's
        ``"WAIT"``)."""
        deadline = time.monotonic() + (10.0 if timeout is None else timeout)
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("pytest", timeout or 0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        self.console.calls.append(("signal", (self.results.stem, sig)))
        if self.returncode is None:
            self.results.write_text("{}")  # a stopped pytest writes its files
            self.returncode = -sig

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


#: The stamp a fake earlier run left (``FakeBackground(is_done=0)``).
STAMP = "/cache/prelower/0123abcd.done"


class FakeBackground:
    """The background pre-lowering and preflight, without their processes; ``is_done``: what
    ``conformance.suite.prelower --is-done`` answers (0: an earlier run lowered everything, 1: not; as the
    real ``earlier_prelowering`` reads it, tested on its own below)."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        preflight: int = 0,
        is_done: int = 1,
        after: threading.Event | None = None,
    ) -> None:
        self.events: list[str] = []
        self.preflight = preflight
        self.is_done = is_done
        #: The preflight ends once this is set (a phase runs): it runs beside the cases.
        self.after = after
        monkeypatch.setattr(run, "earlier_prelowering", self.ask)
        monkeypatch.setattr(run, "start_prelowering", self.start)
        monkeypatch.setattr(run, "stop_prelowering", self.stop)
        monkeypatch.setattr(run, "check_toolchain", self.check)

    def ask(self, console: object, python: str, backend: Sequence[str], timeout: float | None) -> str | None:
        self.events.append(f"is-done {' '.join(backend)}".strip())
        return STAMP if self.is_done == 0 else None

    def start(
        self, console: object, python: str, jobs: int, log: Path, backend: Sequence[str]
    ) -> Prelowering | None:
        if jobs == 0:  # as the real one: the sizing left it no process
            return None
        self.events.append(f"start {' '.join(backend)}".strip())
        # a process that is not this one's group: the busy sampler names its group "pre-lowering"
        return Prelowering(SimpleNamespace(pid=-1), log, time.perf_counter())  # type: ignore[arg-type]

    def stop(self, console: object, job: Prelowering) -> str:
        self.events.append("stop")
        return "54 lowered"

    def check(
        self,
        python: str,
        backend: Sequence[str],
        env: Mapping[str, str],
        timeout: float | None,
        group: int | None = None,
    ) -> int:
        assert "CONFORMANCE_RUN_ID" in env  # the preflight records under the run's id
        # background work beside the cases: a compile process's threads (one for torch's ops, one compile)
        assert (env["OMP_NUM_THREADS"], env["TORCHINDUCTOR_COMPILE_THREADS"]) == ("1", "1")
        # in the pre-lowering's group where one runs (its tasks counted with it), else in ours
        self.events.append("preflight" if group is None else f"preflight in group {group}")
        if self.after is not None:
            assert self.after.wait(5)
            time.sleep(0.05)  # a measurable while after the cases began
        return self.preflight
