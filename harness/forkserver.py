"""Case workers forked from one interpreter that imported torch ahead (a fork server), not each started cold.

Each of a warm run's 15 case workers spent seconds importing torch's dynamo and inductor, sympy and the
zoo's Hugging Face models, all at once on the same cores (126 of 435 case-seconds in a warm run's profile,
``examples/runs/2026-11-29-warm-tails-H200/4-profile``). A fork server imports them once (a held phase's
list, ``start_gate.warm_list``), then forks a child per worker: each child has them already.

How a worker is made. With this plugin (``-p harness.forkserver``), an xdist controller that will start
workers starts the server first (``pytest_load_initial_conftests``: before its own conftests import
torch), with its own environment, and stops it at its end. xdist starts each worker as ``<python> -u -c
<execnet's bootstrap>``; the plugin puts this file, run as a standard-library script (``client_command``),
in front of those arguments. The client connects to the server (``$CONFORMANCE_FORKSERVER``, a Unix
socket) and hands it its stdin, stdout and stderr, its environment and the read end of a pipe only it
holds; the server forks; the child takes those descriptors, a process group of its own, and runs the
bootstrap as ``python -c`` would (``become``). The client stays as the child's stand-in for xdist: a
signal it gets is passed on, and it exits as the child exited (its code, or its signal). If the client is
killed, the pipe's end tells the child, which kills itself. Where the server cannot be reached, refuses
(an environment unlike the one it imported under: ``refusal``) or is not safe to fork (a second Python
thread, or CUDA started: ``fork_hazard``), the client replaces itself with the plain interpreter, as xdist
would have started it: a worker is never lost, only its head start.

The server's output (``results/<shard>.forkserver.log``) says what it imported, in how long, and why it
refused any worker; its last line holds the counts the phase table shows (``summary_words``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import json
import os
import re
import select
import shlex
import signal
import socket
import struct
import sys
import threading
import time
import types
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

#: The Unix socket of the controller's fork server (``settings.FORKSERVER``'s name; not imported here: the
#: client runs with ``-I -S``, the standard library only).
SOCKET_ENV = "CONFORMANCE_FORKSERVER"
#: Keys a client's environment may have beyond or unlike the server's, which its child then takes: read
#: after the imports, never by them. pytest's own (``PYTEST_VERSION``, set by the controller); the
#: project's settings (read through ``settings`` when used: the run id, the GPU pinning, how a worker
#: waits for its GPU, which the front door decides after it started the server); and the threads for
#: torch's ops, which torch reads once per thread, at its first parallel op or thread count: where an
#: import did that in the server, the child sets its worker's count itself (``become``); and the
#: terminal's size, which curses puts in a controller's environment once something asks it.
RUNTIME_PREFIXES = ("PYTEST_", "CONFORMANCE_")
RUNTIME_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "COLUMNS", "LINES")
#: Seconds a client tries to reach a server whose socket is not bound yet (it binds before importing).
CONNECT_S = 2.0
#: Seconds a server gets to write its counts after SIGTERM before it is killed.
STOP_WAIT_S = 5.0
#: The summary line's prefix in the server's output (``read_summary``).
SUMMARY = "forkserver summary "
#: The server's line on its imports (``serve`` writes it, ``import_span`` reads it): how many, how long,
#: and from when to when in epoch seconds (absent from a log written before they were kept).
_IMPORTED = re.compile(r"imported (\d+) modules in ([\d.]+) s(?: \(epoch ([\d.]+) to ([\d.]+)\))?")
#: The server's line on its first fork (epoch seconds).
_FIRST_FORK = re.compile(r"first worker forked at epoch ([\d.]+)")
_HEADER = struct.Struct("!I")
#: The signals a client passes on to its child (SIGKILL cannot be: the lifeline does that).
_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: The client's descriptors handed over: stdin, stdout, stderr, the read end of its lifeline.
_HANDED = 4


# -- the pytest side: the server started by xdist's controller, its workers through the client --------


#: The server this controller started (``pytest_load_initial_conftests``), stopped at its unconfigure.
_started: dict[str, Any] = {}


def client_command(python: str = sys.executable) -> str:
    """xdist's ``python`` for a worker (``popen//python=…``): this file as a standard-library script."""
    return f"{shlex.quote(python)} -I -S {shlex.quote(str(Path(__file__).resolve()))}"


def log_path(results_json: str | None, folder: Path) -> Path:
    """The server's output: ``results/<shard>.forkserver.log`` beside the phase's result file, else in
    its own folder."""
    if results_json:
        return Path(results_json).with_suffix(".forkserver.log")
    return folder / "forkserver.log"


def pytest_load_initial_conftests(early_config: Any, parser: Any, args: list[str]) -> None:
    """In an xdist controller that will start workers: the server, started before the conftests' imports
    (torch's among them) so that its own import overlaps theirs. Its environment is this process's, the
    one each worker's client will have (``refusal``)."""
    import settings

    namespace = early_config.known_args_namespace
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(namespace, "numprocesses", None):
        return
    if os.environ.get(SOCKET_ENV):  # the front door started one before the run's checks (runner/forking.py)
        _started["given"] = True
        return
    if not settings.FORK_WORKERS.get():
        return
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="conformance-fork-"))
    path = folder / "socket"
    log = log_path(getattr(namespace, "results_json", None), folder)
    os.environ[SOCKET_ENV] = str(path)
    with open(log, "wb") as out:
        command = server_command(sys.executable, path)
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    _started.update(server=server, folder=folder)


def server_command(python: str, path: Path) -> list[str]:
    """The server's command line: ``python`` (the run's interpreter), its socket at ``path``."""
    return [python, "-m", "harness.forkserver", "--serve", str(path)]


def stop_server_process(process: Any, wait_s: float = STOP_WAIT_S) -> None:
    """SIGTERM (it writes its counts and leaves), then SIGKILL after ``wait_s``; nothing if it ended."""
    import subprocess

    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def pytest_xdist_setupnodes(config: Any, specs: list[Any]) -> None:
    """Every local worker xdist starts goes through the client, where there is a server."""
    if not _started:
        return
    for spec in specs:
        if getattr(spec, "popen", False) and not getattr(spec, "python", None):
            spec.python = client_command()


def pytest_unconfigure(config: Any) -> None:
    """The server stopped (its workers have ended) and its socket's folder removed."""
    _started.pop("given", None)
    server = _started.pop("server", None)
    if server is None:
        return
    import shutil

    stop_server_process(server)
    os.environ.pop(SOCKET_ENV, None)
    shutil.rmtree(_started.pop("folder"), ignore_errors=True)


# -- the server -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    """What a client asked for: a child with its descriptors, directory and environment."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    fds: list[int]


def refusal(server_env: Mapping[str, str], server_cwd: str, request: Request) -> str | None:
    """Why a child of this server would not be the process ``request``'s client would start, or None.

    Torch, inductor and OpenMP read parts of the environment when imported: a child whose client's
    environment differs from the one the server imported under (but in what is read later,
    ``RUNTIME_PREFIXES`` and ``RUNTIME_KEYS``) might behave unlike a fresh interpreter, so it is refused,
    naming the keys."""
    keys = set(server_env) | set(request.env)
    differ = sorted(k for k in keys if not _read_later(k) and server_env.get(k) != request.env.get(k))
    if differ:
        return f"environment differs in {', '.join(differ[:8])}{' …' if len(differ) > 8 else ''}"
    if request.cwd != server_cwd:
        return f"directory {request.cwd} is not the server's {server_cwd}"
    if request.argv[:1] not in (["-u"], ["-c"]) or "-c" not in request.argv:
        return f"arguments {request.argv[:3]} are not xdist's '-u -c <bootstrap>'"
    return None


def _read_later(key: str) -> bool:
    return key.startswith(RUNTIME_PREFIXES) or key in RUNTIME_KEYS


def fork_hazard(maps: Path = Path("/proc/self/maps")) -> str | None:
    """Why forking this process is unsafe, or None: a Python thread besides the main one (its locks would
    be copied held), or the CUDA driver initialised (``cuInit``: CUDA does not survive a fork; even
    ``torch.cuda.is_available()`` initialises it, unless NVML answers it, as it does while the server
    imports)."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads"
    try:
        mapped = "libcuda.so" in maps.read_text()
    except OSError:
        mapped = False
    if mapped and _cuda_driver_initialised():
        return "the CUDA driver was initialised (cuInit) by an import"
    return None


def _cuda_driver_initialised() -> bool:
    """Whether this process called ``cuInit``: ``cuDeviceGetCount`` answers CUDA_ERROR_NOT_INITIALIZED (3)
    until then, and initialises nothing itself."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int()
    return driver.cuDeviceGetCount(ctypes.byref(count)) != 3


#: Set while the server imports: ``torch.cuda.is_available()`` then asks NVML, not ``cuInit``.
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def serve(path: str, out: TextIO, modules: Iterable[str]) -> Request | None:
    """Bind ``path``, import ``modules``, then fork a child per acceptable request until SIGTERM or SIGINT.
    Returns in a child only: the request it is to become (``become``); the server itself exits."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)  # clients that come while it imports wait in the backlog
    started, began, server, parent = time.monotonic(), time.time(), os.getpid(), os.getppid()
    # The environment before the imports, which a client's must be; the imports may add to it (inductor
    # sets its cache directory): a child keeps that, as a worker that imported them itself would.
    env, cwd = dict(os.environ), os.getcwd()
    from harness.start_gate import warm_imports

    asks_nvml = _NVML_CHECK not in os.environ
    if asks_nvml:
        os.environ[_NVML_CHECK] = "1"
    failed = warm_imports(modules)
    if asks_nvml:
        del os.environ[_NVML_CHECK]
    unrewritten = imported_plugin_packages()
    gc.collect()
    gc.freeze()  # children share the imported objects' pages instead of copying them as gc touches them
    hazard = fork_hazard()
    took = time.monotonic() - started
    # Epoch seconds too: a run's start-up is read against its shards' timelines (harness/phases.py).
    span = f"epoch {began:.3f} to {began + took:.3f}"
    _log(out, f"imported {len(sys.modules)} modules in {took:.2f} s ({span})", failed=failed)
    if hazard:
        _log(out, f"not forking: {hazard}")
    counts = {"forked": 0, "refused": 0}
    children: dict[int, socket.socket] = {}

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while True:
            ready, _, _ = select.select([listener], [], [], 0.1)
            if ready:
                conn, _ = listener.accept()
                request = _receive(conn)
                reason = hazard or refusal(env, cwd, request)
                if reason:
                    counts["refused"] += 1
                    _log(out, f"refused a worker: {reason}")
                    _reply(conn, {"refused": reason})
                    conn.close()
                    _close(request.fds)
                    continue
                out.flush()
                sys.stderr.flush()
                with warnings.catch_warnings():  # 3.12 warns of torch's native threads; see fork_hazard
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
                if pid == 0:
                    _quiet_rewrite_warnings(request, unrewritten)
                    listener.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    return request
                _close(request.fds)
                children[pid] = conn
                counts["forked"] += 1
                if counts["forked"] == 1:
                    _log(out, f"first worker forked at epoch {time.time():.3f}")
                _reply(conn, {"pid": pid})
            _reap(children)
            if os.getppid() != parent:  # the controller is gone: nobody will ask again
                break
    except SystemExit:
        pass
    finally:
        if os.getpid() == server:  # not in a child, which returned above
            out.write(SUMMARY + json.dumps(counts) + "\n")
            out.flush()
    return None


def imported_plugin_packages() -> list[str]:
    """The top-level modules of pytest plugins' distributions that the imports brought in (``anyio``,
    through ``transformers`` and ``httpx``): pytest rewrites the asserts of every such module it imports,
    and warns of each it finds imported already, as in a forked worker it does."""
    from importlib import metadata

    found = set()
    for dist in metadata.distributions():
        if not any(entry.group == "pytest11" for entry in dist.entry_points):
            continue
        for file in dist.files or ():
            parts = file.parts
            if len(parts) == 1 and parts[0].endswith(".py"):
                found.add(parts[0][:-3])
            elif len(parts) == 2 and parts[1] == "__init__.py":
                found.add(parts[0])
    return sorted(name for name in found if name in sys.modules)


def _quiet_rewrite_warnings(request: Request, modules: Iterable[str]) -> None:
    """Tell the child's pytest (``PYTEST_ADDOPTS``) to ignore its warning that ``modules`` were imported
    before it could rewrite their asserts: theirs are not the suite's, and a worker that imported them in
    a case would have rewritten them quietly."""
    message, category = "Module already imported so cannot be rewritten", "pytest.PytestAssertRewriteWarning"
    filters = [f"-W {shlex.quote(f'ignore:{message}; {name}:{category}')}" for name in modules]
    if filters:
        request.env["PYTEST_ADDOPTS"] = " ".join([request.env.get("PYTEST_ADDOPTS", ""), *filters]).strip()


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each client whose child ended how it ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                _reply(conn, {"status": status})
            conn.close()


def _receive(conn: socket.socket) -> Request:
    conn.settimeout(10.0)
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, _HANDED)
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the client left mid-request")
        body += chunk
    fields = json.loads(body)
    return Request(fields["argv"], fields["cwd"], fields["env"], list(fds))


def _reply(conn: socket.socket, message: dict[str, object]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _log(out: TextIO, line: str, failed: list[str] | None = None) -> None:
    out.write(f"forkserver: {line}\n")
    for failure in failed or ():
        out.write(f"forkserver:   not imported: {failure}\n")
    out.flush()


def _read(log: Path) -> str | None:
    try:
        return log.read_text(errors="replace")
    except OSError:
        return None


def read_summary(log: Path, text: str | None = None) -> dict[str, int] | None:
    """The server's counts (``forked``, ``refused``) from its output (``text``, where read already), or None
    where it wrote none."""
    text = _read(log) if text is None else text
    for line in reversed((text or "").splitlines()):
        if line.startswith(SUMMARY):
            return json.loads(line[len(SUMMARY) :])
    return None


@dataclasses.dataclass(frozen=True)
class ImportSpan:
    """The server's imports, from its output: how many modules, in how many seconds, and when (epoch
    seconds; None in a log written before they were kept)."""

    modules: int
    seconds: float
    began: float | None
    ended: float | None


def import_span(text: str) -> ImportSpan | None:
    """The imports a server's output (``text``) reports, or None where it reports none."""
    found = _IMPORTED.search(text)
    if found is None:
        return None
    began, ended = (None if v is None else float(v) for v in found.group(3, 4))
    return ImportSpan(int(found[1]), float(found[2]), began, ended)


def first_fork_at(text: str) -> float | None:
    """When a server's output says it forked its first worker (epoch seconds), or None."""
    found = _FIRST_FORK.search(text)
    return None if found is None else float(found[1])


def summary_words(log: Path) -> str | None:
    """The phase table's words for a server's counts: ``15 workers forked from one warm interpreter``, how
    long its imports took (the longest step of a warm run's start-up), the refused ones and where to read
    why; None where it wrote no counts."""
    text = _read(log)
    counts = read_summary(log, text)
    if text is None or counts is None:
        return None
    forked, refused = counts.get("forked", 0), counts.get("refused", 0)
    words = f"{forked} worker{'' if forked == 1 else 's'} forked from one warm interpreter"
    span = import_span(text)
    if span is not None:
        words += f" (its imports {span.seconds:.1f} s)"
    return f"{words}, {refused} started cold ({log.name} says why)" if refused else words


# -- the child: becoming the process the client would have started --------------------------------------


def become(request: Request) -> None:
    """In a fresh child: take the client's descriptors and environment, then run its
    ``-c`` code as ``python [-u] [-B] -c CODE`` would, in a new ``__main__``."""
    stdin, stdout, stderr, lifeline = request.fds
    # A group of its own: a signal to the run's group reaches the client, which passes it on, so the child
    # gets it once, as a worker started cold does (in the client's group it got it twice).
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    watch = threading.Thread(
        target=_die_with_client, args=(lifeline,), name="forkserver-lifeline", daemon=True
    )
    watch.start()
    # The rest of its environment is the client's already (``refusal``), with what the imports added.
    for key in [k for k in os.environ if _read_later(k)]:
        del os.environ[key]
    os.environ.update({k: v for k, v in request.env.items() if _read_later(k)})
    # torch's thread count as a fresh worker's would be, where $OMP_NUM_THREADS sets it: the server's
    # imports may have fixed its main thread's count already, without the worker's setting (15 forked
    # workers on 16 cores then ran 16 threads each, and a warm run's cases took 3.4 times as long,
    # examples/runs/2026-11-29-forked-workers-H200/).
    from harness.start_gate import take_threads

    take_threads(os.environ, key="OMP_NUM_THREADS")
    argv = request.argv
    code = argv[argv.index("-c") + 1]
    if "-u" in argv[: argv.index("-c")]:
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    sys.dont_write_bytecode = sys.dont_write_bytecode or "-B" in argv
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.argv = ["-c", *argv[argv.index("-c") + 2 :]]
    if sys.path and sys.path[0] == request.cwd:
        sys.path[0] = ""  # as ``-c`` has it
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    exec(compile(code, "<string>", "exec"), main.__dict__)


def _die_with_client(lifeline: int) -> None:
    """The client holds the only write end: its end (a kill) ends this child too, as a killed xdist worker."""
    while os.read(lifeline, 1):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


# -- the client -----------------------------------------------------------------------------------------


def client(argv: list[str]) -> None:
    """Stand in for the child the server forks (``argv``: the interpreter's arguments xdist gave), or
    become the plain interpreter where there is no child to be had."""
    try:
        conn = _connect(os.environ.get(SOCKET_ENV, ""))
        lifeline, _held = os.pipe()  # its write end stays open for as long as this process lives
        body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(body))], [0, 1, 2, lifeline])
        conn.sendall(body)
        os.close(lifeline)
        reader = conn.makefile("rb")
        reply = json.loads(reader.readline() or b"{}")
    except (OSError, ValueError):
        reply = {}
    pid = reply.get("pid")
    if not isinstance(pid, int):
        os.execv(sys.executable, [sys.executable, *argv])  # as xdist would have started it
    for signum in _PASSED_ON:
        signal.signal(signum, lambda sig, frame: _pass_on(pid, sig))
    try:
        ended = json.loads(reader.readline() or b"{}")
    except (OSError, ValueError):
        ended = {}
    status = ended.get("status")
    if not isinstance(status, int):  # the server is gone: wait for the child by its pid
        while _alive(pid):
            time.sleep(0.1)
        os._exit(255)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # as the child ended: by the same signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _connect(path: str) -> socket.socket:
    if not path or not os.path.isdir(os.path.dirname(path)):  # no server was ever started for it
        raise OSError("no fork server")
    deadline = time.monotonic() + CONNECT_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _pass_on(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def _alive(pid: int) -> bool:
    """``start_gate._alive``'s twin: the client runs as a script of the standard library only, and
    ``-p harness.forkserver`` must not be imported ahead of pytest by a module the server imports."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- entry points ---------------------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    """``python -m harness.forkserver --serve SOCKET``: the server, its output on stdout; anything else
    (this file run as a script): the client, with the interpreter's arguments."""
    if argv[:1] != ["--serve"]:
        client(argv)
        return
    from harness.start_gate import warm_list

    request = serve(argv[1], sys.stdout, warm_list())
    if request is not None:
        become(request)


if __name__ == "__main__":
    main(sys.argv[1:])
