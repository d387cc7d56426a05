"""The differential chapter's call journal: what a generated case was doing when its process died.

A generated sequence of protocol calls can kill the backend's process (a segmentation fault in a runtime
that checks no inputs). Then nothing in that process survives: not the example, not Hypothesis's shrinking.
So, before each step of the state machine (and each focused call), the worker writes the case, how its
machine was made and the steps of the current example to one file in the run's watchdog directory
(``<worker>.steps``, overwritten in place: microseconds a step), and before each call to the backend under
test, which call it is and what the oracle answered for it. When the worker dies, the process that gathers
the reports finds that file and replays the example in child processes
(``conformance/suite/crash_replay.py``).

The file holds a pickle of :class:`JournalState`; only the same checkout reads it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from conformance.common.oracle import describe_args, error_kind

F = TypeVar("F", bound=Callable[..., Any])

SUFFIX = ".steps"


@dataclass
class Calling:
    """The backend call in progress: the protocol function, the call as text, and what the oracle did with
    the same call (``ok``, an error kind of ``conformance.common.oracle.CallResult.kind``, or None: not
    asked)."""

    function: str
    text: str
    oracle: str | None


@dataclass
class JournalState:
    """What a case's process was doing: ``case`` (its id), ``machine`` (the arguments that make its
    machine class again: backend and oracle specs, device, shard, run seed, the models both lower), the
    steps of the current example (``(method, kwargs)``), and the backend call in progress."""

    case: str
    machine: dict[str, Any]
    steps: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    calling: Calling | None = None


class CallJournal:
    """One case's journal, written to ``path`` (None: kept in memory only, e.g. a run without a watchdog
    directory, or a replay that writes its own)."""

    def __init__(self, path: Path | None, case: str, machine: dict[str, Any]) -> None:
        self.path = path
        self.state = JournalState(case, dict(machine))
        #: The oracle's latest answer per protocol function within the current step (see ``Watched``).
        self.answers: dict[str, str] = {}
        self._fd: int | None = None
        self._depth = 0
        self._lock = threading.Lock()  # a step's threads note their calls at once: one write at a time
        self._write()

    # -- the steps --------------------------------------------------------------------------------------

    def mark(self) -> int:
        """How many steps there are now (a focused case's example starts from its set-up steps)."""
        return len(self.state.steps)

    def truncate(self, mark: int = 0) -> None:
        """A new example: forget the steps after ``mark`` (0: a state machine's example starts afresh)."""
        del self.state.steps[mark:]
        self.state.calling = None
        self._write()

    @contextlib.contextmanager
    def step(self, method: str, kwargs: dict[str, Any]) -> Any:
        """Record ``method(**kwargs)`` before it runs; a step made inside another is part of it."""
        if self._depth == 0:
            self.state.steps.append((method, dict(kwargs)))
            self.state.calling = None
            self.answers.clear()
            self._write()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def calling(self, function: str, text: str, oracle: str | None) -> None:
        """The backend's ``function`` is about to be called (``text``); the oracle's answer to it."""
        self.state.calling = Calling(function, text, oracle)
        self._write()

    # -- the file ---------------------------------------------------------------------------------------

    def _write(self) -> None:
        if self.path is None:
            return
        with self._lock:
            data = pickle.dumps(self.state, protocol=pickle.HIGHEST_PROTOCOL)
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            # In place, then cut to length: one open file for the whole case, no new file per step.
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))

    def close(self) -> None:
        """The case ended in its own process: nothing is left to replay."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def journal_path(directory: Path, process: str) -> Path:
    return directory / f"{process}{SUFFIX}"


def read(path: Path, case: str) -> JournalState | None:
    """The journal a dead process left for ``case``, if it left one (a torn write reads as none)."""
    try:
        state = pickle.loads(path.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError):
        return None
    return state if isinstance(state, JournalState) and state.case == case else None


def journaled(method: F) -> F:
    """A machine method whose calls are steps of the journal (when the machine has one): a replay makes
    the same calls in the same order."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        journal: CallJournal | None = getattr(self, "journal", None)
        if journal is None:
            return method(self, *args, **kwargs)
        names = method.__code__.co_varnames[1 : method.__code__.co_argcount]
        with journal.step(method.__name__, {**dict(zip(names, args, strict=False)), **kwargs}):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


#: The protocol calls a journaled side notes (conformance/protocol.py names them).
PROTOCOL_CALLS = frozenset(
    {"lower", "init", "execute", "destroy", "execute_stats", "set_option", "get_option", "mm_out"}
)


class Watched:
    """A backend seen through the journal: each protocol call of the backend under test is noted before it
    is made, with the oracle's answer to the same call when the oracle was asked first (``oracle=True``:
    this side is the oracle, whose answers are kept per function). Everything else passes through."""

    def __init__(self, target: Any, journal: CallJournal, oracle: bool) -> None:
        self._target, self._journal, self._oracle = target, journal, oracle

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name not in PROTOCOL_CALLS or not callable(value):
            return value
        journal = self._journal

        if self._oracle:

            def answered(*args: Any, **kwargs: Any) -> Any:
                try:
                    result = value(*args, **kwargs)
                except Exception as exc:
                    journal.answers[name] = error_kind(exc)
                    raise
                journal.answers[name] = "ok"
                return result

            return answered

        def noted(*args: Any, **kwargs: Any) -> Any:
            journal.calling(name, brief_call(name, args, kwargs), journal.answers.get(name))
            return value(*args, **kwargs)

        return noted


def brief_call(function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``execute(<handle>, [float32[4, 32]@cpu])``: the call as the suite's messages show arguments."""
    shown = [describe_args(args)] if args else []
    shown += [f"{key}={describe_args([value])}" for key, value in kwargs.items()]
    return f"{function}({', '.join(shown)})"


def for_case(config: Any, case: str, machine: dict[str, Any]) -> CallJournal:
    """The journal of ``case`` in this process: in the run's watchdog directory, where the process that
    gathers the reports looks when this one dies (in memory only outside a recorded run)."""
    where = process_directory(config)
    return CallJournal(journal_path(*where) if where is not None else None, case, machine)


def process_directory(config: Any) -> tuple[Path, str] | None:
    """The run's watchdog directory and this process's name in it (an xdist worker's id, or ``main``): where
    the case watchdog keeps this process's files."""
    from harness.run_end import case_files

    files = case_files(config)
    return (files.directory, files.process) if files is not None else None


def watched(journal: CallJournal, backend: Any, oracle: Any) -> tuple[Watched, Watched]:
    """The backend under test and the oracle as a case whose steps are functions calls them."""
    return Watched(backend, journal, False), Watched(oracle, journal, True)


def function_name(function: Callable[..., Any]) -> str:
    """``module:name``: how a step that is a function is named in the journal (its replay imports it)."""
    return f"{function.__module__}:{function.__qualname__}"
