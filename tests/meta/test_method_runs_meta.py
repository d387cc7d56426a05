"""Meta-tests of ``conformance.common.method_runs``' profiled copies: a profile that lost a device→host copy
is taken again, and a backend that copies nothing still fails ``*/d2h-copy`` after every retry."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from conformance.common import method_runs as mr

DTOH = "Memcpy DtoH (Device -> Pinned)"
HTOD = "Memcpy HtoD (Pinned -> Device)"
CALL = "execute(llm.decode)"


class Profiles:
    """``memcpy_names`` stood in by the profiles given, one per execute; counts the executes."""

    def __init__(self, *profiles: list[str]) -> None:
        self._profiles: Iterator[list[str]] = iter(profiles)
        self.executes = 0

    def __call__(self, fn: object) -> tuple[list[str], int]:
        self.executes += 1
        seen = next(self._profiles)
        return seen, len(seen) + 1  # our own kernel is always seen


def _profiled(monkeypatch: pytest.MonkeyPatch, profiles: Profiles, outputs_copied: bool) -> list[str]:
    monkeypatch.setattr(mr, "memcpy_names", profiles)
    run = SimpleNamespace(handle=None, inputs=[])
    return mr.profiled_copies(SimpleNamespace(execute=None), run, outputs_copied=outputs_copied)


def test_a_lost_copy_is_profiled_again_and_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    profiles = Profiles([HTOD], [HTOD, DTOH])
    with pytest.warns(mr.ProfilerMissedACopy, match="1 of 2 profiles"):
        copies = _profiled(monkeypatch, profiles, outputs_copied=True)
    assert profiles.executes == 2
    assert copies == [HTOD, HTOD, DTOH]
    mr.check_output_copies(mr.PLACEMENT, CALL, copies, keep=False)


def test_a_backend_that_never_copies_fails_after_every_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    profiles = Profiles(*([HTOD] for _ in range(mr.PROFILES_FOR_A_COPY + 1)))
    copies = _profiled(monkeypatch, profiles, outputs_copied=True)
    assert profiles.executes == mr.PROFILES_FOR_A_COPY
    with pytest.raises(AssertionError, match=r"\[device_placement/d2h-copy\].*no 'Memcpy DtoH'"):
        mr.check_output_copies(mr.PLACEMENT, CALL, copies, keep=False)


def test_kept_outputs_are_profiled_once_and_a_copy_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs kept on the device: one profile; no retry could hide a copy it saw."""
    profiles = Profiles([DTOH], [])
    copies = _profiled(monkeypatch, profiles, outputs_copied=False)
    assert profiles.executes == 1
    with pytest.raises(AssertionError, match=r"\[device_placement/no-d2h-copy\]"):
        mr.check_output_copies(mr.PLACEMENT, CALL, copies, keep=True)
