"""harness/cuda_sync.py: where the front door asks for it, a process's GPU waits sleep instead of spinning.

The GPU half runs in fresh processes (the flag must precede the CUDA context): torch's context then has
``CU_CTX_SCHED_BLOCKING_SYNC``, and a process not asked keeps CUDA's default. Without a GPU it skips, and
the same test runs on the GPU machine. What it buys was measured there: twelve processes sharing one H100,
each waiting for its results, used 96 CPU seconds in 8 s with CUDA's default and 4 with blocking sync, for
the same work (examples/runs/2026-11-27-blocking-sync/).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import cuda_sync

ROOT = Path(__file__).resolve().parents[2]
_CHILD = """
import torch
from harness import cuda_sync
print(cuda_sync.apply_from_env())
(torch.ones(4, device="cuda") * 2).sum().item()  # the context exists now, with the flags set before
print(cuda_sync.scheduling(0))
"""


def test_nothing_is_set_unless_asked() -> None:
    assert cuda_sync.apply_from_env({}) is None
    assert cuda_sync.apply_from_env({cuda_sync.SYNC_ENV: "default"}) is None


def test_asked_without_a_driver_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_sync, "_DRIVER", "libcuda-that-is-not-there.so.1")
    said = cuda_sync.apply_from_env({cuda_sync.SYNC_ENV: " Blocking "})
    assert said is not None
    assert said.startswith("no CUDA driver")
    assert cuda_sync.scheduling() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)")
@pytest.mark.parametrize(("asked", "scheduling"), [("blocking", 0x04), ("", 0x00)])
def test_a_process_asked_waits_asleep_and_one_not_asked_keeps_cudas_default(
    asked: str, scheduling: int
) -> None:
    env = {**os.environ, cuda_sync.SYNC_ENV: asked}
    command = [sys.executable, "-c", _CHILD]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    said, flags = done.stdout.split("\n")[:2]
    assert int(flags) == scheduling, done.stdout
    if asked:
        assert said.startswith("blocking sync on "), said
