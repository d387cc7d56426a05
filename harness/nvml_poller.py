"""Polling the PCIe byte counters: ``CounterPoller`` reads ``(tx, rx)`` every ``POLL_PERIOD_S`` on a
background thread, bracketed by reads in the caller's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from harness.gpu_state import describe_error
from harness.nvml_counters import CounterSample

POLL_PERIOD_S = 1e-3


class CounterPoller:
    """Reads ``read() -> (tx, rx)`` every ``period_s`` on a background thread.

    The first and last samples are taken in the caller's thread (in ``start`` and ``stop``), so the
    window is exactly bracketed and only one thread ever calls ``read`` at a time.
    """

    def __init__(
        self,
        read: Callable[[], tuple[int, int]],
        period_s: float = POLL_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._period = period_s
        self._clock = clock
        self._samples: list[CounterSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def _sample(self) -> None:
        tx, rx = self._read()
        self._samples.append(CounterSample(self._clock(), int(tx), int(rx)))

    def start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="nvml-pcie-poller", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = self._clock()
        while True:
            deadline += self._period
            # Sleep to the next deadline, not a fixed period, so the call's own cost does not add up.
            if self._stop.wait(max(0.0, deadline - self._clock())):
                return
            try:
                self._sample()
            except Exception as exc:
                self.error = f"counter read failed while polling: {describe_error(exc)}"
                return

    def samples(self) -> list[CounterSample]:
        return list(self._samples)

    def stop(self) -> list[CounterSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is None:
            self._sample()
        return self.samples()
