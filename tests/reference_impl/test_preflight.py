"""Toolchain preflight: a working compiler passes; broken ones give a report, never a crash of the caller.

Real compiles: the good-compiler check shares its artifact with ``test_preprocess.py`` through the default
artifact cache; the crashing-wrapper check compiles once with a wrapper kept at a stable path in the cache
directory, so later runs hit the cache and only repeat the (crashing) load.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from reference_impl.artifact_cache import default_cache_dir
from reference_impl.lowering.preflight import KNOWN_GOOD_CXX, _verdict, check_toolchain, main

GOOD_CXX = KNOWN_GOOD_CXX if os.path.exists(KNOWN_GOOD_CXX) else shutil.which(os.environ.get("CXX", "g++"))
needs_compiler = pytest.mark.skipif(GOOD_CXX is None, reason="no C++ compiler for AOTInductor")
HAS_KNOWN_GOOD = os.path.exists(KNOWN_GOOD_CXX)


def _tool_dir() -> Path:
    # Stable across runs (so the wrapper's artifacts stay cached), private to this checkout's cache.
    path = default_cache_dir() / "test-tools"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_script(path: Path, text: str) -> Path:
    if not path.exists() or path.read_text() != text:  # rewriting would change the compiler's identity
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
    return path


def test_a_compiler_that_fails_version_is_reported_up_front() -> None:
    report = check_toolchain("cpu", cxx="/bin/false")
    assert not report.ok
    assert report.stage == "compiler"
    assert "/bin/false" in report.message
    assert report.cxx == "/bin/false"
    if HAS_KNOWN_GOOD:
        assert f"CXX={KNOWN_GOOD_CXX}" in report.advice
    assert "BROKEN" in report.render()
    assert "/bin/false" in report.render()


def test_a_missing_compiler_is_reported_up_front(tmp_path: Path) -> None:
    report = check_toolchain("cpu", cxx=str(tmp_path / "no-such-g++"))
    assert not report.ok
    assert report.stage == "compiler"
    assert "cannot be run" in report.message


def test_the_command_line_exits_1_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cxx", "/bin/false"]) == 1
    out = capsys.readouterr().out
    assert "toolchain BROKEN" in out
    assert "/bin/false" in out
    assert main(["--cxx", "/bin/false", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["stage"] == "compiler"


def test_a_crash_reported_by_the_child_names_the_signal_the_compiler_and_the_fix() -> None:
    events = [
        {"stage": "device", "event": "start"},
        {"stage": "device", "event": "done"},
        {"stage": "compile", "event": "start"},
        {"stage": "compile", "event": "done", "seconds": 50.0, "cache_hit": False},
        {"stage": "load", "event": "start"},
    ]
    report = _verdict(
        device="cuda",
        compiler="/opt/gcc/bin/g++",
        version="g++ (GCC) 12",
        returncode=-signal.SIGSEGV,
        timed_out=False,
        timeout_s=600,
        events=events,
        log_tail="",
        seconds=60.0,
        command=["python"],
    )
    assert not report.ok
    assert report.stage == "load"
    assert report.signal == "SIGSEGV"
    assert "/opt/gcc/bin/g++" in report.message
    assert "crash at load" in report.message
    if HAS_KNOWN_GOOD:
        assert f"CXX={KNOWN_GOOD_CXX}" in report.advice
    timed_out = _verdict(
        device="cuda",
        compiler="/usr/bin/g++",
        version="",
        returncode=-9,
        timed_out=True,
        timeout_s=5,
        events=events[:3],
        log_tail="",
        seconds=5.0,
        command=["python"],
    )
    assert not timed_out.ok
    assert timed_out.stage == "compile"
    assert "timed out after 5 s" in timed_out.message


@needs_compiler
@pytest.mark.proof
def test_cpu_preflight_passes_with_a_working_compiler() -> None:
    report = check_toolchain("cpu", cxx=GOOD_CXX, timeout_s=900)
    assert report.ok, report.render()
    assert report.stage == "run"
    assert report.load_seconds is not None
    assert report.signal is None


@needs_compiler
@pytest.mark.proof
def test_a_compiler_that_cannot_compile_fails_in_the_compile_stage() -> None:
    script = _write_script(
        _tool_dir() / "failing-g++",
        f'#!/bin/sh\ncase "$1" in --version|-v) exec {GOOD_CXX} "$@";; esac\n'
        'echo "failing-g++: refusing to compile" >&2\nexit 1\n',
    )
    report = check_toolchain("cpu", cxx=str(script), timeout_s=900)
    assert not report.ok, report.render()
    assert report.stage == "compile", report.render()
    assert "refusing to compile" in report.message
    assert str(script) in report.render()


@needs_compiler
@pytest.mark.proof
def test_a_compiler_whose_libraries_crash_at_load_is_reported_not_fatal() -> None:
    """A wrapper that links a SIGSEGV-raising constructor into every shared library (like SPEC §3's)."""
    tools = _tool_dir()
    crash_c = tools / "crash.c"
    crash_c.write_text(
        "#include <signal.h>\n__attribute__((constructor)) static void crash(void) { raise(SIGSEGV); }\n"
    )
    crash_o = tools / "crash.o"
    subprocess.run([GOOD_CXX, "-x", "c", "-fPIC", "-c", str(crash_c), "-o", str(crash_o)], check=True)
    wrapper = _write_script(
        tools / "crashing-g++",
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        f'  if [ "$arg" = "-shared" ]; then exec {GOOD_CXX} "$@" {crash_o}; fi\n'
        "done\n"
        f'exec {GOOD_CXX} "$@"\n',
    )
    report = check_toolchain("cpu", cxx=str(wrapper), timeout_s=900)
    assert not report.ok, report.render()
    assert report.stage == "load", report.render()
    assert report.signal == "SIGSEGV", report.render()
    assert str(wrapper) in report.message
    if HAS_KNOWN_GOOD:
        assert f"CXX={KNOWN_GOOD_CXX}" in report.advice
