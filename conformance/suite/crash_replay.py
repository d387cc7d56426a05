"""A generated call sequence that killed the backend's process, found again and shrunk in child processes.

When a differential case's process dies (a segmentation fault, an abort), Hypothesis dies with it: no
shrinking, no example printed. The case's journal (``conformance/common/crash_journal.py``) says which example
was running, step by step, and which backend call was in progress. The process that gathers the reports
(pytest-xdist's controller: ``CrashReplays.pytest_handlecrashitem``) then

1. replays that example in a child process, to see that it crashes on its own;
2. shrinks it there: drops steps (halves, then quarters, down to single steps; the crashing step stays)
   while a child replaying what is left still dies, within a budget of time and replays;
3. records the case ``crashed`` under the rule of the call that crashed, from the oracle's answer to the
   same call (a call the oracle rejects: ``differential/missing-error``, the backend had to raise; one it
   accepts: ``differential/spurious-error``), with the shortest sequence in the message and a repro
   script that replays it in one process, crashing as printed (``<python> results/crashes/<case>.py``).

A ``crash = true`` known failure naming that rule declares such a case
(``conformance/suite/known_failures.py``). Children come from a ``forkserver`` that imported torch, Hypothesis
and the backend once: each replay is a fresh process (a crash kills it alone) that starts warm.
``CONFORMANCE_CRASH_REPLAY_S`` bounds the search (default 180 s; 0 turns it off: the crash is recorded as
pytest-xdist reports it).
"""

from __future__ import annotations

import argparse
import base64
import math
import multiprocessing
import os
import pickle
import re
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import settings
from conformance.common.crash_journal import Calling, CallJournal, JournalState, journal_path, read, watched
from conformance.common.oracle import ERROR_CLASS, MISSING_ERROR, SPURIOUS_ERROR
from conformance.common.rules import Level

BUDGET_ENV = settings.CRASH_REPLAY_S.name
DEFAULT_BUDGET_S = settings.CRASH_REPLAY_S.default()
#: At most this many replays per crash (the first one included).
MAX_REPLAYS = 40
#: A replay that runs longer than this is taken as not crashing.
REPLAY_TIMEOUT_S = 120.0
#: Kept free before the run's deadline (``--run-deadline``): the search stops that much earlier.
REPLAY_MARGIN_S = 15.0
#: Imported once by the fork server; each replay starts from there.
PRELOAD = ["torch", "hypothesis", "hypothesis.stateful", "conformance.common.protocol_machine"]
ROOT = Path(__file__).resolve().parents[2]

Step = tuple[str, dict[str, Any]]


# ================================================================================================ replay


def replay(machine: dict[str, Any], steps: Sequence[Step], journal: Path | None = None) -> None:
    """Make the calls of ``steps`` on a machine like the case's, in this process (a crash ends it).
    ``journal``: where the replay notes its own steps and calls, for the process that watches it."""
    from conformance.common.protocol_machine import machine_for
    from harness.backend_loader import load_backend, use_backend_path

    use_backend_path(list(machine.get("backend_path") or []))
    backend, oracle = load_backend(machine["backend"]), load_backend(machine["oracle"])
    notes = CallJournal(journal, str(machine.get("case", "replay")), machine)
    if machine.get("kind") == "calls":  # steps that are functions of (backend, oracle, ...)
        sides = watched(notes, backend, oracle)
        for name, kwargs in steps:
            with notes.step(name, kwargs):
                _function(name)(*sides, **kwargs)
        return
    cls = machine_for(
        backend,
        oracle,
        machine["device"],
        shard=int(machine.get("shard", 0)),
        run_seed=machine.get("run_seed"),
        journal=notes,
        lowerable=machine.get("lowerable"),
    )
    instance = cls()
    try:
        for method, kwargs in steps:
            getattr(instance, method)(**kwargs)
    finally:
        instance.teardown()


def _function(name: str) -> Any:
    """The function a step names (``module:qualname``)."""
    import importlib

    module, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _replay_child(machine: dict[str, Any], steps: list[Step], journal: str) -> None:
    """A replay's child: exit 0 when the steps ran out (judged or not), 1 when one raised; a crash is the
    process's own death."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        replay(machine, steps, Path(journal))
    except BaseException:  # a failed check, an exception: anything but a crash
        os._exit(1)
    os._exit(0)


# ================================================================================================ search


@dataclass
class Finding:
    """What the search found: whether the example crashed again in a fresh process, the shortest crashing
    sequence (``steps``; the journal's own when it did not replay), the call that crashed, how it died."""

    case: str
    machine: dict[str, Any]
    steps: list[Step]
    calling: Calling | None
    replayed: bool
    signal: int | None = None
    original_steps: int = 0
    replays: int = 0
    seconds: float = 0.0
    script: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rule(self) -> str | None:
        """The rule the crashing call broke, from the oracle's answer to the same call."""
        return rule_for(self.calling)

    def message(self) -> str:
        death = f" ({_signal_name(self.signal)})" if self.signal else ""
        where = self.calling.text if self.calling else "outside any call to the backend"
        rule, why = judged(self.calling)
        head = f"[{rule}] " if rule else ""
        lines = [f"{head}crashed: the process died{death} in {where}; {why}"]
        if self.replayed:
            lines.append(
                f"shortest crashing sequence: {len(self.steps)} of {self.original_steps} steps (found in "
                f"{self.replays} replays in fresh processes, {self.seconds:.0f} s):"
            )
        else:
            lines.append(
                f"the example did not crash again in a fresh process ({self.replays} replays, "
                f"{self.seconds:.0f} s): it needs what earlier examples left behind; its steps:"
            )
        lines += [f"  {describe_step(s)}" for s in self.steps]
        lines += self.notes
        return "\n".join(lines)

    def repro(self) -> str | None:
        """The script, with this interpreter (the one with torch and the backend), as the cwd reaches both."""
        if self.script is None:
            return None
        return f"{shlex.quote(_shown_path(Path(sys.executable)))} {shlex.quote(_shown_path(self.script))}"


def judged(calling: Calling | None) -> tuple[str | None, str]:
    """The rule the crashing call broke and why, from the oracle's answer to the same call."""
    if calling is None:
        return None, "no backend call was in progress"
    answer = calling.oracle
    if answer in ("invalid-argument", "type-error"):
        why = f"the oracle rejects this call ({answer}): it must raise, never kill the process"
        return MISSING_ERROR, why
    if answer == "ok":
        return SPURIOUS_ERROR, "the oracle accepts this call: it must run, never kill the process"
    if answer is None:
        return SPURIOUS_ERROR, "a call no step judged: it must return or raise, never kill the process"
    return ERROR_CLASS, f"the oracle raises ({answer}): it must raise too, never kill the process"


def rule_for(calling: Calling | None) -> str | None:
    return judged(calling)[0]


def describe_step(step: Step) -> str:
    method, kwargs = step
    return f"{method}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Replayer:
    """Runs replays in children of one fork server."""

    def __init__(self, machine: dict[str, Any], scratch: Path) -> None:
        self.machine = machine
        self.scratch = scratch
        self.replays = 0
        context = multiprocessing.get_context("forkserver")
        modules = [*PRELOAD, *(str(machine[k]).split(":")[0] for k in ("backend", "oracle"))]
        context.set_forkserver_preload(modules)
        self.context = context

    def crashes(self, steps: list[Step]) -> tuple[int | None, Calling | None]:
        """Replay ``steps`` in a child: the signal it died of (None: it did not crash) and the backend
        call it was in."""
        self.replays += 1
        notes = self.scratch / f"replay-{self.replays}.steps"
        child = self.context.Process(target=_replay_child, args=(self.machine, steps, str(notes)))
        child.start()
        try:
            child.join(REPLAY_TIMEOUT_S)
        except BaseException:  # the run stopped meanwhile (its deadline, a signal): no replay outlives it
            child.kill()
            child.join()
            raise
        if child.is_alive():  # past its time: taken as not crashing
            child.kill()
            child.join()
            return None, None
        code = child.exitcode
        if code is None or code >= 0:
            return None, None
        state = read(notes, str(self.machine.get("case", "replay")))
        return -code, state.calling if state is not None else None


def find(state: JournalState, budget_s: float, scripts: Path | None) -> Finding:
    """Replay the journal's example, then shrink it, within ``budget_s`` seconds."""
    start = time.monotonic()
    steps = list(state.steps)
    machine = {**state.machine, "case": state.case}
    finding = Finding(state.case, machine, steps, state.calling, False, original_steps=len(steps))
    with tempfile.TemporaryDirectory(prefix="crash-replay-") as scratch:
        replayer = Replayer(machine, Path(scratch))
        died, calling = replayer.crashes(steps)
        if died is not None:
            finding.replayed = True
            finding.steps, finding.signal, finding.calling, cut = _shrink(
                replayer, steps, (died, calling or state.calling), start + budget_s
            )
            if cut:
                finding.notes.append(f"(the search stopped at its budget: {cut}; a shorter one may exist)")
        finding.replays = replayer.replays
    finding.seconds = time.monotonic() - start
    if scripts is not None:
        finding.script = write_script(finding, scripts)
    return finding


def _shrink(
    replayer: Replayer, steps: list[Step], found: tuple[int, Calling | None], deadline: float
) -> tuple[list[Step], int, Calling | None, str]:
    """Drop chunks of the steps before the crashing one while a replay still crashes (delta debugging's
    reduction to a 1-minimal prefix). Returns the steps, how the shortest one died, and why it stopped
    early (empty when it did not)."""
    prefix, last = steps[:-1], steps[-1:]
    died, calling = found
    parts = 2
    while prefix:
        chunk = math.ceil(len(prefix) / parts)
        for begin in range(0, len(prefix), chunk):
            if time.monotonic() > deadline:
                return prefix + last, died, calling, f"{BUDGET_ENV} seconds"
            if replayer.replays >= MAX_REPLAYS:
                return prefix + last, died, calling, f"{MAX_REPLAYS} replays"
            candidate = prefix[:begin] + prefix[begin + chunk :]
            signal_number, where = replayer.crashes(candidate + last)
            if signal_number is not None:
                prefix, died, calling = candidate, signal_number, where or calling
                parts = max(parts - 1, 2)
                break
        else:
            if chunk == 1:
                break
            parts = min(parts * 2, len(prefix))
    return prefix + last, died, calling, ""


# ================================================================================================ script


def write_script(finding: Finding, directory: Path) -> Path:
    """A Python file that replays the finding's steps in one process: run as printed, it crashes."""
    directory.mkdir(parents=True, exist_ok=True)
    path = finding.script = directory / f"{_slug(finding.case)}.py"
    machine = {k: v for k, v in finding.machine.items() if _literal(v)}
    steps = ",\n".join(f"    {_step_source(step)}" for step in finding.steps)
    rule = finding.rule or "no rule (outside any backend call)"
    text = f'''"""Replays the shortest call sequence found to crash {finding.machine.get("backend")} in
{finding.case}
(rule {rule}). Run it from the suite's checkout: {finding.repro()}"""

import os
import sys

sys.path[:0] = [os.getcwd(), {str(ROOT)!r}]

from conformance.suite.crash_replay import replay, unpickled  # noqa: E402, F401
from conformance.common.protocol_plans import (  # noqa: E402, F401
    CorruptPlan, InputsPlan, LowerPlan, OutputsPlan,
)
from conformance.common.strategies import MmOutPlan  # noqa: E402, F401

MACHINE = {machine!r}
STEPS = [
{steps},
]

if __name__ == "__main__":
    replay(MACHINE, STEPS)
    print("the sequence ran to its end without a crash")
'''
    path.write_text(text, encoding="utf-8")
    return path


def unpickled(text: str) -> Any:
    """A step's arguments that have no source form, as the repro script carries them."""
    return pickle.loads(base64.b64decode(text))


def _step_source(step: Step) -> str:
    from conformance.common.protocol_plans import CorruptPlan, InputsPlan, LowerPlan, OutputsPlan
    from conformance.common.strategies import MmOutPlan

    namespace = {c.__name__: c for c in (CorruptPlan, InputsPlan, LowerPlan, OutputsPlan, MmOutPlan)}
    source = repr(step)
    try:
        if eval(source, namespace) == step:
            return source
    except Exception:
        pass
    return f"unpickled({base64.b64encode(pickle.dumps(step)).decode('ascii')!r})"


def _literal(value: object) -> bool:
    try:
        import ast

        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        return False


def _slug(case: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", case.split("/")[-1]).strip("_")[:120]


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it; never resolved (a venv's python
    is a link to an interpreter without the venv's packages)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


# ============================================================================================ the plugin


def budget_s() -> float:
    """``$CONFORMANCE_CRASH_REPLAY_S`` (unset or empty: the default; 0: no search); anything but a number of
    seconds ≥ 0 is a ValueError naming the setting."""
    return settings.CRASH_REPLAY_S.get()


class CrashReplays:
    """The controller's plugin: a worker that died in a journaled case gets its crash found again, shrunk
    and recorded under the crashing call's rule. Runs after the run's end read the watchdog's verdicts
    (a timeout or a device fault is not a crash) and before known failures are matched."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        try:  # a bad setting stops the run before it starts, not at its first crash
            self.budget_s = budget_s()
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from exc

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: object) -> None:
        from harness.pytest_plugin import CASE_RESULT_ATTR
        from harness.run_end import run_end

        end = run_end(self.config)
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        if end is None or worker is None or getattr(report, CASE_RESULT_ATTR, None) is not None:
            return
        state = read(journal_path(end.directory, str(worker)), crashitem)
        seconds = self.budget_s
        left = end.control.remaining()
        if left is not None:  # the search never holds the run past its deadline
            seconds = min(seconds, left - REPLAY_MARGIN_S)
        if state is None or seconds <= 0:
            return
        self._say(
            f"crash in {crashitem}: replaying its example in fresh processes for the shortest crashing "
            f"sequence (at most {seconds:.0f} s, {BUDGET_ENV})"
        )
        finding = find(state, seconds, end.directory.parent / "crashes")
        self._say(f"crash in {crashitem}: {finding.message().splitlines()[0]}")
        result: dict[str, Any] = {
            "outcome": "crashed",
            "message": finding.message(),
            "rule": finding.rule,
            "level": Level.MUST.value,
        }
        repro = finding.repro()
        if repro:
            result["repro"] = repro
        setattr(report, CASE_RESULT_ATTR, result)
        # What the terminal's failure list and the JUnit file show: xdist's line, then the finding.
        report.longrepr = "\n".join(
            [str(report.longrepr), finding.message(), *([f"repro: {repro}"] if repro else [])]
        )
        props = [
            ("conformance:outcome", "crashed"),
            *([("conformance:rule", finding.rule)] if finding.rule else []),
        ]
        report.user_properties = [*report.user_properties, *props]

    def _say(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)


# ================================================================================================ command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.suite.crash_replay",
        description="find again and shrink the crash a journal (a <worker>.steps file) recorded",
    )
    parser.add_argument("journal", type=Path, help="the journal file a dead process left")
    parser.add_argument("--case", help="the case it must be of (default: whichever it is)")
    parser.add_argument("--budget", type=float, default=None, help=f"seconds for the search (${BUDGET_ENV})")
    parser.add_argument("--scripts", type=Path, default=Path("results/crashes"), help="where repros go")
    args = parser.parse_args(argv)
    state = pickle.loads(args.journal.read_bytes())
    if not isinstance(state, JournalState) or (args.case and state.case != args.case):
        parser.error(f"{args.journal} is not a journal of {args.case or 'a case'}")
    try:
        seconds = budget_s() if args.budget is None else args.budget
    except ValueError as exc:
        parser.error(str(exc))
    finding = find(state, seconds, args.scripts)
    print(finding.message())
    if finding.repro():
        print(f"repro: {finding.repro()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
