"""runner/forking.py: the front door's fork server, started before the run's checks, with real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

import settings
from harness import forkserver
from runner.forking import server_env, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]


class _Console:
    """The part of the run's console that the fork server uses: ``start``, as the noxfile's starts."""

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str], output: Path) -> subprocess.Popen[bytes]:
        with open(output, "wb") as out:
            return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(autouse=True)
def _importing_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv(settings.WARM_IMPORTS.name, "")  # the server, not torch's import, is tested here
    monkeypatch.delenv(settings.FORK_WORKERS.name, raising=False)


def test_a_worker_takes_what_the_front_door_decided_later_and_the_counts_are_kept(tmp_path: Path) -> None:
    server = start_server(_Console(), sys.executable)
    assert server is not None
    # the shared phase's controller's environment: the server's, and what the front door decided after
    later = {settings.RUN_ID.name: "run-1", "OMP_NUM_THREADS": "3"}
    env = {**os.environ, **server_env(), **server.env, **later}
    code = "import os; print(os.environ['OMP_NUM_THREADS'], os.environ['CONFORMANCE_RUN_ID'], os.getppid())"
    client = [*forkserver.client_command().split(), "-u", "-c", code]
    done = subprocess.run(client, env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["3", "run-1", str(server.process.pid)], done.stderr
    kept = tmp_path / "conformance.forkserver.log"
    words = stop_server(server, keep_as=kept) or ""
    assert re.fullmatch(r"1 worker forked from one warm interpreter \(its imports [\d.]+ s\)", words)
    assert kept.is_file()
    assert not server.folder.exists()


def test_a_run_that_never_reached_its_phase_leaves_nothing(tmp_path: Path) -> None:
    server = start_server(_Console(), sys.executable)
    assert server is not None
    assert stop_server(server, keep_as=None) is None
    assert server.process.poll() is not None
    assert not server.folder.exists()
    assert stop_server(server, keep_as=None) is None  # twice: nothing left to do


def test_turned_off_none_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.FORK_WORKERS.name, "0")
    assert start_server(_Console(), sys.executable) is None


def test_a_worker_has_its_own_torch_threads_though_the_server_fixed_them(tmp_path: Path) -> None:
    """The server's imports may ask torch its thread count (fixing it, before the front door sized the
    workers' share): each child takes its worker's ``$OMP_NUM_THREADS`` all the same."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: torch's default is the worker's count, nothing to tell apart")
    (tmp_path / "asks_threads.py").write_text("import torch\nTHREADS = torch.get_num_threads()\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}", settings.WARM_IMPORTS.name: "asks_threads"}
    env.pop("OMP_NUM_THREADS", None)
    server = start_server(_EnvConsole(env), sys.executable)
    assert server is not None
    worker = {**env, **server_env(), **server.env, "OMP_NUM_THREADS": "1"}
    code = "import asks_threads, torch; print(asks_threads.THREADS, torch.get_num_threads())"
    client = [*forkserver.client_command().split(), "-u", "-c", code]
    done = subprocess.run(client, env=worker, capture_output=True, text=True, timeout=120)
    stop_server(server, keep_as=None)
    server_count, worker_count = map(int, done.stdout.split())
    assert server_count > 1, done.stderr  # torch's default, one per core, fixed by the import
    assert worker_count == 1


class _EnvConsole(_Console):
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str], output: Path) -> subprocess.Popen[bytes]:
        with open(output, "wb") as out:
            return subprocess.Popen(cmd, env={**self.env, **env}, stdout=out, stderr=subprocess.STDOUT)
