"""harness/stream_hold.py: the timer process keeps its deadlines (CPU), and on a GPU a held stream waits
until its block ends, or until its time is up even while the waiting call holds the GIL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import torch

import settings
from harness import stream_hold
from harness.stream_hold import _Page

NEEDS_GPU = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"
)


def _word_until(page: _Page, start: float, last: int, limit_s: float = 30.0) -> list[tuple[float, int]]:
    """(seconds since ``start``, the word) at each change of the word, polled every millisecond until it
    reads ``last`` (or ``limit_s`` passed: a timer that is late on a loaded machine is still on time)."""
    seen = [(time.monotonic() - start, page.word.value)]
    while seen[-1][1] != last and time.monotonic() - start < limit_s:
        if page.word.value != seen[-1][1]:
            seen.append((time.monotonic() - start, page.word.value))
        time.sleep(0.001)
    return seen


def test_the_timer_stores_each_target_at_its_time_and_never_goes_back() -> None:
    page = _Page()
    start = time.monotonic()
    page.release_at(start + 0.25, 3)
    page.release_at(start + 0.15, 1)
    page.release_at(start + 0.20, 2)
    page.release(4)  # released early by the host: the timer's later stores of 1-3 must not lower it
    page.release_at(start + 0.30, 5)
    # The timer takes its requests in the order they are due: 1-3 came before 5, and never showed.
    seen = _word_until(page, start, last=5)
    assert [value for _, value in seen] == [4, 5], seen
    assert seen[1][0] >= 0.30, f"target 5 was stored before it was due (0.30 s after the start): {seen}"


def test_the_timer_ends_with_its_owner() -> None:
    page = _Page()
    assert page._timer.stdin is not None
    page._timer.stdin.close()
    assert page._timer.wait(timeout=10) == 0


@pytest.fixture
def front_end(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Holds in the GPU's front end (``$CONFORMANCE_STREAM_HOLDS=front-end``, the default, set explicitly)."""
    monkeypatch.setenv("CONFORMANCE_STREAM_HOLDS", "front-end")
    stream_hold._word.cache_clear()
    yield
    stream_hold._word.cache_clear()


def test_holds_wait_in_the_front_end_unless_the_setting_says_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONFORMANCE_STREAM_HOLDS", raising=False)
    assert settings.STREAM_HOLDS.get() == "front-end"
    monkeypatch.setenv("CONFORMANCE_STREAM_HOLDS", "spin")
    stream_hold._word.cache_clear()
    try:
        assert stream_hold._word() is None
    finally:
        stream_hold._word.cache_clear()


@NEEDS_GPU
@pytest.mark.usefixtures("front_end")
def test_a_held_stream_runs_its_work_once_the_block_ends() -> None:
    stream = torch.cuda.Stream()
    value = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with stream_hold.held(stream, at_most_s=30.0) as how:
        with torch.cuda.stream(stream):
            value.fill_(1.0)
        time.sleep(0.2)
        waited = not stream.query()
    if how == stream_hold.SPIN:
        pytest.skip("this driver cannot hold a stream in its front end: holds spin")
    assert waited, "the work queued after the hold ran while the stream was held"
    stream.synchronize()
    assert value.item() == 1.0


def _run_with_front_end_holds(script: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter whose holds wait in the front end; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**os.environ, "CONFORMANCE_STREAM_HOLDS": "front-end"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


_HELD_WITH_THE_GIL = """
import ctypes, time, torch
from harness import stream_hold
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):  # the kernels loaded first: a first launch may take longer than the hold
    torch.ones(1, device="cuda").add_(1)
torch.cuda.synchronize()
start = time.monotonic()
with stream_hold.held(stream, at_most_s=0.5) as how:
    with torch.cuda.stream(stream):
        torch.ones(1, device="cuda").add_(1)
    # A backend waiting inside C without releasing the GIL: ctypes.PyDLL keeps it for the call.
    code = ctypes.PyDLL("libcuda.so.1").cuStreamSynchronize(ctypes.c_void_p(stream.cuda_stream))
    print(f"{how}|{code}|{time.monotonic() - start:.3f}")
"""


@NEEDS_GPU
def test_a_hold_ends_by_itself_while_the_waiting_call_keeps_the_gil() -> None:
    """A thread of the held process could not end this hold: the timer is a process of its own."""
    done = _run_with_front_end_holds(_HELD_WITH_THE_GIL, timeout_s=60)
    how, code, seconds = done.stdout.strip().splitlines()[-1].split("|")
    if how == stream_hold.SPIN:
        pytest.skip("this driver cannot hold a stream in its front end: holds spin")
    assert code == "0", done.stdout
    assert 0.45 <= float(seconds) <= 10.0, f"the hold of 0.5 s at most ended after {seconds} s"


_PROFILED_AFTER_HOLDS = """
import torch
from conformance.common.method_runs import memcpy_names
from harness import stream_hold
stream = torch.cuda.Stream()
for _ in range(50):  # as a streams_threads case leaves a worker: many holds, the last released just now
    with stream_hold.held(stream, at_most_s=0.025):
        with torch.cuda.stream(stream):
            torch.ones(64, device="cuda").add_(1)
torch.cuda.synchronize()
missed = 0
for _ in range(20):
    device = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
    copies, _ = memcpy_names(device.cpu)  # as the */d2h-copy rules profile a call
    missed += not any("DtoH" in n for n in copies)
print(f"missed {missed} of 20")
"""


@NEEDS_GPU
def test_the_profiler_sees_every_copy_after_front_end_holds() -> None:
    """One cold run with front-end holds had a case whose profiler saw no device-to-host copy that its call
    made, right after a case that held streams on the same worker
    (``examples/runs/2026-11-29-stream-holds-H200/``): the same sequence in one process, twenty copies
    profiled as the ``*/d2h-copy`` rules profile a call, after fifty holds (it passed on two H200s,
    ``examples/runs/2026-11-30-front-end-default-H200/``)."""
    done = _run_with_front_end_holds(_PROFILED_AFTER_HOLDS, timeout_s=120)
    assert done.stdout.strip().splitlines()[-1] == "missed 0 of 20", done.stdout
