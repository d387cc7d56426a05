"""The shared phase's fork server (``harness/forkserver.py``), started by the front door before anything else.

A controller that starts its own server starts it seconds before its workers: the server's imports (torch's
dynamo and inductor, the zoo's Hugging Face models: 6.8 s on an H200 host beside a starting run) then came
after the workers' start instead of before it, and a warm run on one H200 gained nothing (the cases ran
2.6 s shorter and started 2.6 s later, ``examples/runs/2026-11-29-forked-workers-H200/``). Started here,
beside the arguments' check and the machine's questions, its imports are done by the time the shared
phase's workers start. Its environment is the one the shared phase's controller gets but for what is
decided later (the run id, the GPU pinning, the threads: ``forkserver.RUNTIME_PREFIXES`` and
``RUNTIME_KEYS``), which each child takes from its worker's environment.

A run that pre-lowers (a cold cache) does not use it: beside the fifteen compile processes its imports took
22-29 s, and the workers waited for them (their first case at +18 to +29 s against +6.2 s started cold);
the front door stops it when the pre-lowering starts.

Its output goes to a folder of its own while the run is checked (a failed check leaves ``results/`` as it
was), and to ``results/<shard>.forkserver.log`` once the phase ran.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import settings
from harness import forkserver
from runner import sizing
from runner.console import Console, Started


@dataclass(frozen=True)
class ForkServer:
    """A started server: its process, its folder (socket and output), and the environment a phase that
    uses it adds (the socket's path)."""

    process: Started
    folder: Path

    @property
    def socket(self) -> Path:
        return self.folder / "socket"

    @property
    def output(self) -> Path:
        return self.folder / "forkserver.log"

    @property
    def env(self) -> dict[str, str]:
        return {forkserver.SOCKET_ENV: str(self.socket)}


def server_env() -> dict[str, str]:
    """What the server's environment adds to the run's: what the shared phase's workers have that torch
    reads at import (one inductor compile thread, ``plan.worker_threads``)."""
    return dict(sizing.COMPILE_ENV)


def start_server(console: Console, python: str) -> ForkServer | None:
    """Start the server (``python``: the run's interpreter), unless ``$CONFORMANCE_FORK_WORKERS=0``."""
    if not settings.FORK_WORKERS.get():
        return None
    folder = Path(tempfile.mkdtemp(prefix="conformance-fork-"))
    socket = folder / "socket"
    env = {**server_env(), forkserver.SOCKET_ENV: str(socket)}
    cmd = forkserver.server_command(python, socket)
    return ForkServer(console.start(cmd, env=env, output=folder / "forkserver.log"), folder)


def stop_server(server: ForkServer, keep_as: Path | None) -> str | None:
    """Stop it (``forkserver.stop_server_process``), move its output to ``keep_as`` (None: drop it),
    remove its folder; the phase table's words for what it did (``forkserver.summary_words``)."""
    forkserver.stop_server_process(server.process)
    words = None
    if keep_as is not None and server.output.is_file():
        shutil.move(server.output, keep_as)
        words = forkserver.summary_words(keep_as)
    shutil.rmtree(server.folder, ignore_errors=True)
    return words
