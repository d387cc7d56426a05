"""The pre-lowering's stamp: a warm run skips exporting every model again, and any change to what the
programs depend on (the backend's files, the task list) makes it lower again."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from conformance.suite import prelower

TASKS = [("add", "float32", "cpu")]


@pytest.fixture
def fake_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A backend package of its own in ``tmp_path`` (never lowered here: the stamp is all that is read)."""
    package = tmp_path / "stampbackend"
    package.mkdir()
    (package / "__init__.py").write_text("class B:\n    name, version = 'stamp', '1'\nBACKEND = B()\n")
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


def test_a_passed_preflight_is_stamped_and_not_repeated(
    fake_backend: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (fake_backend / "__init__.py").write_text(
        "class B:\n"
        "    name, version, calls = 'stamp', '1', 0\n"
        "    def preflight(self, device):\n"
        "        B.calls += 1\n"
        "        return True, 'toolchain OK'\n"
        "BACKEND = B()\n"
    )
    spec = "stampbackend:BACKEND"
    assert prelower.main(["--preflight-only", "--device", "cpu", "--backend", spec]) == 0
    assert prelower.main(["--preflight-only", "--device", "cpu", "--backend", spec]) == 0
    import stampbackend  # the module the two runs loaded

    assert stampbackend.B.calls == 1
    out = capsys.readouterr().out
    assert "preflight [cpu]: toolchain OK" in out
    assert "as an earlier run found" in out
    assert prelower.main(["--preflight-only", "--device", "cpu", "--backend", spec, "--force"]) == 0
    assert stampbackend.B.calls == 2


def test_a_failed_preflight_is_not_stamped(fake_backend: Path) -> None:
    (fake_backend / "__init__.py").write_text(
        "class B:\n    name, version = 'stamp', '1'\n"
        "    def preflight(self, device):\n        return False, 'compiler broken'\nBACKEND = B()\n"
    )
    args = ["--preflight-only", "--device", "cpu", "--backend", "stampbackend:BACKEND"]
    assert prelower.main(args) == 3
    assert prelower.main(args) == 3  # asked again: a failure is never remembered


def test_is_done_asks_about_the_stamp_a_run_would_leave_and_lowers_nothing(
    fake_backend: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = "stampbackend:BACKEND"
    args = ["--device", "cpu", "--model", "add", "--dtype", "float32", "--backend", spec]
    assert prelower.prelower_tasks(["cpu"], ["add"], ["float32"]) == TASKS
    assert prelower.main([*args, "--is-done"]) == 1  # a fresh cache: not done
    done = prelower.stamp_path(prelower.sources_stamp(spec, TASKS))
    assert capsys.readouterr().out == f"prelower: not done, 1 programs for cpu (no stamp: {done})\n"
    assert not done.exists()  # asking leaves nothing behind
    done.parent.mkdir(parents=True)
    done.write_text("1 program\n")
    assert prelower.main([*args, "--is-done"]) == 0
    assert capsys.readouterr().out == f"prelower: done, 1 programs for cpu (stamp {done})\n"
    assert prelower.main([*args, "--is-done", "--force"]) == 1  # a forced run would lower anyway
    assert prelower.main([*args, "--is-done", "--dtype", "float16"]) == 1  # other tasks, another stamp
    assert prelower.main(args) == 0  # and the run itself finds the same stamp
    assert "prelower: skipped, 1 programs for cpu" in capsys.readouterr().out


def test_the_default_tasks_are_the_zoo_then_the_metamorphic_programs() -> None:
    tasks = prelower.prelower_tasks(["cuda", "cpu"])
    zoo = [t for t in tasks if not t[0].startswith(prelower.VARIANT_PREFIX)]
    assert len(zoo) == len(prelower.ZOO) * 2 * len(prelower.DTYPES_BY_NAME)
    assert tasks[: len(zoo)] == zoo  # the variants after the zoo, float32 only
    assert {d for m, d, _ in tasks[len(zoo) :]} == {"float32"}
    assert prelower.prelower_tasks(["cpu"], ["add", "asr"])[0][0] == "asr"  # the biggest program first


class _Pool:
    """A pool that lowers at once and notes, at its shutdown, what the pre-lowering had written by then."""

    def __init__(self, done: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.done, self.capsys = done, capsys
        self.seen_at_shutdown: dict[str, bool] = {}

    def __call__(self, **kwargs: object) -> _Pool:
        return self

    def __enter__(self) -> _Pool:
        return self

    def submit(self, fn: object, spec: str, *job: str) -> Future[tuple]:
        future: Future[tuple] = Future()
        future.set_result((0.1, 1024, ""))
        return future

    def __exit__(self, *exc: object) -> None:
        out = self.capsys.readouterr().out
        self.seen_at_shutdown = {
            "stamp": self.done.exists(),
            "summary": "prelower: 1 lowered, 0 failed" in out,
        }


def test_the_stamp_is_written_before_the_pools_shutdown(
    fake_backend: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front door stops a pre-lowering still running when the cases end; stopped while its pool's
    processes exit, it must have left its stamp and summary already (else the warm run lowers again)."""
    spec = "stampbackend:BACKEND"
    done = prelower.stamp_path(prelower.sources_stamp(spec, TASKS))
    pool = _Pool(done, capsys)
    monkeypatch.setattr(prelower, "ProcessPoolExecutor", pool)
    args = ["--device", "cpu", "--model", "add", "--dtype", "float32", "--backend", spec, "--jobs", "1"]
    assert prelower.main(args) == 0
    assert pool.seen_at_shutdown == {"stamp": True, "summary": True}
