"""The pre-lowering's jobs: a backend that caches each method apart (protocol ``caches_methods``) gets a
program of several methods as a job per method, lowered exactly as the chapters lower it whole; any other
backend gets whole programs. And, for the reference, the claim itself: methods lowered apart, in other
processes, leave the whole program nothing to compile."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.models import get_model
from conformance.protocol import caches_methods
from conformance.suite import prelower

ROOT = Path(__file__).resolve().parents[2]


def test_caches_methods_is_true_only_where_a_backend_says_so_with_true() -> None:
    class Says:
        caches_methods = True

    class SaysSo:
        caches_methods = "yes"  # not a bool: a hint read wrongly would split for a backend that cannot

    assert caches_methods(Says())
    assert not caches_methods(SaysSo())
    assert not caches_methods(object())


def test_a_program_of_several_methods_is_a_job_per_method_only_where_the_backend_caches_methods() -> None:
    tasks = prelower.prelower_tasks(["cpu"], ["asr", "add"], ["float32"])
    assert prelower.prelower_jobs(tasks, split=False) == [
        ("asr", "float32", "cpu", ""),
        ("add", "float32", "cpu", ""),
    ]
    assert prelower.prelower_jobs(tasks, split=True) == [
        ("asr", "float32", "cpu", "encoder"),
        ("asr", "float32", "cpu", "decoder"),
        ("add", "float32", "cpu", ""),  # one method: the program is the job
    ]
    whole = prelower.prelower_tasks(["cuda", "cpu"])
    split = prelower.prelower_jobs(whole, split=True)
    several = [m for m, _, _ in whole if m in prelower.ZOO and len(prelower.ZOO[m].methods) > 1]
    assert several
    assert len(split) == len(whole) + len(several)
    assert {(m, d, dev) for m, d, dev, _ in split} == set(whole)  # nothing lost, nothing added
    assert all(not method for m, *_, method in split if m.startswith(prelower.VARIANT_PREFIX))
    assert split[0][3]
    assert not split[-1][3]


class _Recorder:
    """A backend through the protocol that notes what each ``lower`` got."""

    name, version, caches_methods = "recorder", "1", True

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def lower(self, methods: dict[str, Any], *, device: str) -> bytes:
        self.calls.append(methods)
        return b"program"


def test_a_method_job_lowers_that_method_as_the_whole_program_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(prelower, "load_backend", lambda spec: recorder)
    _, size, error = prelower._lower_one("any:BACKEND", "asr", "float32", "cpu", "decoder")
    assert (size, error) == (len(b"program"), "")
    (methods,) = recorder.calls
    assert list(methods) == ["decoder"]
    module, inputs, dynamic_shapes = methods["decoder"]
    entry = get_model("asr")
    eager_module, eager_inputs = entry.build(torch.float32, torch.device("cpu"))["decoder"]
    assert type(module) is type(eager_module)
    assert [t.shape for t in inputs] == [t.shape for t in eager_inputs]
    assert all(torch.equal(a, b) for a, b in zip(inputs, eager_inputs, strict=True))
    assert repr(dynamic_shapes) == repr(entry.dynamic_shapes_for("decoder"))  # Dim compares by identity
    _seconds, size, error = prelower._lower_one("any:BACKEND", "asr", "float32", "cpu", "nope")
    assert size == 0
    assert "ValueError" in error
    assert "'method'" in error
    assert "nope" in error


class _Pool:
    """A pool that runs nothing: every job "lowers" at once, the ``failing`` ones with an error."""

    def __init__(self, failing: set[tuple[str, ...]]) -> None:
        self.failing = failing
        self.jobs: list[tuple[str, ...]] = []

    def __call__(self, **kwargs: object) -> _Pool:
        return self

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, fn: object, spec: str, *job: str) -> Future[tuple]:
        self.jobs.append(job)
        future: Future[tuple] = Future()
        future.set_result((0.5, 1024, "RuntimeError: no" if job in self.failing else ""))
        return future


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[_Recorder]:
    backend = _Recorder()
    monkeypatch.setattr(prelower, "load_backend", lambda spec: backend)
    return backend


def _lower_all(pool: _Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(prelower, "ProcessPoolExecutor", pool)
    done = tmp_path / "stamp.done"
    tasks = prelower.prelower_tasks(["cpu"], ["asr", "add"], ["float32"])
    prelower._lower_all("any:BACKEND", tasks, 2, "cpu", done)
    return done


def test_the_table_has_a_row_per_method_and_the_summary_counts_programs(
    recorder: _Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = _Pool(set())
    done = _lower_all(pool, tmp_path, monkeypatch)
    assert pool.jobs == [
        ("asr", "float32", "cpu", "encoder"),
        ("asr", "float32", "cpu", "decoder"),
        ("add", "float32", "cpu", ""),
    ]
    out = capsys.readouterr().out
    assert "  asr.encoder      cpu  float32       0.5 s" in out
    assert "  add              cpu  float32       0.5 s" in out
    assert "prelower: 2 lowered, 0 failed, 0 s wall, 3 compiles (a process per method)" in out
    assert done.read_text().startswith("2 programs for cpu")


def test_a_failed_method_fails_its_program_and_leaves_no_stamp(
    recorder: _Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done = _lower_all(_Pool({("asr", "float32", "cpu", "decoder")}), tmp_path, monkeypatch)
    out = capsys.readouterr().out
    assert "prelower: 1 lowered, 1 failed" in out
    assert "  asr.decoder      cpu  float32       0.5 s     0.00 MiB  RuntimeError: no" in out
    assert not done.exists()


def test_a_backend_without_the_hint_gets_whole_programs(
    recorder: _Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_Recorder, "caches_methods", False)
    pool = _Pool(set())
    _lower_all(pool, tmp_path, monkeypatch)
    assert pool.jobs == [("asr", "float32", "cpu", ""), ("add", "float32", "cpu", "")]
    assert "prelower: 2 lowered, 0 failed, 0 s wall\n" in capsys.readouterr().out


@pytest.mark.proof
def test_the_reference_lowers_nothing_again_for_methods_lowered_apart_in_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's ``caches_methods`` claim, on its real compiles: each method of ``asr`` lowered by a
    pre-lowering job in a process of its own, the whole program's lowering traces and compiles nothing."""
    monkeypatch.setenv("CONFORMANCE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    job = (
        "from conformance.suite.prelower import _lower_one; "
        "print(_lower_one('reference_impl:BACKEND', 'asr', 'float32', 'cpu', {!r}))"
    )
    children = [
        subprocess.Popen([sys.executable, "-c", job.format(m)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for m in ("encoder", "decoder")
    ]
    for child in children:
        out, _ = child.communicate(timeout=600)
        assert child.returncode == 0, out
        assert out.rstrip().endswith("'')"), out  # no error

    from conformance.common import programs
    from harness.backend_loader import load_backend
    from reference_impl.lowering import preprocess

    monkeypatch.setattr(programs, "_LOWERED", {})  # this process's own memo: not what is tested

    traced: list[str] = []
    real = preprocess._trace_and_compile

    def spy(source: Any, store: Any) -> Any:
        traced.append(source.name)
        return real(source, store)

    monkeypatch.setattr(preprocess, "_trace_and_compile", spy)
    program = programs.lowered(load_backend("reference_impl:BACKEND"), "asr", torch.float32, "cpu").program
    assert program
    assert traced == []


def _double(x: int) -> int:
    return 2 * x


def test_the_pools_processes_are_killed_once_its_jobs_are_done() -> None:
    """Left to shut down, idle compile processes all exit at once (an interpreter with torch and a CUDA
    context each, a core each). Ended one at a time, each dies of its own SIGKILL: none of the executor's
    SIGTERM, which ends all the others at once when the first is gone. The pool's shutdown still returns."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert sorted(pool.map(_double, [1, 2, 3])) == [2, 4, 6]
        processes = list(pool._processes.values())
        prelower.end_pool(pool)
    assert [p.exitcode for p in processes] == [-9, -9]
    prelower.end_pool(_Pool(set()))  # a pool without the table: nothing to kill, no error
