"""Every environment setting of the project in one table: its name, default, parser and one line of doc.

Each module that reads a ``CONFORMANCE_*`` variable reads it through its ``Setting`` here, so one knob is
resolved one way everywhere: the artifact cache directory was read by three resolvers that disagreed
(``'~/cc '`` was a relative ``~/cc `` to the harness and ``$HOME/cc`` to the reference, so the cache the
harness cleaned and stamped was not the one the reference filled). The run header and the result file list
the settings a run had set (``set_in``). Standard library only: the reference backend and the adapters
import it too, and the front door runs it in nox's interpreter.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class SettingError(ValueError):
    """A setting whose value its parser rejects; the message names the variable, the value and the rule."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: where it is read, what an unset or empty one means, and how it parses."""

    name: str
    #: What an unset variable means (``parse`` is not called for it).
    default: Callable[[], T]
    #: The value's meaning; raises ``ValueError`` with the rule it breaks.
    parse: Callable[[str], T]
    doc: str
    #: Set by the front door for its own child processes, not by a user.
    internal: bool = False
    #: Whether an empty value means the default (True) or is passed to ``parse``.
    empty_is_unset: bool = True

    def raw(self, env: Mapping[str, str] = os.environ) -> str | None:
        """The variable's text as set, or None where unset (or empty, where that means unset)."""
        value = env.get(self.name)
        if value is None or (self.empty_is_unset and not value.strip()):
            return None
        return value

    def get(self, env: Mapping[str, str] = os.environ) -> T:
        """The setting's value in ``env``; a ``SettingError`` names a value its parser rejects."""
        value = self.raw(env)
        if value is None:
            return self.default()
        try:
            return self.parse(value)
        except ValueError as exc:  # "$CONFORMANCE_KEEP_RUNS must be a whole number (0 or more), got 'x'"
            raise SettingError(f"${self.name} {exc}, got {value!r}") from exc


# -- parsers --------------------------------------------------------------------------------------------


def a_path(text: str) -> Path:
    """An absolute directory: surrounding whitespace dropped, ``~`` and ``$VAR`` expanded (a CI system's
    ``env:`` passes ``~`` as it is), a relative one taken from the current directory."""
    cleaned = os.path.expandvars(os.path.expanduser(text.strip()))
    if not cleaned:
        raise ValueError("an empty path")
    return Path(os.path.abspath(cleaned))


def whole_number(text: str) -> int:
    value = text.strip()
    if not value.isdigit():
        raise ValueError("must be a whole number (0 or more)")
    return int(value)


def positive_whole_number(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:  # NaN fails it too
        raise ValueError("must be a number of seconds >= 0")
    return value


def switch(text: str) -> bool:
    """``0`` (or ``false``, ``no``, ``off``) turns a feature off; ``1`` (``true``, ``yes``, ``on``) on."""
    value = text.strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError("must be 0 or 1")


def text(value: str) -> str:
    return value.strip()


def one_of(*choices: str) -> Callable[[str], str]:
    """A parser that takes one of ``choices`` (case and surrounding whitespace ignored)."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "aoti-conformance"


def _none() -> None:
    return None


# -- the table ------------------------------------------------------------------------------------------

CACHE_DIR: Setting[Path] = Setting(
    "CONFORMANCE_CACHE_DIR", _default_cache_dir, a_path,
    "compiled programs, stamps and the run's bytecode (default ~/.cache/aoti-conformance)",
)  # fmt: skip
BACKEND: Setting[str | None] = Setting(
    "CONFORMANCE_BACKEND", _none, text, "the backend under test, module:attr (default: the reference)"
)
BACKEND_PATH: Setting[str | None] = Setting(
    "CONFORMANCE_BACKEND_PATH", _none, text,
    "directories (joined with the path separator) that hold the backend's package",
)  # fmt: skip
RUN_ID: Setting[str | None] = Setting(
    "CONFORMANCE_RUN_ID", _none, text, "the id every shard of a run records (CI sets one per workflow run)"
)
TORCH: Setting[str | None] = Setting(
    "CONFORMANCE_TORCH", _none, text, "the torch requirement a fresh nox venv installs (default: a CPU pin)"
)
KEEP_RUNS: Setting[int] = Setting(
    "CONFORMANCE_KEEP_RUNS", lambda: 10, whole_number, "earlier runs kept in results/runs (0: none)"
)
RUN_DEADLINE: Setting[float | None] = Setting(
    "CONFORMANCE_RUN_DEADLINE", _none, seconds, "seconds the whole run may take (as --run-deadline)"
)
PRELOWER: Setting[bool] = Setting(
    "CONFORMANCE_PRELOWER", lambda: True, switch, "0: no background pre-lowering; the cases compile"
)
WORKERS_PER_GPU: Setting[int | None] = Setting(
    "CONFORMANCE_WORKERS_PER_GPU", _none, positive_whole_number, "case workers per GPU (default: sized)"
)
CUDA_SYNC: Setting[str | None] = Setting(
    "CONFORMANCE_CUDA_SYNC", _none, text, "how a case worker waits for its GPU: blocking or default"
)
FORK_WORKERS: Setting[bool] = Setting(
    "CONFORMANCE_FORK_WORKERS", lambda: True, switch,
    "0: each case worker starts its own interpreter, not forked from one that imported torch ahead",
)  # fmt: skip
FORKSERVER: Setting[str | None] = Setting(
    "CONFORMANCE_FORKSERVER", _none, text, "the socket of the server that forks the case workers",
    internal=True,
)  # fmt: skip
STREAM_HOLDS: Setting[str] = Setting(
    "CONFORMANCE_STREAM_HOLDS", lambda: "front-end", one_of("front-end", "spin"),
    "how cases hold a CUDA stream: front-end (a driver wait; harness/stream_hold.py) or spin (a spin kernel)",
)  # fmt: skip
CRASH_REPLAY_S: Setting[float] = Setting(
    "CONFORMANCE_CRASH_REPLAY_S", lambda: 180.0, seconds,
    "seconds to find a crashing generated call again and shrink it (0: no search)",
)  # fmt: skip
LOCK_DIR: Setting[Path | None] = Setting(
    "CONFORMANCE_LOCK_DIR", _none, a_path, "where one host's runs share their GPU locks"
)
WARM_IMPORTS: Setting[str | None] = Setting(
    "CONFORMANCE_WARM_IMPORTS", _none, text, "modules a held phase imports while it waits (comma-separated)",
    empty_is_unset=False,
)  # fmt: skip
STACKS_SIGNAL: Setting[str | None] = Setting(
    "CONFORMANCE_STACKS_SIGNAL", _none, text, "the signal on which a process prints every thread's stack",
    internal=True,
)  # fmt: skip
START_GATE: Setting[str | None] = Setting(
    "CONFORMANCE_START_GATE", _none, text, "<pid>:<path> a phase started early waits for", internal=True
)
THREADS_AT_GATE: Setting[str | None] = Setting(
    "CONFORMANCE_THREADS_AT_GATE", _none, text, "torch threads a held phase takes once its gate opens",
    internal=True,
)  # fmt: skip
WORKER_GPUS: Setting[str | None] = Setting(
    "CONFORMANCE_WORKER_GPUS", _none, text, "which GPU each case worker is pinned to", internal=True
)

#: Every setting, by variable name.
SETTINGS: dict[str, Setting[object]] = {
    s.name: s  # type: ignore[misc]
    for s in (
        CACHE_DIR, BACKEND, BACKEND_PATH, RUN_ID, TORCH, KEEP_RUNS, RUN_DEADLINE, PRELOWER, WORKERS_PER_GPU,
        CUDA_SYNC, FORK_WORKERS, FORKSERVER, STREAM_HOLDS, CRASH_REPLAY_S, LOCK_DIR, WARM_IMPORTS,
        STACKS_SIGNAL, START_GATE, THREADS_AT_GATE, WORKER_GPUS,
    )
}  # fmt: skip


def set_in(env: Mapping[str, str] = os.environ, *, internal: bool = False) -> dict[str, str]:
    """The settings ``env`` sets, name → value as set (the front door's own internal ones left out unless
    ``internal``): what the run header prints and the result file records."""
    return {
        name: value
        for name, setting in SETTINGS.items()
        if (internal or not setting.internal) and (value := setting.raw(env)) is not None
    }


def main() -> int:
    """``python -m settings``: every setting, its default's meaning and whether this environment sets it."""
    for name, setting in SETTINGS.items():
        shown = setting.raw()
        state = f"= {shown!r}" if shown is not None else "(unset)"
        role = " [set by the front door]" if setting.internal else ""
        print(f"{name} {state}{role}\n    {setting.doc}")
    return 0
