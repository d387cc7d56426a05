"""Where the cases run: each case's time limit, the device check after it, and a process that cannot go on
ended so that a fresh one runs the next case (pytest-xdist replaces it), with the case that caused it named.

**Time limits.** Built on the standard library's ``faulthandler``, not on pytest-timeout: a hang in C code
(a CUDA synchronisation, a lock in a C extension that holds the GIL) cannot run a Python signal handler or
a Python thread, and pytest-timeout's methods are one or the other (SIGALRM to a Python handler, or a
Python timer thread). ``faulthandler.register(SIGALRM, chain=True)`` installs a C signal handler that
writes every thread's Python stack without the GIL and then lets SIGALRM's default action end the
process; an interval timer (``setitimer``, one system call per case, unlike ``dump_traceback_later``
which starts a thread per case) raises the signal. faulthandler is in every Python, so the offline GPU
image needs no extra wheel. In front of it runs a Python timer (one long-lived thread per process): when
the GIL is free (the usual case: torch releases it while it waits on the device) it writes the stacks
with the native frames of every thread (``gdb``, where it is installed) and names the phase the case was
in; the C handler fires ``HARD_MARGIN_S`` later only when that could not run (the Python timer, once it
runs, pushes it back by the time it gives gdb). The process's SIGALRM is the watchdog's: a case that sets
its own alarm would end its worker.

**Device faults.** After each case's teardown, before its teardown report goes out, the device probe
(``harness/device_probe.py``) checks the devices this process used; an xdist worker probes also right
after the case's call and writes the verdict to disk before teardown, since freeing device memory under a
sticky error may abort the process. A sticky error is the case's
``device-fault``; an xdist worker then ends at once, so pytest-xdist blames exactly this case (it is still
the worker's current one) and starts a fresh worker, with a fresh CUDA context, for the rest. A CUDA
out-of-memory stays the case's own failure: pytest's hold on its traceback (``sys.last_*``) is dropped and
the memory returned; a worker that still holds more than ``OOM_HELD_LIMIT`` bytes afterwards (a backend
that keeps it in a global) is replaced too.

An xdist worker that ends on purpose leaves a ``Verdict`` in the run's watchdog directory; the process that
gathers the reports (``harness/run_end.py``) reads it when pytest-xdist reports the crash. Without
pytest-xdist the same verdicts stop the run (no fresh process can take over), and the rest is ``not-run``.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import pytest

from harness.case_limits import MARKER, CaseLimits, marker_seconds
from harness.device_probe import (
    Probe,
    first_line,
    is_out_of_memory,
    memory_held_after_oom,
    release_after_failure,
)
from harness.outcomes import Outcome
from harness.results import chapter_of

#: Report attribute through which a plugin decides a case's recorded outcome (harness/pytest_plugin.py
#: reads it): a dict with ``outcome`` and optionally ``message``, ``evidence``, ``rule``, ``level``...
CASE_RESULT_ATTR = "case_result"
#: workeroutput key: a worker's watchdog overhead, to the controller.
OVERHEAD_KEY = "case_watchdog_overhead"
#: workerinput key: the run's watchdog directory, from the controller to its workers.
DIR_KEY = "case_watchdog_dir"
#: Exit status of a worker that ends on purpose (timeout, device fault, memory still held).
EXIT_REPLACE_WORKER = 86
#: How long gdb may take to write the native frames (it loads the symbols of every library first).
NATIVE_BUDGET_S = 30.0
#: After the Python timer: when the C watchdog ends a process the Python timer could not reach.
HARD_MARGIN_S = 5.0
#: Memory an out-of-memory case may leave allocated before its worker is replaced.
OOM_HELD_LIMIT = 1 << 30
EVIDENCE_LIMIT = 60_000


@dataclass(frozen=True)
class Verdict:
    """How a case ended where its reports could not say it. ``outcome`` None keeps the outcome its own
    reports give (a worker replaced after an out-of-memory) and only adds ``message``."""

    case: str
    outcome: str | None
    message: str
    evidence: str | None = None
    phase: str = ""  # setup, call or teardown: where the case was

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        data = json.loads(text)
        return cls(**{k: data.get(k) for k in ("case", "outcome", "message", "evidence", "phase")})


@dataclass
class Running:
    """The case a process is running, as the watchdog knows it."""

    case: str
    limit_s: float | None
    source: str
    phase: str = "setup"


class WatchdogFiles:
    """The files one case-running process keeps in the run's watchdog directory (``<process>.case.json``:
    its current case; ``.stacks``: what a watchdog dumped; ``.verdict.json``: why it ended on purpose)."""

    def __init__(self, directory: Path, process: str) -> None:
        self.directory, self.process = directory, process
        self.case_path = directory / f"{process}.case.json"
        self.stacks_path = directory / f"{process}.stacks"
        self.verdict_path = directory / f"{process}.verdict.json"
        self._case_fd: int | None = None
        self._case_size = 0

    def reset(self) -> None:
        """A process starting under a name another used before must not inherit its files."""
        self.close()
        for path in (self.case_path, self.stacks_path, self.verdict_path):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._case_fd is not None:
            os.close(self._case_fd)
            self._case_fd = None

    def start_case(self, running: Running) -> None:
        """Overwrite the current case in place, padded with spaces: opening a file with truncation cost
        5 ms per case on an ext4 mounted with ``discard`` (a CI VM's disk); this costs microseconds."""
        record = {"case": running.case, "limit_s": running.limit_s, "source": running.source}
        record["pid"] = os.getpid()
        data = json.dumps(record, ensure_ascii=False).encode("utf-8")
        if self._case_fd is None:
            self._case_fd = os.open(self.case_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._case_size = max(self._case_size, len(data), 4096)
        os.pwrite(self._case_fd, data.ljust(self._case_size), 0)

    def write_verdict(self, verdict: Verdict) -> None:
        tmp = self.verdict_path.with_suffix(".tmp")
        tmp.write_text(verdict.to_json(), encoding="utf-8")
        os.replace(tmp, self.verdict_path)

    def read_verdict(self, case: str) -> Verdict | None:
        """Why this process ended while running ``case``: its verdict, or a timeout when the C watchdog
        dumped the stacks (the Python timer could not run), or None (it crashed on its own)."""
        with contextlib.suppress(OSError, ValueError, TypeError):
            verdict = Verdict.from_json(self.verdict_path.read_text(encoding="utf-8"))
            if verdict.case == case:
                return verdict
        try:
            running = json.loads(self.case_path.read_text(encoding="utf-8"))
            stacks = self.stacks_path.read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            return None
        if running.get("case") != case or not stacks.strip():
            return None
        limit = running.get("limit_s")
        message = (
            f"timeout: the case outlived its time limit of {limit:g} s ({running.get('source')}) where no "
            "Python code could run (C code holding the GIL); the last-resort watchdog ended its process "
            "and a fresh one ran the rest. Every thread's Python stack is in the evidence."
        )
        return Verdict(case, Outcome.TIMEOUT, message, truncate(stacks))

    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            return int(json.loads(self.case_path.read_text(encoding="utf-8"))["pid"])
        return None


def set_case_result(report: pytest.TestReport, verdict: Verdict) -> None:
    """Make ``verdict`` the case's recorded outcome (terminal, JUnit and result file read it)."""
    # The plain string: the report may cross pytest-xdist's serialiser, which takes no str subclass.
    outcome = None if verdict.outcome is None else Outcome(verdict.outcome).value
    result: dict[str, Any] = {"outcome": outcome, "message": verdict.message}
    if verdict.evidence:
        result["evidence"] = verdict.evidence
    setattr(report, CASE_RESULT_ATTR, result)


class FaultRepr:
    """A fault's report text: its message as the one-line summary (JUnit's ``message``, the recorder's
    text), the message and the evidence in full where the whole text is shown."""

    def __init__(self, message: str, evidence: str | None) -> None:
        self.reprcrash = SimpleNamespace(message=message)
        self.text = f"{message}\n\n{evidence}" if evidence else message

    def __str__(self) -> str:
        return self.text

    def toterminal(self, tw: Any) -> None:
        for line in self.text.splitlines():
            tw.line(line)


def truncate(text: str, limit: int = EVIDENCE_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters)"


class _Timer:
    """One long-lived thread that looks at the current case's deadline at least every ``TICK_S``: ``arm`` and
    ``disarm`` only set it (no lock, no wake-up), so a case pays no thread switch for being watched. A
    limit is therefore kept to within ``TICK_S``, which the C handler's margin covers."""

    TICK_S = 0.5

    def __init__(self, fire: Callable[[Running], None]) -> None:
        self._fire = fire
        self._armed: tuple[float, Running] | None = None  # replaced whole: one atomic store
        self._closed = threading.Event()
        threading.Thread(target=self._run, name="case-watchdog", daemon=True).start()

    def arm(self, seconds: float, token: Running) -> None:
        self._armed = (time.monotonic() + seconds, token)

    def disarm(self) -> None:
        self._armed = None

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        while True:
            armed = self._armed
            left = self.TICK_S if armed is None else min(self.TICK_S, armed[0] - time.monotonic())
            if self._closed.wait(max(left, 0.0)):
                return
            armed = self._armed
            if armed is not None and armed[0] <= time.monotonic():
                self._armed = None
                self._fire(armed[1])


def native_stacks(pid: int, budget_s: float = NATIVE_BUDGET_S) -> str:
    """Every thread's native frames of process ``pid`` from gdb, where gdb is installed; else a note."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "native frames: not available (no gdb on PATH)"
    _allow_ptrace_by_children()
    # gdb stops every thread of the process it attaches to, this one included: it runs under `timeout`,
    # and the shell wakes the process again (SIGCONT) whatever became of gdb.
    script = (
        'timeout -s KILL "$1" "$2" -p "$3" -batch -nx -iex "set auto-load off" -ex "set pagination off" '
        '-ex "thread apply all bt 40" 2>&1; kill -CONT "$3" 2>/dev/null; true'
    )
    try:
        out = subprocess.run(
            ["sh", "-c", script, "sh", f"{budget_s:g}", gdb, str(pid)],
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            check=False,
        ).stdout
    except OSError as exc:
        return f"native frames: gdb could not run: {exc}"
    frames = [line for line in out.splitlines() if line.startswith(("Thread ", "#"))]
    if not frames:
        last = first_line("\n".join(reversed(out.strip().splitlines()))) or "no output"
        return f"native frames: gdb gave none within {budget_s:g} s ({last})"
    return "native frames (gdb):\n" + "\n".join(frames)


def _allow_ptrace_by_children() -> None:
    """Under Yama's ptrace scope 1 a process may only be traced by its ancestors: let gdb, our child, in."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, ANY


class CaseWatchdog:
    """The plugin, in a process that runs cases: an xdist worker, or the single pytest process.

    ``on_verdict`` (the single process only) receives a timeout or device-fault verdict; it stops the run.
    """

    def __init__(
        self,
        config: pytest.Config,
        files: WatchdogFiles,
        limits: CaseLimits,
        probe: Probe | None,
        native: bool,
        on_verdict: Callable[[Verdict, bool], None] | None = None,
        extra_margin_s: float = 0.0,
    ) -> None:
        self.config = config
        self.files = files
        self.limits = limits
        self.probe = probe
        self.native = native and shutil.which("gdb") is not None
        self.on_verdict = on_verdict
        self.worker = on_verdict is None
        files.directory.mkdir(parents=True, exist_ok=True)
        files.reset()
        # Kept open for the whole process: the C handler writes to its descriptor without the GIL.
        self._stacks: TextIO = open(files.stacks_path, "w+", encoding="utf-8")  # noqa: SIM115
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # chained to after the dump: the process ends
        faulthandler.register(signal.SIGALRM, file=self._stacks, all_threads=True, chain=True)
        self._margin = HARD_MARGIN_S + extra_margin_s
        self._timer = _Timer(self._expired)
        # The timer ends a worker only while its case has not sent its teardown report: past that point
        # pytest-xdist would blame the next case. The main thread takes this lock to close that window.
        self._lock = threading.Lock()
        self.current: Running | None = None
        self._oom = False
        self._fault: str | None = None  # a device fault found right after the case's call phase
        self.cases = 0
        self.overhead_s = 0.0  # this plugin's own time per case, summed: what the green path pays

    # -- each case --------------------------------------------------------------------------------------

    def limit_of(self, item: pytest.Item) -> tuple[float | None, str]:
        own = item.get_closest_marker(MARKER)
        seconds = marker_seconds(own.args, own.kwargs, item.nodeid) if own is not None else None
        markers = (mark.name for mark in item.iter_markers())
        return self.limits.limit(chapter_of(item.nodeid), markers, seconds, item.nodeid)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        start = time.perf_counter()
        limit, source = self.limit_of(item)
        running = Running(item.nodeid, limit, source)
        with self._lock:
            self.current, self._oom, self._fault = running, False, None
        if limit is not None:
            self.files.start_case(running)
            self._timer.arm(limit, running)
            signal.setitimer(signal.ITIMER_REAL, limit + self._margin)
        self.overhead_s += time.perf_counter() - start
        try:
            return (yield)
        finally:
            start = time.perf_counter()
            if limit is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._timer.disarm()
            with self._lock:
                self.current = None
            self.cases += 1
            self.overhead_s += time.perf_counter() - start

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        if self.current is not None:
            self.current.phase = "call"

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if self.current is not None:
            self.current.phase = "teardown"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report: pytest.TestReport = yield
        if call.when == "call" and call.excinfo is not None and is_out_of_memory(call.excinfo.value):
            self._oom = True
        if call.when == "call" and self.worker and self.probe is not None:
            self._probe_after_call(item)
        if call.when == "teardown":
            self._after_case(item, report)
            with self._lock:  # from here its report goes out: the timer must not end this worker
                self.current = None
        return report

    def _probe_after_call(self, item: pytest.Item) -> None:
        """Probe as soon as the case's own code is done and leave the verdict on disk before teardown runs:
        freeing device memory under a sticky error can abort the process (seen on an H100 and an H200),
        and the controller then still finds what happened. Counted in the watchdog's overhead."""
        start = time.perf_counter()
        try:
            assert self.probe is not None
            error = self.probe()
            if error:
                self._fault = error
                self.files.write_verdict(self._fault_verdict(item, error))
        finally:
            self.overhead_s += time.perf_counter() - start

    def _after_case(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """After the teardown ran, before its report goes out: is the device still usable?"""
        start = time.perf_counter()
        try:
            self._check_after_case(item, report)
        finally:
            self.overhead_s += time.perf_counter() - start

    def _check_after_case(self, item: pytest.Item, report: pytest.TestReport) -> None:
        release_after_failure()
        held = memory_held_after_oom() if self._oom else 0
        error = self._fault or (self.probe() if self.probe is not None else None)
        if error:
            self._device_fault(item, report, error)
        elif self._oom and held > OOM_HELD_LIMIT and self.worker:
            note = (
                f"after its CUDA out-of-memory the case's process still held {held / (1 << 30):.1f} GiB "
                "(kept by the backend); it was replaced so that no later case inherits that memory"
            )
            self._end_worker(Verdict(item.nodeid, None, note, None, "teardown"))

    def _fault_verdict(self, item: pytest.Item, error: str) -> Verdict:
        then = (
            "its process was ended so that a fresh CUDA context runs the next case"
            if self.worker
            else "without pytest-xdist no fresh process can take over, so the run stopped here"
        )
        message = f"device fault after this case: {first_line(error)}; {then}"
        return Verdict(item.nodeid, Outcome.DEVICE_FAULT, message, truncate(error), "teardown")

    def _device_fault(self, item: pytest.Item, report: pytest.TestReport, error: str) -> None:
        verdict = self._fault_verdict(item, error)
        if self.worker:
            self._end_worker(verdict)
        assert self.on_verdict is not None
        # In one process the teardown report itself carries the verdict (harness/run_end.py shapes it).
        report.outcome = "failed"
        report.longrepr = FaultRepr(verdict.message, verdict.evidence)  # type: ignore[assignment]
        fault = ("conformance:outcome", Outcome.DEVICE_FAULT.value)
        report.user_properties = [*report.user_properties, fault]
        set_case_result(report, verdict)
        self.on_verdict(verdict, False)

    def _end_worker(self, verdict: Verdict) -> None:
        """pytest-xdist still counts the case as this worker's current one: ending now blames exactly it."""
        self.files.write_verdict(verdict)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_REPLACE_WORKER)

    # -- a case outlived its limit (the timer thread) ---------------------------------------------------

    def _expired(self, running: Running) -> None:
        with self._lock:
            if self.current is not running:
                return  # it ended meanwhile
            if self.worker:  # holding the lock: the case cannot send its teardown report meanwhile
                self._end_worker(self._timeout_verdict(running))
        verdict = self._timeout_verdict(running)  # one process: the stop below interrupts the case
        with self._lock:
            if self.current is not running:
                return
        assert self.on_verdict is not None
        self.on_verdict(verdict, True)

    def _timeout_verdict(self, running: Running) -> Verdict:
        """Every thread's Python stack (and native frames) now, and the message of the timeout."""
        if self.native:  # the C handler waits for gdb too, now that this thread runs
            signal.setitimer(signal.ITIMER_REAL, NATIVE_BUDGET_S + self._margin)
        python = ""
        with contextlib.suppress(Exception):
            self._stacks.seek(0, os.SEEK_END)
            start = self._stacks.tell()
            faulthandler.dump_traceback(file=self._stacks, all_threads=True)
            self._stacks.flush()
            self._stacks.seek(start)
            python = self._stacks.read()
        native = native_stacks(os.getpid()) if self.native else "native frames: not collected (no gdb)"
        evidence = truncate(f"{python}\n{native}".strip())
        then = (
            "its process was stopped and replaced, and the run went on"
            if self.worker
            else "without pytest-xdist no fresh process can take over, so the run stopped here"
        )
        message = (
            f"timeout: the case outlived its time limit of {running.limit_s:g} s ({running.source}) in its "
            f"{running.phase}; {then}. Every thread's stack is in the evidence."
        )
        return Verdict(running.case, Outcome.TIMEOUT, message, evidence, running.phase)

    def overhead(self) -> dict[str, float]:
        """What this process's watchdog cost the cases it ran (its timers, files and device probe)."""
        return {"cases": self.cases, "seconds": round(self.overhead_s, 6)}

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # In a worker this runs inside pytest-xdist's wrapper, before it sends the worker's output.
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller sums every worker's
            workeroutput[OVERHEAD_KEY] = self.overhead()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.unregister(signal.SIGALRM)
        self._timer.close()
        self._stacks.close()
        self.files.close()
