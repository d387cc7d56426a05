"""Toolchain preflight: compile, load and run a trivial artifact in a subprocess before the suite starts.

SPEC §3: on the GPU image ``CXX`` points at a g++ wrapper whose AOTInductor ``.so`` files segfault at
load (std::regex inside the model library). Loading one in the test process would kill it mid-run, so the
check runs in a child process with a timeout: a signal there (SIGSEGV) becomes a report naming the compiler
in use and the fix (``CXX=/usr/bin/g++`` when that exists), never a crash of the caller.

Stages the child reports, in order: ``device`` (the target exists), ``compile`` (the ``linear`` zoo model
through ``preprocess`` and the artifact cache, so a later suite run reuses it), ``load`` (the package's
``.so`` is loaded) and ``run`` (one call, compared with eager). Before spawning the child the parent checks
the compiler itself (stage ``compiler``: it must exist and answer ``--version``).

Command line::

    python -m reference_impl.lowering.preflight [--device cuda] [--cxx PATH] [--timeout S] [--json]

exits 0 when the toolchain works and 1 with a message saying what is wrong and how to fix it.

It loads with the runtime's ``load_package_fast`` (``reference_impl/format/package_loader.py``), the
loader that skips ``aoti_load_package``'s slow first-load probe: what the preflight proves, the runtime does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reference_impl.artifact_cache import compiler_version

__all__ = [
    "KNOWN_GOOD_CXX",
    "PreflightReport",
    "check_toolchain",
    "main",
]

KNOWN_GOOD_CXX = "/usr/bin/g++"
_REPO_ROOT = Path(__file__).resolve().parents[2]


# --- the report ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreflightReport:
    """The outcome: ``ok``, the stage reached or failed, a message, and advice when something is wrong."""

    ok: bool
    device: str
    stage: str
    message: str
    cxx: str | None = None
    cxx_version: str | None = None
    advice: str | None = None
    returncode: int | None = None
    signal: str | None = None
    seconds: float = 0.0
    compile_seconds: float | None = None
    load_seconds: float | None = None
    cache_hit: bool | None = None
    log_tail: str = ""
    #: Inductor's largest timers of a compile that missed the cache (``_compile_profile``), seconds.
    compile_profile: dict[str, float] | None = None

    def render(self) -> str:
        if self.ok:
            head = "toolchain OK"
        elif self.stage == "device":
            head = "device unavailable (toolchain not checked)"
        else:
            head = f"toolchain BROKEN (stage: {self.stage})"
        lines = [f"preflight [{self.device}]: {head}", f"  {self.message}"]
        first_version_line = (self.cxx_version or "").splitlines()[:1]
        lines.append(f"  CXX in use: {self.cxx} ({first_version_line[0] if first_version_line else '?'})")
        if self.ok:
            lines.append(
                f"  compile {_fmt(self.compile_seconds)} (cache {'hit' if self.cache_hit else 'miss'}), "
                f"first load {_fmt(self.load_seconds)}, total {self.seconds:.1f} s"
            )
            if self.compile_profile:
                timers = ", ".join(f"{name} {t:.1f} s" for name, t in self.compile_profile.items())
                lines.append(f"  inductor's timers: {timers}")
        if self.advice:
            lines.append(f"  fix: {self.advice}")
        if not self.ok and self.log_tail:
            lines.append("  child output (tail):")
            lines.extend(f"    | {line}" for line in self.log_tail.splitlines()[-15:])
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def _fmt(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.1f} s"


def _resolve(cxx: str | None) -> str:
    # Not artifact_cache.resolve_cxx: that reads inductor's config, whose import this parent avoids;
    # the child compiles with $CXX, which inductor's config is read from.
    candidate = cxx or os.environ.get("CXX") or "g++"
    return shutil.which(candidate) or candidate


def _fix_suggestion(cxx: str) -> str:
    if os.path.exists(KNOWN_GOOD_CXX) and os.path.realpath(cxx) != os.path.realpath(KNOWN_GOOD_CXX):
        return (
            f"run with CXX={KNOWN_GOOD_CXX} (it exists on this machine), e.g. `export CXX={KNOWN_GOOD_CXX}`"
        )
    if os.path.exists(KNOWN_GOOD_CXX):
        return (
            f"CXX is already {KNOWN_GOOD_CXX}; install a working system g++ or point CXX at another "
            "compiler that builds loadable shared libraries"
        )
    return "install a system C++ compiler (e.g. apt-get install g++) and point CXX at it"


# --- parent side ---------------------------------------------------------------------------------------


def check_toolchain(
    device: str = "cpu",
    *,
    cxx: str | None = None,
    timeout_s: float = 600.0,
    cache_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> PreflightReport:
    """Compile, load and run a trivial artifact for ``device`` in a subprocess; report what happened.

    ``cxx`` defaults to ``$CXX`` (else ``g++``); the child gets it as ``CXX``. ``cache_dir`` defaults to the
    artifact cache's own default. ``env`` adds variables to the child's environment.
    """
    start = time.monotonic()
    compiler = _resolve(cxx)
    rc, version = compiler_version(compiler)
    if rc != 0:
        how = "cannot be run" if rc is None else f"exits {rc} on `--version`"
        return PreflightReport(
            ok=False,
            device=device,
            stage="compiler",
            message=f"the C++ compiler CXX={compiler} {how}"
            + (f" ({version.splitlines()[0]})" if version else ""),
            cxx=compiler,
            cxx_version=version,
            advice=_fix_suggestion(compiler),
            seconds=time.monotonic() - start,
        )
    child = _run_child(device, _child_env(compiler, env, cache_dir), timeout_s)
    return _verdict(
        device=device,
        compiler=compiler,
        version=version,
        returncode=child.returncode,
        timed_out=child.timed_out,
        timeout_s=timeout_s,
        events=child.events,
        log_tail=child.log_tail,
        seconds=time.monotonic() - start,
        command=child.command,
    )


def _child_env(
    compiler: str, env: Mapping[str, str] | None, cache_dir: str | os.PathLike[str] | None
) -> dict[str, str]:
    """The child's environment: ours, plus ``env``, with ``CXX``, this repository on ``PYTHONPATH`` and the
    artifact cache's directory (where ``cache_dir`` is given)."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["CXX"] = compiler
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_REPO_ROOT), child_env.get("PYTHONPATH", "")) if p
    )
    if cache_dir is not None:
        from reference_impl.artifact_cache import CACHE_ENV_VAR

        child_env[CACHE_ENV_VAR] = os.fspath(cache_dir)
    return child_env


@dataclass(frozen=True)
class _ChildRun:
    """How the preflight child ended: its return code (None: killed before it returned one), whether it
    timed out, the progress events it wrote, the tail of its output, and the command that ran it."""

    returncode: int | None
    timed_out: bool
    events: list[dict[str, Any]]
    log_tail: str
    command: list[str]


def _run_child(device: str, child_env: dict[str, str], timeout_s: float) -> _ChildRun:
    """Run the preflight child (``--child``) in a process group of its own; on a timeout the whole group is
    killed (the compilers it spawned too)."""
    with tempfile.TemporaryDirectory(prefix="aoti-preflight-") as tmp:
        progress = Path(tmp) / "progress.jsonl"
        command = [
            sys.executable,
            "-m",
            "reference_impl.lowering.preflight",
            "--child",
            "--device",
            device,
            "--progress",
            str(progress),
            "--workdir",
            tmp,
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=str(_REPO_ROOT),
            start_new_session=True,  # its own process group: a timeout kills the compilers it spawned too
        )
        timed_out = False
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process)
            output, _ = process.communicate()
        events = _read_events(progress)
    log_tail = output.decode("utf-8", errors="replace")[-4000:] if output else ""
    return _ChildRun(process.returncode, timed_out, events, log_tail, command)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


def _read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash
    return events


def _verdict(
    *,
    device: str,
    compiler: str,
    version: str,
    returncode: int | None,
    timed_out: bool,
    timeout_s: float,
    events: list[dict[str, Any]],
    log_tail: str,
    seconds: float,
    command: list[str],
) -> PreflightReport:
    done = {e["stage"]: e for e in events if e.get("event") == "done"}
    started = [e["stage"] for e in events if e.get("event") == "start"]
    errors = [e for e in events if e.get("event") == "error"]
    current = next((s for s in reversed(started) if s not in done), started[-1] if started else "startup")
    common: dict[str, Any] = {
        "device": device,
        "cxx": compiler,
        "cxx_version": version,
        "returncode": returncode,
        "seconds": seconds,
        "compile_seconds": done.get("compile", {}).get("seconds"),
        "load_seconds": done.get("load", {}).get("seconds"),
        "cache_hit": done.get("compile", {}).get("cache_hit"),
        "compile_profile": done.get("compile", {}).get("profile") or None,
        "log_tail": log_tail,
    }
    if timed_out:
        return PreflightReport(
            ok=False,
            stage=current,
            message=f"the preflight child timed out after {timeout_s:.0f} s in stage {current!r}",
            advice="raise --timeout on a slow machine (an AOTInductor compile takes ~60 s on the GPU image); "
            "if it hangs in 'load', the compiler is suspect: " + _fix_suggestion(compiler),
            **common,
        )
    if returncode is not None and returncode < 0:
        return _killed_report(-returncode, current, compiler, common)
    if errors:
        return _error_report(errors[-1], compiler, common)
    if returncode != 0 or "run" not in done:
        return PreflightReport(
            ok=False,
            stage=current,
            message=f"the preflight child exited {returncode} in stage {current!r} without a report; "
            f"run it by hand to see why: {' '.join(command)}",
            **common,
        )
    return PreflightReport(
        ok=True,
        stage="run",
        message=f"compiled, loaded and ran a {device} artifact with CXX={compiler}; "
        f"max abs error vs eager {done['run'].get('max_abs_err', 0.0):.2e}",
        **common,
    )


def _killed_report(signum: int, current: str, compiler: str, common: dict[str, Any]) -> PreflightReport:
    """The child died of signal ``signum`` in stage ``current``: in ``load`` or ``run``, the known broken
    toolchain (a model library that crashes at load)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if current in ("load", "run"):
        message = (
            f"loading the artifact compiled with CXX={compiler} killed the process with {name} "
            f"(stage {current!r}): a broken toolchain. This is the known failure of a g++ wrapper "
            "(e.g. /opt/gcc/bin/g++ on the GPU image) whose model libraries crash at load "
            "(std::regex inside the .so)"
        )
    else:
        message = f"the preflight child died with {name} in stage {current!r} (CXX={compiler})"
    return PreflightReport(
        ok=False, stage=current, message=message, signal=name, advice=_fix_suggestion(compiler), **common
    )


def _error_report(error: dict[str, Any], compiler: str, common: dict[str, Any]) -> PreflightReport:
    """The child reported a failed stage (its last ``error`` event), with advice for that stage."""
    stage = error["stage"]
    advice = None
    if stage == "compile":
        advice = "check that CXX builds shared libraries against torch; " + _fix_suggestion(compiler)
    elif stage in ("load", "run"):
        advice = _fix_suggestion(compiler)
    return PreflightReport(
        ok=False,
        stage=stage,
        message=f"stage {stage!r} failed: {error.get('error', '?')}",
        advice=advice,
        **common,
    )


# --- child side ----------------------------------------------------------------------------------------


class _Progress:
    def __init__(self, path: str) -> None:
        self._path = path

    def emit(self, **event: Any) -> None:
        # One line per event, flushed and synced: a crash right after still leaves the stage on disk.
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(event, default=repr) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def _compile_profile(top: int = 8) -> dict[str, float]:
    """Inductor's own timers of this process (``dynamo_timed``), the largest ``top`` in seconds: where a
    cold first compile goes (code generation, the C++ compiles, header precompilation)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # pragma: no cover - a torch without the timers
        return {}
    totals = {name: sum(times) for name, times in compilation_time_metrics.items()}
    return {name: round(t, 2) for name, t in sorted(totals.items(), key=lambda kv: -kv[1])[:top]}


def _child(device: str, progress_path: str, workdir: str) -> int:
    progress = _Progress(progress_path)
    stage = "device"
    try:
        progress.emit(stage=stage, event="start")
        import torch

        from reference_impl.format.blob import unpack_blob
        from reference_impl.lowering.preprocess import preprocess, resolve_device
        from reference_impl.lowering.trivial import trivial_linear
        from reference_impl.lowering.vec_isa import warm_in_background

        # First thing: the machine's vector-ISA answers, which every process's first compile waits for
        # (the preflight starts with the run; the suite's compile processes are still exporting).
        warm_in_background()

        target = resolve_device(device)
        progress.emit(stage=stage, event="done", device=str(target))

        stage = "compile"
        progress.emit(stage=stage, event="start", cxx=os.environ.get("CXX"))
        module, inputs = trivial_linear(target)
        start = time.perf_counter()
        result = preprocess(module, inputs, method_name="forward", device=target)
        artifact = Path(workdir) / "preflight.pt2"
        artifact.write_bytes(unpack_blob(result.blob).artifact)
        progress.emit(
            stage=stage,
            event="done",
            seconds=time.perf_counter() - start,
            build_seconds=result.compile_seconds,
            cache_hit=result.cache_hit,
            kernels=list(result.kernels),
            profile=_compile_profile(),
        )

        stage = "load"
        progress.emit(stage=stage, event="start")
        start = time.perf_counter()
        from reference_impl.format.package_loader import load_package_fast

        model = load_package_fast(artifact, device_index=target.index if target.type == "cuda" else -1)
        progress.emit(stage=stage, event="done", seconds=time.perf_counter() - start)

        stage = "run"
        progress.emit(stage=stage, event="start")
        (output,) = model.run(list(inputs))
        with torch.no_grad():
            expected = module.to(target)(*inputs)
        if target.type == "cuda":
            torch.cuda.synchronize(target)
        error = (output.double() - expected.double()).abs().max().item()
        if not error <= 1e-3:
            raise AssertionError(f"artifact output differs from eager by {error:.3e} (limit 1e-3)")
        progress.emit(stage=stage, event="done", max_abs_err=error)
        return 0
    except BaseException as error:  # report everything, including KeyboardInterrupt, then fail
        progress.emit(
            stage=stage,
            event="error",
            error=f"{type(error).__name__}: {error}"[:2000],
            traceback=traceback.format_exc()[-4000:],
        )
        traceback.print_exc()
        return 1


# --- command line --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.lowering.preflight",
        description="Check that AOTInductor artifacts compile, load and run with this machine's toolchain.",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    parser.add_argument("--cxx", default=None, help="C++ compiler to check (default: $CXX, else g++)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the child (default: 600)")
    parser.add_argument("--cache-dir", default=None, help="artifact cache (default: $CONFORMANCE_CACHE_DIR)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.device, args.progress, args.workdir)
    report = check_toolchain(args.device, cxx=args.cxx, timeout_s=args.timeout, cache_dir=args.cache_dir)
    print(json.dumps(asdict(report), indent=1) if args.json else report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
