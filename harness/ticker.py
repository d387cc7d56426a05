"""A step repeated in a daemon thread: what the run's sampler and progress lines share
(``runner/busy_sampler``, ``progress``). Standard library only."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Ticker:
    """Calls ``step`` every ``interval_s`` in a daemon thread named ``name``, from ``start`` until ``stop``
    or until ``step`` returns False (nothing to do on this machine); ``wait_first``: the first step after
    one interval, not at once. Once ``stop`` returned, no step runs."""

    def __init__(
        self, name: str, interval_s: float, step: Callable[[], bool], *, wait_first: bool = False
    ) -> None:
        self.name, self.interval_s, self.step, self.wait_first = name, interval_s, step, wait_first
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop, and wait (5 s at most) for a step under way to end."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        if self.wait_first and self._stopped.wait(self.interval_s):
            return
        while not self._stopped.is_set() and self.step():
            self._stopped.wait(self.interval_s)
