"""The front door's questions to the machine (``run.MachineQuestions``): where the driver lists GPUs, the
CUDA devices and the earlier pre-lowering are asked at once; elsewhere one after the other, the second only
on a GPU machine."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.run_control import FrontDoor
from runner import run
from runner.plan import SuiteRun
from tests.runner.run_phases_fakes import STAMP, FakeBackground, FakeConsole


class _WaitingConsole(FakeConsole):
    """Answers the device count only once the earlier pre-lowering was asked (or after 5 s)."""

    def __init__(self, gpus: int, stamp_asked: threading.Event) -> None:
        super().__init__(gpus)
        self.stamp_asked = stamp_asked
        self.waited_for_the_stamp = False

    def output(self, cmd: Sequence[str]) -> str:
        self.waited_for_the_stamp = self.stamp_asked.wait(5.0)
        return super().output(cmd)


def _questions(tmp_path: Path, console: FakeConsole, *posargs: str) -> run.MachineQuestions:
    suite = SuiteRun(tmp_path, "conformance", ("conformance",), "/venv/bin/python", posargs, True)
    return run.MachineQuestions(console, suite, FrontDoor([], {})).start()  # type: ignore[arg-type]


def _background(monkeypatch: pytest.MonkeyPatch, is_done: int, asked: threading.Event) -> FakeBackground:
    background = FakeBackground(monkeypatch, is_done=is_done)
    ask = background.ask

    def noted(*args: object) -> str | None:
        asked.set()
        return ask(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(run, "earlier_prelowering", noted)
    return background


def test_where_the_driver_lists_gpus_both_are_asked_at_once(tmp_path, monkeypatch) -> None:
    asked = threading.Event()
    background = _background(monkeypatch, 0, asked)
    monkeypatch.setattr(run, "driver_lists_gpus", lambda: True)
    console = _WaitingConsole(1, asked)
    assert _questions(tmp_path, console).answers() == (1, STAMP)
    assert console.waited_for_the_stamp, "the device count was asked only after the stamp"
    assert background.events == ["is-done"]


def test_a_stamp_found_without_a_cuda_device_does_not_count(tmp_path, monkeypatch) -> None:
    """The driver lists a GPU, but this interpreter's torch sees none (a CPU build): a CPU run."""
    asked = threading.Event()
    _background(monkeypatch, 0, asked)
    monkeypatch.setattr(run, "driver_lists_gpus", lambda: True)
    assert _questions(tmp_path, FakeConsole(0)).answers() == (0, None)


@pytest.mark.parametrize("gpus", [0, 1])
def test_without_a_driver_the_stamp_is_asked_after_the_devices_and_only_with_one(
    tmp_path, monkeypatch, gpus: int
) -> None:
    asked = threading.Event()
    background = _background(monkeypatch, 0, asked)
    monkeypatch.setattr(run, "driver_lists_gpus", lambda: False)
    assert _questions(tmp_path, FakeConsole(gpus)).answers() == (gpus, STAMP if gpus else None)
    assert background.events == (["is-done"] if gpus else [])


def test_a_narrowed_run_asks_only_for_the_devices(tmp_path, monkeypatch) -> None:
    asked = threading.Event()
    background = _background(monkeypatch, 0, asked)
    monkeypatch.setattr(run, "driver_lists_gpus", lambda: True)
    assert _questions(tmp_path, FakeConsole(1), "-k", "mm_out").answers() == (1, None)
    assert background.events == []


def test_a_failed_question_is_raised_where_the_answer_is_needed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(run, "driver_lists_gpus", lambda: True)
    FakeBackground(monkeypatch)

    class Broken(FakeConsole):
        def output(self, cmd: Sequence[str]) -> str:
            raise RuntimeError("no interpreter")

    questions = _questions(tmp_path, Broken(1))
    with pytest.raises(RuntimeError, match="no interpreter"):
        questions.answers()


def test_the_driver_lists_gpus_as_a_folder_each(tmp_path: Path) -> None:
    assert not run.driver_lists_gpus(tmp_path / "absent")
    (tmp_path / "gpus").mkdir()
    assert not run.driver_lists_gpus(tmp_path / "gpus")
    (tmp_path / "gpus" / "0000:19:00.0").mkdir()
    assert run.driver_lists_gpus(tmp_path / "gpus")
