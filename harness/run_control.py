"""How a run ends: its exit codes, the whole-run deadline, and SIGTERM / SIGINT from a CI system.

One ``RunControl`` lives in the process that runs or schedules the cases (the single pytest process, or
the pytest-xdist controller). A deadline, a SIGTERM or a SIGINT all end the run the same way: the main
thread gets ``Stop`` (a ``KeyboardInterrupt``, so pytest and pytest-xdist wind down as after Ctrl-C, and
code under test that catches ``Exception`` cannot swallow it), the cases that did not finish are recorded
``not-run`` with the reason, the result file and JUnit are written, and the exit code says what happened
(``EXIT_CODES``). A second signal while the artifacts are being written is ignored, so a CI system that
repeats SIGTERM does not cut the files short.

A main thread stuck in C code (a CUDA synchronisation, a lock in a C extension) cannot run a Python
signal handler. The signal still reaches a wake-up descriptor (``signal.set_wakeup_fd``), which a thread
of ours watches: when the main thread has not answered within ``grace_s``, that thread calls
``on_unanswered`` (the recorder writes the artifacts from there and ends the process).

Standard library only: the nox front door imports it (through ``runner``) with whatever
interpreter runs nox, for the exit codes and the deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 2
EXIT_PREFLIGHT = 3
EXIT_USAGE = 4
EXIT_NO_TESTS = 5
EXIT_STOPPED_BY_FAULT = 6
EXIT_DEADLINE = 124
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

#: Exit code -> what it means; the README's table is this one.
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "every case passed (or ended in an outcome that does not fail a run)",
    EXIT_FAILED: "a case failed, errored, crashed, timed out or faulted the device; the run went on",
    EXIT_INTERRUPTED: "interrupted otherwise (pytest's own: e.g. a KeyboardInterrupt raised by a case)",
    EXIT_PREFLIGHT: (
        "the backend's toolchain preflight failed: no case ran, or (checked beside the first cases of a "
        "GPU run) the cases were stopped"
    ),
    EXIT_USAGE: "usage error (a bad option or backend)",
    EXIT_NO_TESTS: (
        "no case selected, or none exercised the backend under test (every case skipped, a coverage gap or "
        "a suite self-check)"
    ),
    EXIT_STOPPED_BY_FAULT: "a hang or device fault in a run without pytest-xdist stopped it (no fresh "
    "process could take over); the rest is not-run",
    EXIT_DEADLINE: "the run deadline (--run-deadline) was reached; the rest is not-run",
    EXIT_SIGINT: "stopped by SIGINT; the rest is not-run",
    EXIT_SIGTERM: "stopped by SIGTERM; the rest is not-run",
}
#: The codes of a run that ended early with its artifacts written (the front door stops there too).
STOP_CODES = frozenset({EXIT_STOPPED_BY_FAULT, EXIT_DEADLINE, EXIT_SIGINT, EXIT_SIGTERM})

DEADLINE_OPTION = "--run-deadline"
#: The front door also reads the deadline from the environment (seconds, like the option).
DEADLINE_ENV = settings.RUN_DEADLINE.name

_SIGNALS = {signal.SIGTERM: ("SIGTERM", EXIT_SIGTERM), signal.SIGINT: ("SIGINT", EXIT_SIGINT)}


def process_age() -> float:
    """Seconds since this process started (Linux ``/proc``; 0 where it cannot be read)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command's name
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def deadline_reason(seconds: float) -> str:
    return f"the run deadline ({DEADLINE_OPTION} {seconds:g} s) was reached"


class Stop(KeyboardInterrupt):
    """Raised in the main thread to end the run: ``reason`` (a sentence) and the exit ``code``."""

    def __init__(self, reason: str, code: int) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


def parse_seconds(text: str, what: str = DEADLINE_OPTION) -> float:
    """A non-negative number of seconds, or a ValueError naming ``what``."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{what}: {text!r} must be a finite number of seconds ≥ 0")
    return value


def interrupt_main_thread() -> None:
    """SIGINT to this process's main thread, from any thread: its handler then stops the run. A real
    signal, not ``_thread.interrupt_main``: it also wakes a main thread blocked in a system call (waiting
    for a phase's process, say)."""
    with contextlib.suppress(ValueError, OSError):
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


class RunControl:
    """Signals and the deadline for one process; ``install`` in the main thread, ``uninstall`` at the end."""

    def __init__(
        self,
        deadline_s: float | None = None,
        grace_s: float = 10.0,
        on_unanswered: Callable[[str, int], None] | None = None,
    ) -> None:
        # The deadline counts from the process's start, not from here: pytest imports torch and the
        # suite before it configures plugins, seconds a CI job's clock already counted.
        self.started = time.monotonic() - process_age()
        self.deadline_s = deadline_s
        self.grace_s = grace_s
        self.on_unanswered = on_unanswered
        self.stop: tuple[str, int] | None = None  # (reason, exit code) of the first stop
        self._finishing = False
        self._critical = 0
        self._pending = False
        self._received = 0  # stop signals seen on the wake-up descriptor
        self._handled = 0  # stop signals the main thread's handler has run for
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_wakeup = -1

    # -- set up, tear down ------------------------------------------------------------------------------

    def install(self) -> None:
        """Signals and the deadline from now on; a stop is held (recorded, not raised) until ``release``:
        pytest writes its files only for a stop raised once its session is under way."""
        self._critical += 1
        for signum in _SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        read, write = socket.socketpair()
        write.setblocking(False)
        self._wakeup = (read, write)
        self._previous_wakeup = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch_signals, name="run-control-signals", daemon=True).start()
        if self.deadline_s is not None and self.deadline_s > 0:  # one already passed: run_end checks it
            threading.Thread(target=self._watch_deadline, name="run-control-deadline", daemon=True).start()

    def release(self) -> None:
        """The session is under way: a stop held since ``install`` is raised now, later ones at once."""
        self._release_one()

    def uninstall(self) -> None:
        self._closed.set()
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()
        if self._wakeup is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous_wakeup)
            for sock in self._wakeup:
                sock.close()
            self._wakeup = None

    # -- asking for a stop ------------------------------------------------------------------------------

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None without one; ≤ 0 once passed)."""
        if self.deadline_s is None:
            return None
        return self.deadline_s - (time.monotonic() - self.started)

    def deadline_reason(self) -> str:
        return deadline_reason(self.deadline_s or 0.0)

    def request_stop(self, reason: str, code: int) -> None:
        """From any thread: end the run with ``reason`` (the first request wins) and ``code``."""
        with self._lock:
            if self.stop is None:
                self.stop = (reason, code)
        if self._finishing:
            return
        interrupt_main_thread()

    @property
    def finishing(self) -> bool:
        return self._finishing

    def begin_finishing(self) -> None:
        """The artifacts are being written: from now on a signal only records itself."""
        self._finishing = True

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A section a stop must not cut in two (a journal line, a file write): it is raised after it."""
        self._critical += 1
        try:
            yield
        finally:
            self._release_one()

    def _release_one(self) -> None:
        self._critical -= 1
        if self._critical == 0 and self._pending and not self._finishing:
            self._pending = False
            self._raise()

    # -- inside -----------------------------------------------------------------------------------------

    def _handle(self, signum: int, frame: object) -> None:
        name, code = _SIGNALS[signal.Signals(signum)]
        with self._lock:
            if self.stop is None:
                self.stop = (f"the run was stopped by {name}", code)
            self._handled += 1
        if self._finishing:
            return
        if self._critical:
            self._pending = True
            return
        self._raise()

    def _raise(self) -> None:
        assert self.stop is not None
        reason, code = self.stop
        raise Stop(reason, code)

    def _watch_deadline(self) -> None:
        remaining = self.remaining()
        if remaining is not None and not self._closed.wait(max(0.0, remaining)):
            self.request_stop(self.deadline_reason(), EXIT_DEADLINE)

    def _watch_signals(self) -> None:
        """Notices a signal even while the main thread is stuck in C; gives it ``grace_s`` to answer."""
        assert self._wakeup is not None
        read = self._wakeup[0]
        while not self._closed.is_set():
            try:
                data = read.recv(64)
            except OSError:
                return
            if not data or self._closed.is_set():
                return
            with self._lock:
                self._received += sum(1 for signum in data if signum in (signal.SIGTERM, signal.SIGINT))
            if not self._answered_in_time() and self.on_unanswered is not None and not self._finishing:
                self.on_unanswered(*(self.stop or ("the run was stopped by a signal", EXIT_SIGTERM)))

    def _answered_in_time(self) -> bool:
        """Whether the main thread's handler ran for every signal seen: it does as soon as the main thread
        is back in the interpreter."""
        end = time.monotonic() + self.grace_s
        while time.monotonic() < end:
            with self._lock:
                if self._handled >= self._received or self._finishing or self._closed.is_set():
                    return True
            time.sleep(0.05)
        return self._finishing or self._closed.is_set()


# ------------------------------------------------------------------------------------ the nox front door

#: Of the deadline, what the front door keeps for the steps after the last phase (result files from
#: journals, the summary page, the phase table): the phases get the rest. A tenth of a short deadline.
REPORT_RESERVE_S = 30.0
#: When pytest has not ended this long after the deadline, the front door stops it itself.
BACKSTOP_S = 60.0
#: How long nox waits, after the front door was told to stop, before it sends SIGTERM to the running
#: pytest (which got the signal itself when the whole process group did), and then how long pytest gets
#: to write its files before it is killed.
INTERRUPT_WAIT_S = 2.0
TERMINATE_WAIT_S = 60.0


def split_deadline(args: list[str], env: dict[str, str] | os._Environ[str]) -> tuple[float | None, list[str]]:
    """The run deadline from ``args`` (``--run-deadline S`` / ``--run-deadline=S``, removed from them) or
    else ``$CONFORMANCE_RUN_DEADLINE``; a ValueError names a bad value."""
    rest: list[str] = []
    value: str | None = None
    it = iter(args)
    for arg in it:
        if arg == DEADLINE_OPTION:
            value = next(it, "")
        elif arg.startswith(DEADLINE_OPTION + "="):
            value = arg.partition("=")[2]
        else:
            rest.append(arg)
    if value is None and env.get(DEADLINE_ENV, "").strip():
        value = env[DEADLINE_ENV].strip()
    return (None if value is None else parse_seconds(value)), rest


class FrontDoor:
    """The nox process's side of a run of several pytest phases: one deadline over all of them (each phase
    gets what is left, less ``REPORT_RESERVE_S``), SIGTERM / SIGINT turned into a stop that the running
    phase hears (nox forwards it) and that skips the phases after it, and the exit code the run ends with.
    """

    def __init__(self, args: list[str], env: dict[str, str] | os._Environ[str]) -> None:
        self.deadline_s, self.args = split_deadline(list(args), env)
        self.started = time.monotonic()
        self.stop: tuple[str, int] | None = None
        self.signalled = False
        self._finishing = False
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
            self._previous[signum] = signal.signal(signum, self._handle)
        if self.deadline_s is not None:
            signal.setitimer(signal.ITIMER_REAL, self.deadline_s + BACKSTOP_S)

    def uninstall(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGALRM:
            reason, code = deadline_reason(self.deadline_s or 0.0), EXIT_DEADLINE
        else:
            name, code = _SIGNALS[signal.Signals(signum)]
            reason = f"the run was stopped by {name}"
            self.signalled = True
        self.stop = self.stop or (reason, code)
        if not self._finishing:
            raise KeyboardInterrupt(reason)  # nox then stops the running pytest (see INTERRUPT_WAIT_S)

    def request_stop(self, reason: str, code: int) -> None:
        """From another thread (the preflight's beside the cases): stop the run as a signal would, with
        ``reason`` and ``code`` unless a stop came first; the running phase is stopped, no later one
        starts."""
        self.stop = self.stop or (reason, code)
        if self._finishing:
            return
        interrupt_main_thread()

    def finishing(self) -> None:
        """The files and the page are being written: a signal from now on only records itself."""
        self._finishing = True

    def time_left(self) -> float | None:
        """Seconds the phases may still use (None without a deadline)."""
        if self.deadline_s is None:
            return None
        reserve = min(REPORT_RESERVE_S, self.deadline_s / 10)
        return max(0.0, self.deadline_s - (time.monotonic() - self.started) - reserve)

    def phase_args(self) -> list[str]:
        """The posargs for the next pytest phase: the user's, and the time it has left."""
        left = self.time_left()
        return [*self.args, *([] if left is None else [f"{DEADLINE_OPTION}={left:.0f}"])]

    def phase_ended(self, code: int | None) -> None:
        """A phase's exit code: a stop (deadline, signal, a fault without xdist) becomes the run's."""
        if code in STOP_CODES and self.stop is None:
            self.stop = (EXIT_CODES[code], code)

    @property
    def go_on(self) -> bool:
        """Whether to start the next phase: not after a signal (a deadline still lets each later phase
        record its cases not-run, which takes seconds)."""
        return not self.signalled
