"""Every thread's Python stack on a signal, for a run whose processes wait and nobody knows on what.

``$CONFORMANCE_STACKS_SIGNAL`` names a signal (``USR2``); a process that calls ``dump_stacks_on_signal``
then writes all its threads' stacks to its stderr when it gets that signal (``faulthandler``), and goes
on. The suite's workers and the pre-lowering's processes call it; ``.ci/gpu/states.sh`` sends the signal
(``STACKS_AT``). Unset: nothing is registered and the signal keeps its default action.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Mapping

import settings

STACKS_SIGNAL_ENV = settings.STACKS_SIGNAL.name


def dump_stacks_on_signal(env: Mapping[str, str] = os.environ) -> signal.Signals | None:
    """Register the stack dump for the signal ``$CONFORMANCE_STACKS_SIGNAL`` names; the signal, or None
    (unset, or not a signal's name)."""
    name = env.get(STACKS_SIGNAL_ENV, "").strip().upper()
    if not name:
        return None
    try:
        sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except KeyError:
        return None
    faulthandler.register(sig, all_threads=True, chain=False)
    return sig
