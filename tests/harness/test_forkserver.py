"""harness/forkserver.py: xdist's workers forked from one warm interpreter, and every way back to a cold one.

The real thing throughout: a server process, the client as xdist starts it, and pytest-xdist sessions in
subprocesses. The server imports only a standard-library module here (``$CONFORMANCE_WARM_IMPORTS``), so
each session costs what any small xdist session costs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import settings
from harness import forkserver
from harness.forkserver import Request, refusal, summary_words

ROOT = Path(__file__).resolve().parents[2]
#: A module nothing here imports: a worker that has it at collection was forked from the server.
WARM = "email.mime.text"


def test_the_socket_variable_is_the_settings_one() -> None:
    assert settings.FORKSERVER.name == forkserver.SOCKET_ENV  # the client cannot import settings


def _request(env: dict[str, str], cwd: str = "/w", argv: list[str] | None = None) -> Request:
    return Request(argv or ["-u", "-c", "pass"], cwd, env, [])


def test_a_client_unlike_the_server_is_refused_naming_what_differs() -> None:
    server = {"PATH": "/bin", "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "2"}
    # what is read after the imports may differ: pytest's keys, the project's settings, torch's threads
    later = {"PYTEST_VERSION": "9", "CONFORMANCE_RUN_ID": "r", "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}
    assert refusal(server, "/w", _request({**server, **later})) is None
    why = refusal(server, "/w", _request({"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "TORCH_X": "1"}))
    assert why == "environment differs in PATH, TORCHINDUCTOR_COMPILE_THREADS, TORCH_X"
    assert (
        refusal(server, "/w", _request(server, cwd="/elsewhere"))
        == "directory /elsewhere is not the server's /w"
    )
    assert "not xdist's" in str(refusal(server, "/w", _request(server, argv=["script.py"])))


_HAZARDS = """
import sys, threading
from pathlib import Path
from harness.forkserver import fork_hazard
maps = Path(sys.argv[1])
maps.write_text("7f00-7f01 r-xp 0 0:0 1 /usr/lib/libc.so.6\\n")
print(fork_hazard(maps))  # no CUDA driver loaded: nothing can have initialised it
stop = threading.Event()
threading.Thread(target=stop.wait).start()
print(fork_hazard(maps))
stop.set()
"""


def test_a_thread_makes_forking_unsafe(tmp_path: Path) -> None:
    """In an interpreter of its own: a test worker has threads of its own. (CUDA's half needs a GPU:
    examples/runs/2026-11-29-forked-workers-H200/probe.txt.)"""
    cmd = [sys.executable, "-c", _HAZARDS, str(tmp_path / "maps")]
    done = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.stdout.splitlines() == ["None", "2 Python threads"], done.stderr


def test_the_phase_table_words(tmp_path: Path) -> None:
    log = tmp_path / "conformance.forkserver.log"
    assert summary_words(log) is None  # no server ran
    log.write_text(
        "forkserver: imported 9 modules in 1.04 s (epoch 1.000 to 2.040)\n"
        'forkserver summary {"forked": 15, "refused": 0}\n'
    )
    assert summary_words(log) == "15 workers forked from one warm interpreter (its imports 1.0 s)"
    text = log.read_text() + "forkserver: first worker forked at epoch 2.050\n"
    assert forkserver.import_span(text) == forkserver.ImportSpan(9, 1.04, 1.0, 2.04)
    assert forkserver.first_fork_at(text) == 2.05
    older = "forkserver: imported 9 modules in 1.04 s\n"  # a log from before the epochs were kept
    assert forkserver.import_span(older) == forkserver.ImportSpan(9, 1.04, None, None)
    assert forkserver.first_fork_at(older) is None
    log.write_text('forkserver summary {"forked": 1, "refused": 2}\n')
    assert summary_words(log) == (
        "1 worker forked from one warm interpreter, 2 started cold (conformance.forkserver.log says why)"
    )


# -- real xdist sessions ---------------------------------------------------------------------------------

#: The phase table's words for a real server that forked both workers of a session.
_TWO_FORKED = r"2 workers forked from one warm interpreter \(its imports [\d.]+ s\)"

_PROBE = f"""
import os, sys
from pathlib import Path

def _parent_args(pid):
    return Path(f"/proc/{{pid}}/cmdline").read_bytes().split(b"\\0")

def test_where_it_came_from():
    forked = b"--serve" in _parent_args(os.getppid())
    Path(os.environ["PROBE_OUT"], os.environ["PYTEST_XDIST_WORKER"]).write_text(
        f"{{forked}} {{'{WARM}' in sys.modules}} {{sys.argv}} {{os.getpgrp() == os.getpid()}}"
    )
"""


def _session_env(tmp_path: Path, **env: str) -> dict[str, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        settings.WARM_IMPORTS.name: WARM,
        "PROBE_OUT": str(out),
        **env,
    }
    full_env.pop("PYTEST_XDIST_WORKER", None)
    return full_env


def _session(tmp_path: Path, *args: str, conftest: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(_PROBE)
    (tmp_path / "conftest.py").write_text(textwrap.dedent(conftest))
    full_env = _session_env(tmp_path, **env)
    cmd = [sys.executable, "-m", "pytest", "-p", "harness.forkserver", "-n", "2", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*cmd, "-q", "-W", "error", *args, "test_probe.py"],
        cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _probes(tmp_path: Path) -> list[str]:
    return sorted(p.read_text() for p in (tmp_path / "out").iterdir())


def _log(tmp_path: Path) -> Path:
    return tmp_path / "r.forkserver.log"


def _with_log(tmp_path: Path) -> list[str]:
    """A results path beside which the server writes its output (the plugin's option, without the plugin)."""
    (tmp_path / "conftest_opt.py").write_text(
        "def pytest_addoption(parser):\n    parser.addoption('--results-json', dest='results_json')\n"
    )
    return ["-p", "conftest_opt", f"--results-json={tmp_path / 'r.json'}"]


def test_workers_are_forked_from_the_server_with_its_imports(tmp_path: Path) -> None:
    done = _session(
        tmp_path, *_with_log(tmp_path), "-k", "where", "--dist", "each", PYTHONPATH=f"{ROOT}:{tmp_path}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    probes = _probes(tmp_path)
    assert len(probes) == 2
    for probe in probes:  # the server's child, with what it imported, as `python -c` has it, its own group
        assert probe == "True True ['-c'] True"
    log = _log(tmp_path).read_text()
    assert log.count("imported") == 1  # one server, not one per worker
    assert re.fullmatch(_TWO_FORKED, summary_words(_log(tmp_path)) or "")


def test_a_worker_the_server_refuses_starts_cold_and_says_why(tmp_path: Path) -> None:
    changed = """
    import os
    def pytest_configure(config):
        os.environ["SET_AFTER_THE_SERVER_STARTED"] = "1"  # nothing a server could have imported under
    """
    done = _session(
        tmp_path, *_with_log(tmp_path), "--dist", "each", conftest=changed, PYTHONPATH=f"{ROOT}:{tmp_path}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(p.startswith("False False") for p in _probes(tmp_path))  # xdist's own interpreters
    assert (
        "refused a worker: environment differs in SET_AFTER_THE_SERVER_STARTED" in _log(tmp_path).read_text()
    )
    assert re.fullmatch(
        r"0 workers forked from one warm interpreter \(its imports [\d.]+ s\), 2 started cold "
        r"\(r\.forkserver\.log says why\)",
        summary_words(_log(tmp_path)) or "",
    )


def test_turned_off_no_server_starts(tmp_path: Path) -> None:
    done = _session(
        tmp_path, *_with_log(tmp_path), "--dist", "each",
        PYTHONPATH=f"{ROOT}:{tmp_path}", **{settings.FORK_WORKERS.name: "0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(p.startswith("False False") for p in _probes(tmp_path))
    assert not _log(tmp_path).exists()


def test_a_controller_given_a_server_forks_from_it_and_starts_none(tmp_path: Path) -> None:
    """As the front door runs the shared phase (runner/forking.py): its server, started first."""
    path = tmp_path / "given" / "socket"
    path.parent.mkdir()
    given = {forkserver.SOCKET_ENV: str(path), "PYTHONPATH": f"{ROOT}:{tmp_path}"}
    with _serving(path, _session_env(tmp_path, **given), tmp_path / "given.log", cwd=tmp_path) as log:
        done = _session(tmp_path, *_with_log(tmp_path), "--dist", "each", **given)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(p.startswith("True True") for p in _probes(tmp_path)), (_probes(tmp_path), log.read_text())
    assert re.fullmatch(_TWO_FORKED, summary_words(log) or "")
    assert not _log(tmp_path).exists()  # the controller started no server of its own


@pytest.mark.proof
@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_worker_that_dies_is_reported_as_a_cold_one_is(tmp_path: Path, fork: str) -> None:
    (tmp_path / "test_dies.py").write_text("import os\ndef test_dies():\n    os._exit(3)\n")
    done = _session(tmp_path, "test_dies.py", "--max-worker-restart=0", **{settings.FORK_WORKERS.name: fork})
    assert done.returncode == 1
    assert "crashed while running 'test_dies.py::test_dies'" in done.stdout, done.stdout


# -- the client against a server, without pytest ---------------------------------------------------------


def _client_env(path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        settings.WARM_IMPORTS.name: "",
        forkserver.SOCKET_ENV: str(path),
    }


@contextlib.contextmanager
def _serving(path: Path, env: dict[str, str], log: Path, cwd: Path | None = None) -> Iterator[Path]:
    """A server at ``path`` with ``env`` in ``cwd`` (default: the socket's folder), ready (its imports
    done); stopped afterwards. Yields its output."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness.forkserver", "--serve", str(path)],
            env=env, cwd=cwd or path.parent, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while "imported" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield log
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    """A server (importing nothing) and the environment its clients need; stopped afterwards."""
    path = tmp_path / "socket"
    with _serving(path, _client_env(path), tmp_path / "server.log"):
        yield path


def _client(server: Path, code: str) -> subprocess.Popen[str]:
    env = _client_env(server)
    command = [*forkserver.client_command().split(), "-u", "-c", code]
    return subprocess.Popen(
        command, env=env, cwd=server.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _child_of(server_pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == server_pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _pid_line(client: subprocess.Popen[str]) -> int:
    assert client.stdout is not None
    return int(client.stdout.readline())


def test_the_client_exits_as_its_child_did(server: Path) -> None:
    client = _client(server, "import os, sys; print(os.getpid()); sys.exit(7)")
    child = _pid_line(client)
    assert child != client.pid
    assert client.wait(timeout=30) == 7


def test_a_signal_to_the_client_reaches_its_child(server: Path) -> None:
    client = _client(server, "import os, time; print(os.getpid()); time.sleep(60)")
    child = _pid_line(client)
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == -signal.SIGTERM  # ended as its child did: by the signal
    _gone(child)


_COUNTS_SIGTERM = """
import os, signal, time
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
print(os.getpid(), flush=True)
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.5)  # a second one would come now
print(len(got), flush=True)
"""


def test_a_signal_to_the_whole_group_reaches_the_child_once(server: Path) -> None:
    """As a CI system's cancel or a terminal's Ctrl-C, to the run's process group: a worker started cold
    gets it once; a forked one gets it from its client, once too, not from the group as well."""
    env = _client_env(server)
    command = [*forkserver.client_command().split(), "-u", "-c", _COUNTS_SIGTERM]
    client = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    _pid_line(client)
    os.killpg(client.pid, signal.SIGTERM)  # the client's group: a session of its own, not this test's
    assert client.stdout is not None
    assert client.stdout.readline().strip() == "1"
    assert client.wait(timeout=30) == 0


def test_a_killed_client_takes_its_child_with_it(server: Path) -> None:
    client = _client(server, "import os, time; print(os.getpid()); time.sleep(60)")
    child = _pid_line(client)
    client.kill()
    client.wait(timeout=30)
    _gone(child)


def test_without_a_server_the_client_is_the_plain_interpreter(tmp_path: Path) -> None:
    missing = tmp_path / "never-started" / "socket"
    env = {**os.environ, forkserver.SOCKET_ENV: str(missing)}
    started = time.monotonic()
    code = "import os, sys; print(os.getpid()); sys.exit(5)"
    command = [*forkserver.client_command().split(), "-u", "-c", code]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 5
    assert time.monotonic() - started < forkserver.CONNECT_S  # no wait for a server never started


def _gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", f"pid {pid} lives on"
