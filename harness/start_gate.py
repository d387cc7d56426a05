"""A pytest phase started before its turn waits, collected, until the front door opens its gate.

The front door starts the phases after the shared one (the cases that need their GPU alone, those that
need several GPUs) while the shared phase still runs: their interpreter start, torch's import, xdist's
workers and the collection (5-10 s per phase on the GPU image) then overlap the shared phase instead of
following it. ``$CONFORMANCE_START_GATE`` is ``<front door pid>:<path>``: each process of such a phase
(each xdist worker) waits after its collection until ``path`` exists, so no fixture, case or measurement
runs before the GPU is its own. A front door that is gone ends the wait (``FrontDoorGone``): a phase
nobody will open must not wait forever.

While it waits, a held process imports what any case's first lowering imports (``WARM_IMPORTS``): in the
GPU-alone phase that import was most of its first case's 6-10 s, paid while the GPU was the phase's.
A test module may register setup that measures nothing (``while_held``: the traffic meter pins its buffers
there, ``examples/runs/2026-11-29-fresh-runner-H200/``; the PCIe placement cases lower and load their
programs) to run there too, where the phase selected its cases. It is given the pytest config.

It waits on one thread for torch's ops (``held_threads``): with torch's default, a thread per core, each
of the GPU-alone phase's processes made bursts of 32 runnable tasks beside the shared phase's workers on
two H200s. Once its gate opens it takes its own count again.

Standard library only: the front door (nox's interpreter) opens the gate, the pytest plugin waits.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import settings

#: ``<pid>:<path>`` of the gate a phase started early waits for; unset: no gate (start at once).
GATE_ENV = settings.START_GATE.name
#: Seconds between looks at the gate: a phase's cases start within this of its opening.
POLL_S = 0.05
#: Imported by a held process before it waits, and by the fork server before it forks the case workers
#: (``harness/forkserver.py``): ``torch.export`` and dynamo (with sympy and the symbolic shapes) are what
#: every backend's lowering and the zoo's dynamic shapes import first, whatever the backend (2-5 s of a
#: first case on the GPU image); inductor's cache is what loading a compiled program imports; the zoo's
#: two Hugging Face architectures (``conformance/models/hf_*.py``) bring ``transformers`` (1.7 s, and
#: scikit-learn through it, 1.4 s, per process on the GPU image). Never a backend's modules; never one
#: pytest rewrites (a plugin's, such as hypothesis or xdist: imported ahead, pytest warns it cannot).
WARM_IMPORTS = (
    "torch._dynamo",
    "torch.export",
    "torch._inductor.codecache",
    "transformers.models.whisper.modeling_whisper",
    "transformers.models.qwen3.modeling_qwen3",
)
#: Comma-separated modules to import instead of ``WARM_IMPORTS`` (empty: none).
WARM_ENV = settings.WARM_IMPORTS.name
#: The threads for torch's ops a held process takes once its gate opens (``held_threads``).
THREADS_ENV = settings.THREADS_AT_GATE.name


#: Setup run while a phase waits: given the waiting process's pytest config (opaque here).
SetUp = Callable[[Any], object]

#: Test module -> its setup to run while a phase that selected its cases waits (``while_held``).
_HELD_SETUP: dict[str, list[SetUp]] = {}


def while_held(setup: SetUp) -> SetUp:
    """Register ``setup`` (one argument, the pytest config; what it makes, its module caches for the cases)
    to run while a phase that selected its module's cases waits at its gate: allocations and loads that
    move nothing a later phase measures. Without a gate it never runs: the cases make what they need."""
    _HELD_SETUP.setdefault(setup.__module__, []).append(setup)
    return setup


def held_setup(modules: Iterable[str]) -> list[SetUp]:
    """The setup ``while_held`` registered for ``modules``, in registration order."""
    return [setup for module in dict.fromkeys(modules) for setup in _HELD_SETUP.get(module, [])]


class FrontDoorGone(RuntimeError):
    """The process that would open the gate no longer exists."""


def gate_value(path: Path, pid: int | None = None) -> str:
    """``$CONFORMANCE_START_GATE`` for a gate at ``path`` opened by process ``pid`` (default: this one)."""
    return f"{os.getpid() if pid is None else pid}:{path}"


def open_gate(path: Path) -> None:
    """Let the phase waiting at ``path`` run its cases."""
    path.write_text("open\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def held_threads(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a phase held at its gate, beside ``env`` (its own): one thread for torch's ops
    while it waits, and its own count (``$OMP_NUM_THREADS`` in ``env``, else a thread per core, torch's
    default) in ``THREADS_ENV`` for ``take_threads`` once the gate opens."""
    return {"OMP_NUM_THREADS": "1", THREADS_ENV: env.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1)}


def take_threads(env: Mapping[str, str] = os.environ, key: str = THREADS_ENV) -> int | None:
    """Set torch's threads to the count ``key`` (default ``THREADS_ENV``) gives in ``env`` where set and
    torch is imported; the count set, or None (not set, not a positive integer, or torch not imported:
    nothing to change)."""
    value, torch = env.get(key, "").strip(), sys.modules.get("torch")
    if not value.isdigit() or int(value) < 1 or torch is None:
        return None
    torch.set_num_threads(int(value))
    return int(value)


def warm_imports(modules: Iterable[str] = WARM_IMPORTS) -> list[str]:
    """Import ``modules``; those that failed, as ``name: error`` (a case importing them meets the same
    error in its own time, named there)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any failure is the case's to report, in its own time
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def warm_list(env: Mapping[str, str] = os.environ) -> list[str]:
    """The modules to import ahead: those ``$CONFORMANCE_WARM_IMPORTS`` lists (comma-separated; empty:
    none) where set, else ``WARM_IMPORTS``."""
    listed = env.get(WARM_ENV)
    return list(WARM_IMPORTS) if listed is None else [m.strip() for m in listed.split(",") if m.strip()]


def wait_for_gate(
    env: Mapping[str, str] = os.environ,
    poll_s: float = POLL_S,
    alive: Callable[[int], bool] = _alive,
    warm: Iterable[str] | None = None,
    setup: Iterable[SetUp] = (),
    config: Any = None,
) -> float | None:
    """Wait until the gate in ``env`` is open, importing ``warm`` first (default: the modules
    ``$CONFORMANCE_WARM_IMPORTS`` lists where set, else ``WARM_IMPORTS``) and running each ``setup`` with
    ``config`` (any failure, a pytest skip included, is left for the case that meets it again, in its own
    time); the seconds waited, or None
    without a gate (or one that cannot be read: such a phase starts at once, as before gates, and imports
    nothing ahead). Raises ``FrontDoorGone`` when the process that would open it ended first."""
    pid, sep, path = env.get(GATE_ENV, "").partition(":")
    if not sep or not pid.isdigit() or not path:
        return None
    started = time.monotonic()
    warm_imports(warm_list(env) if warm is None else warm)
    for prepare in setup:
        try:
            prepare(config)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # pytest's skip and fail too: the case meets it again, in its own time
            continue
    gate = Path(path)
    while not gate.exists():
        if not alive(int(pid)):
            raise FrontDoorGone(f"the front door (pid {pid}) that would open {gate} is gone")
        time.sleep(poll_s)
    take_threads(env)
    return time.monotonic() - started
