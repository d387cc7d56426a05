"""A conformance run in phases (``run_suite``): what ``nox -s conformance``, its matrix cells and
``nox -s conformance_executorch`` do, then render the summary page even if cases failed or crashed.

Before anything: the arguments are checked (``runner.check_args``), and beside that check the machine is
asked how many CUDA devices it has and whether an earlier run already lowered everything
(``MachineQuestions``: each an interpreter importing torch, seconds that no longer come before the run).

On a GPU machine: (1) the zoo pre-lowered for both targets in the background at a lower priority (it takes
the cycles the case workers leave), started first; (0) beside it the backend's toolchain
preflight, also beside the first cases (not before them: on a cold machine it is a long compile that every
case would wait for); a failed preflight stops the run (exit 3, harness/run_control.py's
``FrontDoor.request_stop``); (2) every case that may share its GPU, several pytest-xdist workers per GPU,
each pinned to its GPU with ``CUDA_VISIBLE_DEVICES`` before CUDA starts, beside (1)'s compile processes
(``sizing.size_gpu_run``: cores, GPUs and memory together; the run's header says how and why, and each row
of the phase table how many tasks were runnable meanwhile); (3) once (2) is done and (1) stopped, the cases
that need their GPU alone (``plan.EXCLUSIVE``), in one worker (the GPUs share the host's PCIe); (4) with two
or more GPUs, the cases that need several at once, in one unpinned worker. (3) is started with (2) and
waits, collected, at a gate until its turn (``early.py``, ``harness/start_gate.py``): its start-up overlaps
(2) instead of following it. (4) measures nothing, so it runs beside (2) from the start (its gate open at
once), and (3) waits for it too. (0), (1) and the early starts are skipped for a narrowed selection (``-k``,
``-m``, a file or a case id), (1) also where ``$CONFORMANCE_PRELOWER=0`` (``plan.prelowers``), where an
earlier run already lowered everything (``conformance.suite.prelower --is-done``: the cases then get the whole
budget), or where the sizing leaves it no cores. Without a GPU, every case in one phase of
``sizing.cpu_workers()`` workers. Each pytest run writes a shard
(``results/<name>[-exclusive|-multi-gpu].json``); all share one run id (``$CONFORMANCE_RUN_ID`` when CI sets
it, so cells on several runners share it too), so every report merges them into one run. The per-phase table
is printed at the end and stored in each shard.

``--run-deadline S`` (or ``$CONFORMANCE_RUN_DEADLINE``) bounds the whole run: each phase gets what is left;
after the deadline, or a SIGTERM / SIGINT, the result files, JUnit and the page are still written and the
session exits with the run's code (``harness/run_control.py``'s ``FrontDoor``, README "Exit codes").
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import settings
from harness import caches, forkserver
from harness.results import RUN_ID_ENV
from harness.run_control import (
    EXIT_DEADLINE,
    EXIT_INTERRUPTED,
    EXIT_PREFLIGHT,
    INTERRUPT_WAIT_S,
    TERMINATE_WAIT_S,
    FrontDoor,
)
from harness.run_history import BUSY_TRACE_SUFFIX
from harness.start_gate import held_threads
from runner import plan, sizing
from runner.busy_sampler import BusySampler
from runner.console import Console
from runner.early import EarlyPhase, cancel, release, start_early, stop_keeping
from runner.forking import ForkServer, start_server, stop_server
from runner.plan import EXCLUSIVE, PytestPhase, SuiteRun
from runner.prelowering import (
    check_toolchain,
    earlier_prelowering,
    start_prelowering,
    stop_prelowering,
    toolchain_detail,
)
from runner.record import RunRecord
from runner.report import RuleCoverage, report_run


@dataclass(frozen=True)
class _Context:
    """What every step of one run shares."""

    console: Console
    run: SuiteRun
    door: FrontDoor
    record: RunRecord
    #: The environment every process of the run gets: its run id.
    env: dict[str, str]
    #: The fork server the shared phase's workers come from (``runner/forking.py``); None: none.
    forks: ForkServer | None = None


def run_suite(console: Console, run: SuiteRun) -> None:
    """The whole run: its arguments checked, the previous run kept, the phases, the report and the
    verdict (raises unless every phase passed)."""
    run.results.mkdir(exist_ok=True)
    try:
        door = FrontDoor(list(run.posargs), os.environ)
    except ValueError as exc:
        console.error(str(exc))
    # The machine's questions (CUDA devices, whether an earlier run lowered everything) need an
    # interpreter each (torch's import, seconds): asked beside the arguments' check, they cost no wait.
    # The coverage table collects every case (seconds): written beside the run, it costs no wait.
    coverage = RuleCoverage(run.results).start(console, run.coverage) if run.coverage else None
    # The shared phase's fork server imports for seconds: started first, it is ready when the workers start.
    forks = start_server(console, run.python) if driver_lists_gpus() else None
    machine = MachineQuestions(console, run, door).start()
    try:
        check_arguments(console, run.python, [*run.selection, *door.args])
    except BaseException:
        if coverage is not None:
            coverage.stop()
        if forks is not None:
            stop_server(forks, keep_as=None)
        raise
    # Only now, with a run that can start: the last run's files move to results/runs/<its run id>/.
    keep_previous_run(console, run)
    record = RunRecord()
    door.install()
    try:
        run_phases(console, run, door, record, machine, forks)
    except KeyboardInterrupt:  # a signal or the deadline's backstop outside a pytest phase
        console.warn(f"stopped: {door.stop[0] if door.stop else 'interrupted'}")
    if forks is not None:  # unused (no CUDA device after all, or stopped before the shared phase)
        stop_server(forks, keep_as=None)
    door.finishing()
    if record.prelowering is not None:
        stop_prelowering(console, record.prelowering)
    if coverage is not None:
        coverage.finish(console)
    try:
        report_run(console, run, record, door)
    finally:
        if record.busy is not None:
            record.busy.stop()


def check_arguments(console: Console, python: str, args: Sequence[str]) -> None:
    """Before anything is moved or written: the backend loads, every option is valid and the selection
    selects cases (pytest's own collection, runner/check_args.py); a mistake stops the session here."""
    if console.exit_code([python, "-m", "runner.check_args", *args]) != 0:
        console.error("nothing was run and results/ is as it was: fix the arguments above")


def keep_previous_run(console: Console, run: SuiteRun) -> None:
    """The previous run of these shards moves to results/runs/<run id>/ (bounded: harness/run_history.py)."""
    cmd = [run.python, "-m", "harness.run_history", "archive", f"--results={run.results}"]
    console.run([*cmd, *(f"--name={shard}" for shard in run.shards)])


def cuda_device_count(console: Console, python: str) -> int:
    """The CUDA devices the run's interpreter sees (0 with a CPU build of torch)."""
    out = console.output([python, "-c", "import torch; print(torch.cuda.device_count())"])
    return int(out.strip().splitlines()[-1])


#: Where a loaded NVIDIA driver lists the host's GPUs (a folder per GPU): a reading that costs nothing.
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def driver_lists_gpus(folder: Path = NVIDIA_GPUS) -> bool:
    """Whether the NVIDIA driver lists a GPU here (not that this interpreter's torch can use it)."""
    try:
        return any(folder.iterdir())
    except OSError:
        return False


class MachineQuestions:
    """What a run asks of the machine before it is sized, in threads started before the arguments' check:
    the CUDA devices (``cuda_device_count``) and, on a GPU machine whose run wants the pre-lowering,
    whether an earlier run already lowered everything (``earlier_prelowering``). Both only read, and each
    is an interpreter importing torch (seconds): where the driver lists GPUs, both are asked at once (on
    one H100 the front door waited 3.3 s for them one after the other, after the arguments' check); the
    second answer counts only where the first found a CUDA device. A failed query is raised again where
    the answer is needed, as if asked there."""

    def __init__(self, console: Console, run: SuiteRun, door: FrontDoor) -> None:
        self.console, self.run, self.door = console, run, door
        self.gpus = 0
        self.prelowered: str | None = None
        self._errors: list[BaseException] = []
        self._at_once = plan.prelowers(run) and driver_lists_gpus()
        self._threads = [threading.Thread(target=self._ask_devices, name="machine-questions", daemon=True)]
        if self._at_once:
            self._threads.append(threading.Thread(target=self._ask_stamp, name="prelowered?", daemon=True))

    def start(self) -> MachineQuestions:
        for thread in self._threads:
            thread.start()
        return self

    def _ask_devices(self) -> None:
        try:
            self.gpus = cuda_device_count(self.console, self.run.python)
        except BaseException as exc:  # given to the main thread in answers()
            self._errors.append(exc)
            return
        if self.gpus and not self._at_once and plan.prelowers(self.run):
            self._ask_stamp()

    def _ask_stamp(self) -> None:
        try:
            run, left = self.run, self.door.time_left()
            self.prelowered = earlier_prelowering(self.console, run.python, run.backend_args, left)
        except BaseException as exc:  # given to the main thread in answers()
            self._errors.append(exc)

    def answers(self) -> tuple[int, str | None]:
        """(CUDA devices, the earlier pre-lowering's stamp or None), once asked."""
        for thread in self._threads:
            thread.join()
        if self._errors:
            raise self._errors[0]
        return self.gpus, self.prelowered if self.gpus else None


def run_phases(
    console: Console,
    run: SuiteRun,
    door: FrontDoor,
    record: RunRecord,
    machine: MachineQuestions,
    forks: ForkServer | None = None,
) -> None:
    """The phases of a run, noted in ``record`` as they go (shards started, the pre-lowering while it
    runs), so that the report after them finds what they left whatever stopped them."""
    gpus, prelowered = machine.answers()
    run_id = plan.run_id(run.name)
    given = f" (${RUN_ID_ENV})" if os.environ.get(RUN_ID_ENV, "").strip() else ""
    console.log(f"run id {run_id}{given}")
    caches.note_run(run_id)  # what a kept cache's pruning counts runs by (harness/caches.py)
    chosen = settings.set_in()
    shown = ", ".join(f"{name}={value!r}" for name, value in chosen.items())
    console.log(f"settings: {shown}" if chosen else "settings: none set (`python -m settings` lists them)")
    context = _Context(console, run, door, record, {RUN_ID_ENV: run_id}, forks)
    record.shards.append(run.name)
    if gpus == 0:
        workers = sizing.cpu_workers()
        console.log(f"no CUDA device; {workers} pytest-xdist worker(s)")
        _timed(context, plan.cpu_phase(run.name, workers))
    else:
        _gpu_phases(context, gpus, prelowered)


def _gpu_phases(context: _Context, gpus: int, prelowered: str | None) -> None:
    """(0)-(4) of the module's docstring, sized once (``sizing.size_gpu_run``) and the sizing logged;
    ``prelowered``: the stamp of an earlier run that lowered everything (a warm cache: nothing to
    compile, so no compile process starts)."""
    run, record, console = context.run, context.record, context.console
    # Each step's row says how many tasks were runnable: whether a phase had more than cores (issue 31).
    # Its trace (results/<run>.busy.tsv): every second's count, and who was runnable where over the cores.
    trace = run.results / f"{run.name}{BUSY_TRACE_SUFFIX}"
    record.busy = BusySampler(trace_path=trace, origin=record.origin).start()
    pinned = plan.pinning(gpus)
    size = sizing.size_gpu_run(gpus, prelower=plan.prelowers(run), prelowered=prelowered)
    console.log(f"{size.sentence}; then {EXCLUSIVE!r} alone, one worker")
    console.log(f"sized so: {'; '.join(size.reasons)}")
    alone = plan.modules_marking(run.root, run.selection, plan.EXCLUSIVE_MARKS)
    later = [plan.exclusive_phase(run.name, pinned, alone)]
    multi = plan.multi_gpu_phase(run.name) if gpus >= 2 else None
    preflight = None
    early: dict[str, EarlyPhase] = {}
    beside: _Beside | None = None
    try:
        if run.prelower and not run.narrowed:
            preflight = _prelower_and_preflight(context, size.prelower_jobs)
            # The front door checks the toolchain: the later phases start now, held at their gates, and
            # the multi-GPU cases (they measure nothing) run now, beside the shared phase.
            early = {phase.shard: _start_early(context, phase) for phase in later}
            if multi is not None:  # beside the shared phase: a case worker's threads
                beside = _start_beside(context, dataclasses.replace(multi, env=plan.worker_threads(size)))
        elif multi is not None:
            later.append(multi)
        shared = plan.shared_phase(run.name, size, plan.shared_env(pinned, size))
        then = tuple(phase.shard.removeprefix(run.name) for phase in later)  # its ETA counts them too
        # Beside the pre-lowering's compile processes the fork server's imports took 22-29 s on one H200,
        # and the workers waited for them (their cases from +18 to +29 s, cold ones' from +6.2 s): cold
        # workers then (examples/runs/2026-11-29-forked-workers-H200/).
        forked = record.prelowering is None
        if not forked and context.forks is not None:
            stop_server(context.forks, keep_as=None)
        _timed(context, dataclasses.replace(shared, then=then, forked=forked))
        if preflight is not None:  # the phases after the shared one need its verdict
            preflight.join()
        if record.prelowering is not None:  # its GPU work must end before the NVML measurements
            _end_prelowering(context)
        if beside is not None:  # as must the multi-GPU cases'
            _beside_turn(context, beside)
            beside = None
        for phase in later:
            record.shards.append(phase.shard)
            started = early.pop(phase.shard, None)
            if started is None:
                _timed(context, phase)
            else:
                step = functools.partial(_released, context, started)
                record.timed(phase.title, step, _shard_file(context, phase))
    finally:
        for left in early.values():  # the run stopped before their turn
            cancel(left)
        if beside is not None:  # the run stopped before its row: its cases' records stay
            stop_keeping(beside.early, TERMINATE_WAIT_S)


def _prelower_and_preflight(context: _Context, jobs: int) -> threading.Thread:
    """The pre-lowering first (``jobs`` compile processes; none where the sizing left none), then the
    preflight in a thread beside it and beside the shared phase's cases (``--no-preflight``: the front door
    checks): on a cold machine the preflight is a long compile, and the cases that need no compile, and
    those waiting for the pre-lowering anyway, need not wait for it. A failed preflight stops
    the run (``FrontDoor.request_stop``, exit 3, its diagnosis above the table): the running phase is
    stopped as by a signal, keeping what its cases recorded, the later phases are not started, and the
    pre-lowering is stopped (nothing is worth compiling with that toolchain)."""
    run, record = context.run, context.record
    record.prelowering = start_prelowering(
        context.console, run.python, jobs, run.prelower_log, run.backend_args
    )
    if record.prelowering is not None and record.busy is not None:  # its tasks counted as one
        record.busy.groups[record.prelowering.process.pid] = "pre-lowering"
    record.toolchain_checking = True
    started = time.perf_counter()
    thread = threading.Thread(
        target=_preflight_beside, args=(context, started), name="preflight", daemon=True
    )
    thread.start()
    return thread


def _preflight_beside(context: _Context, started: float) -> None:
    """The preflight's thread: its row in the table, then the run stopped if it failed."""
    record = context.record
    try:
        record.add("preflight (overlapped)", started, _check_toolchain(context))
    finally:
        record.toolchain_checking = False
    if record.toolchain_ok is False and record.toolchain_code != EXIT_DEADLINE:  # a deadline stops itself
        reason = "the backend's toolchain preflight failed (its diagnosis is above); the cases were stopped"
        context.door.request_stop(reason, EXIT_PREFLIGHT)


def _check_toolchain(context: _Context) -> str:
    """The backend's preflight, once (later phases then skip their own)."""
    run = context.run
    job = context.record.prelowering  # its group: background work, counted with the compiles
    group = None if job is None else job.process.pid
    # background work beside the cases, like a compile process: one thread for torch's ops and one for
    # inductor's compiles (torch's defaults, a thread and a compile process per core, burst over the cores)
    env = {**context.env, **sizing.COMPILE_ENV, **sizing.COMPILE_PROCESS_ENV}
    code = check_toolchain(run.python, run.backend_args, env, context.door.time_left(), group)
    context.record.toolchain_code = code
    return toolchain_detail(code)


def _end_prelowering(context: _Context) -> None:
    """Stop the pre-lowering and put it in the table, from its start to now."""
    job = context.record.prelowering
    assert job is not None
    context.record.add("prelower (overlapped)", job.started, stop_prelowering(context.console, job))
    context.record.prelowering = None


def _start_early(context: _Context, phase: PytestPhase, *, held: bool = True) -> EarlyPhase:
    """Start a later phase now, held at its gate unless ``held=False`` (``early.py``); it skips the
    preflight the front door runs, and its deadline is what the run has left (the same end as the run's)."""
    args = phase.args(context.run.selection, skip_preflight=True)
    cmd = plan.pytest_command(context.run, phase.shard, args, context.door.phase_args())
    env = {**context.env, **phase.env}
    if held:  # one thread while it waits beside the shared phase, its own count once its gate opens
        env.update(held_threads(env))
    return start_early(context.console, phase, cmd, env, context.run.results, held=held)


@dataclass
class _Beside:
    """A phase run beside the shared one: when it started, and when it ended (its thread notes that, so
    that its row in the table ends with it, not with the shared phase)."""

    early: EarlyPhase
    started: float
    ended: float | None = None

    def __post_init__(self) -> None:
        self._waiter = threading.Thread(target=self._wait, name=f"{self.early.phase.shard}-exit", daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.early.process.wait()
        self.ended = time.perf_counter()

    def end(self) -> float | None:
        """When it ended (None: not yet, or not within a second of its exit being seen)."""
        self._waiter.join(1.0)
        return self.ended


def _start_beside(context: _Context, phase: PytestPhase) -> _Beside:
    """Start a phase now, its gate open: it runs beside the shared phase."""
    return _Beside(_start_early(context, phase, held=False), time.perf_counter())


def _beside_turn(context: _Context, beside: _Beside) -> None:
    """The row of a phase run beside the shared one, after that phase: its output shown and its exit
    waited for, or, where the run was stopped meanwhile, it stopped too, keeping what its cases recorded.
    The row spans its own run, from its start to its exit."""
    phase, record, door = beside.early.phase, context.record, context.door
    record.shards.append(phase.shard)
    if door.go_on:
        detail = f"{phase.detail}; beside the shared phase (its cases measure nothing)"
        detail = _phase_turn(context, detail, _releasing(context, beside.early))
    else:
        stop_keeping(beside.early, TERMINATE_WAIT_S)
        context.console.echo(beside.early.output.read_text(errors="replace"))
        detail = f"stopped with the run: {door.stop[0] if door.stop else 'stopped'}"
    record.add(phase.title, beside.started, detail, end=beside.end(), shard=_shard_file(context, phase))


def _released(context: _Context, early: EarlyPhase) -> str:
    """A phase started early, on its turn: its gate opened; after a signal it is ended at its gate
    instead, as a phase not started."""
    detail = f"{early.phase.detail}; started beside the shared phase, held until now"
    return _phase_turn(context, detail, _releasing(context, early), not_started=lambda: cancel(early))


def _releasing(context: _Context, early: EarlyPhase) -> Callable[[], int]:
    """A started phase's run for ``_phase_turn``: released (``early.release``), stopped as the front
    door stops the pytest it runs."""
    return functools.partial(
        release, context.console, early, interrupt_s=INTERRUPT_WAIT_S, terminate_s=TERMINATE_WAIT_S
    )


def _timed(context: _Context, phase: PytestPhase) -> None:
    context.record.timed(phase.title, lambda: _pytest_phase(context, phase), _shard_file(context, phase))


def _shard_file(context: _Context, phase: PytestPhase) -> Path:
    return context.run.results / f"{phase.shard}.json"


def _pytest_phase(context: _Context, phase: PytestPhase) -> str:
    """One pytest phase, unless a signal stopped the run before it; the table's detail.

    A SIGTERM or SIGINT to the front door reaches the pytest it runs (harness/run_control.py's FrontDoor):
    the front door then sends it SIGTERM, and gives it time to write its files."""
    env = {**context.env, **phase.env}
    # A forked phase's workers come from the front door's server where it started one, else from the
    # one its controller starts (harness/forkserver.py); either writes its counts here.
    server = context.forks if phase.forked else None
    log = context.run.results / f"{phase.shard}.forkserver.log"
    log.unlink(missing_ok=True)  # an earlier run's

    def run() -> int:
        args = phase.args(context.run.selection, skip_preflight=context.record.toolchain_known)
        cmd = plan.pytest_command(context.run, phase.shard, args, context.door.phase_args())
        return context.console.exit_code(
            cmd,
            env={**env, **(server.env if server else {})},
            interrupt_s=INTERRUPT_WAIT_S,
            terminate_s=TERMINATE_WAIT_S,
        )

    try:
        detail = _phase_turn(context, phase.detail, run)
    finally:
        if server is not None:
            stop_server(server, keep_as=log)
    words = forkserver.summary_words(log) if phase.forked else None
    return f"{detail}; {words}" if words else detail


def _phase_turn(
    context: _Context, detail: str, run: Callable[[], int], not_started: Callable[[], None] | None = None
) -> str:
    """A pytest phase's turn, whichever way it was started: not after a signal (``not_started`` then
    cleans up); else ``run`` (its exit code; a ``KeyboardInterrupt`` is the front door stopping it, after
    a signal or the deadline's backstop), its code noted. The table's detail."""
    door = context.door
    if not door.go_on:
        if not_started is not None:
            not_started()
        return f"not started: {door.stop[0] if door.stop else 'stopped'}"
    try:
        code = run()
    except KeyboardInterrupt:
        code = door.stop[1] if door.stop else EXIT_INTERRUPTED
    else:
        door.phase_ended(code)
    context.record.exit_codes.append(code)
    return detail
