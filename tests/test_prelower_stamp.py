"""The pre-lowering's stamp: a warm run skips exporting every model again, and any change to what the
programs depend on (the backend's files, the task list) makes it lower again."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance import prelower

TASKS = [("add", "float32", "cpu")]


@pytest.fixture
def fake_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A backend package of its own in ``tmp_path`` (never lowered here: the stamp is all that is read)."""
    package = tmp_path / "stampbackend"
    package.mkdir()
    (package / "__init__.py").write_text("BACKEND = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CONFORMANCE_CACHE_DIR", str(tmp_path / "cache"))
    yield package
    sys.modules.pop("stampbackend", None)


def test_the_stamp_changes_with_the_backend_files_and_the_tasks(fake_backend: Path) -> None:
    spec = "stampbackend:BACKEND"
    first = prelower.sources_stamp(spec, TASKS)
    assert prelower.sources_stamp(spec, TASKS) == first
    assert prelower.sources_stamp(spec, [*TASKS, ("add", "float16", "cpu")]) != first
    (fake_backend / "lower.py").write_text("# a changed lowering\n")
    assert prelower.sources_stamp(spec, TASKS) != first


def test_a_stamped_run_is_skipped_and_says_so(fake_backend: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "stampbackend:BACKEND"
    done = prelower.stamp_path(prelower.sources_stamp(spec, TASKS))
    assert done.is_relative_to(fake_backend.parent / "cache")
    done.parent.mkdir(parents=True)
    done.write_text("1 program\n")
    args = ["--device", "cpu", "--model", "add", "--dtype", "float32", "--backend", spec]
    assert prelower.main(args) == 0  # lowering instead would print a table of failures for the fake backend
    out = capsys.readouterr().out
    assert "prelower: skipped, 1 programs for cpu" in out
    assert str(done) in out
