"""An xdist worker, or controller, whose session is over leaves without the interpreter's teardown.

Once a worker has sent its last report and pytest has unconfigured it, the controller waits for the
worker's process to end (execnet's ``Group.terminate`` joins every one) before it writes the result file,
and the run's next phase waits for the controller. Python's teardown of a worker that imported torch (and
on a GPU holds a CUDA context and dozens of loaded compiled libraries) is seconds of that wait: here, on
the CPU, 2.5 s of the controller's 2.5 s ``pytest_sessionfinish``; on one H100, 3.4 s between a warm shared
phase's last case and its result file. Nothing it does is needed any more: the reports went over the
channel, result files are the controller's, and the kernel releases memory, locks and the GPU.

So the first ``atexit`` handler registered (``install``, at the import of ``harness.pytest_plugin``, before
the conftest imports torch) runs last, after every handler registered after it; where the worker's session
ended (``session_over``, from the worker's last ``pytest_unconfigure``) it flushes logging and the standard
streams and ends the process with ``os._exit(0)``.

The controller of an xdist run does the same once its session is over, with the session's exit status:
its result files are written and its summary shown by then, and the next phase, or the report, waits for
its exit (on one H200 a warm phase ended 0.65-0.84 s after its controller's final write, and 0.17-0.50 s
since, ``examples/runs/2026-11-29-warm-tails-H200/``). Only
the process's own session (pytest started as ``python -m pytest`` with this process's arguments; never an
in-process ``pytest.main`` of a longer-lived process, whose exit is not the session's), and not where the
interpreter is ending on an uncaught exception (its status is Python's). A worker that died or whose
session did not end, and a run without xdist, end as Python ends them; so does any process under
coverage, whose data is saved by a handler that may come after this one.

Before that, pytest's unconfigure collects garbage twice to report unraisable exceptions (``__del__``
errors) as warnings: 0.7 s per worker of a warm GPU run, which holds torch's and the zoo's heaps, at the
end of each phase. ``skip_final_collection`` turns that off for a worker: a ``__del__`` error is still
reported when a case's garbage is freed or collected during the run; only garbage in reference cycles
still alive at the very end goes unexamined, as the process then leaves without collecting it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from typing import Any

#: Exit status of a worker that leaves this way (xdist reads a worker's outcome from its channel, not this).
EXIT_STATUS = 0

_state: dict[str, Any] = {"installed": False, "over": False, "status": EXIT_STATUS}


def install() -> None:
    """Register the handler, once per process; the earlier it is registered, the later it runs."""
    if not _state["installed"]:
        _state["installed"] = True
        atexit.register(_leave)


def session_over(status: int = EXIT_STATUS) -> None:
    """This xdist process's session has ended: its process may leave without teardown, with ``status``
    (a worker's is never read: xdist reads a worker's outcome from its channel)."""
    _state["over"] = True
    _state["status"] = status


def is_the_process_session(config: Any) -> bool:
    """Whether ``config``'s session is this process's own: started with this process's arguments (an
    in-process ``pytest.main`` of another program is not, and that program's exit is its own)."""
    args = getattr(getattr(config, "invocation_params", None), "args", None)
    return args is not None and tuple(args) == tuple(sys.argv[1:])


def _coverage_running() -> bool:
    coverage = sys.modules.get("coverage")
    current = getattr(getattr(coverage, "Coverage", None), "current", None)
    return callable(current) and current() is not None


def _leave() -> None:
    if not _state["over"] or _coverage_running() or _ending_on_an_exception():
        return
    logging.shutdown()  # its own handler was registered before this one: it would run after
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed or replaced: nothing to flush
            stream.flush()
    os._exit(_state["status"])


def _ending_on_an_exception() -> bool:
    """Whether the interpreter printed an uncaught exception (it then exits with its own status)."""
    return getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None


def skip_final_collection(config: Any) -> None:
    """No garbage collection in pytest's unconfigure of this worker (the module doc); a pytest without
    that setting is left as it is."""
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:
        return
    config.stash[gc_collect_iterations_key] = 0
