"""What the phases of a run did, noted as they go: whatever stops them (a signal, the deadline), the
report after them reads the shards started, each pytest phase's exit code and the phase table so far."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.phases import Phase, case_window_words
from harness.run_control import EXIT_PREFLIGHT
from runner.busy_sampler import BusySampler
from runner.prelowering import Prelowering


@dataclass
class RunRecord:
    """When each step of a run started and how long it took (the table at its end, harness/phases.py),
    and what the phases left for the report."""

    #: ``time.perf_counter()`` when the run began: the phases' start times count from here.
    origin: float = field(default_factory=time.perf_counter)
    #: Epoch seconds less ``time.perf_counter()``: a shard's timeline (epoch) against the phases' clock.
    epoch_offset: float = field(default_factory=lambda: time.time() - time.perf_counter())
    phases: list[Phase] = field(default_factory=list)
    #: Each pytest phase's exit code, in order (0: it passed).
    exit_codes: list[int] = field(default_factory=list)
    #: The shards (result file names) of the phases started or about to start.
    shards: list[str] = field(default_factory=list)
    #: The background pre-lowering while it runs.
    prelowering: Prelowering | None = None
    #: The toolchain preflight's exit code, once it ran (None: not run by the front door).
    toolchain_code: int | None = None
    #: The front door's preflight runs now, beside the cases (it stops the run if it fails).
    toolchain_checking: bool = False
    #: Runnable tasks sampled through the run (a GPU run's): each step's row says how busy the cores were.
    busy: BusySampler | None = None

    def add(
        self, name: str, start: float, detail: str, end: float | None = None, shard: Path | None = None
    ) -> None:
        """A step that began at ``start`` (``time.perf_counter()``) and ended at ``end`` (default: now);
        with ``busy``, its detail says how many tasks were runnable meanwhile; with ``shard`` (a pytest
        phase's result file), when its cases ran within it."""
        end = time.perf_counter() if end is None else end
        words = [detail] if detail else []
        if shard is not None:
            window = case_window_words(shard, start + self.epoch_offset, end + self.epoch_offset)
            words += [window] if window else []
        busy = self.busy.summary(start, end) if self.busy is not None else None
        words += [busy.detail] if busy is not None else []
        self.phases.append(Phase(name, end - start, "; ".join(words), start - self.origin))

    def timed(self, name: str, step: Callable[[], str], shard: Path | None = None) -> None:
        """Run ``step`` (it returns the table's detail) and note it."""
        start = time.perf_counter()
        self.add(name, start, step(), shard=shard)

    @property
    def toolchain_ok(self) -> bool | None:
        """The preflight's verdict, once it ran (None: not run by the front door)."""
        return None if self.toolchain_code is None else self.toolchain_code == 0

    @property
    def toolchain_known(self) -> bool:
        """Whether a phase skips its own preflight: the front door's check passed or runs beside it (and
        stops the run if it fails), or a phase ended otherwise than with the preflight's exit code (then
        every phase says why itself)."""
        if self.toolchain_ok is True or self.toolchain_checking:
            return True
        return any(code != EXIT_PREFLIGHT for code in self.exit_codes)

    def phase_flags(self) -> list[str]:
        """The table for ``python -m harness.phases``, in the order the steps ended."""
        return [f"--phase={phase.to_flag()}" for phase in self.phases]
