"""Measure the first ``aoti_load_package`` of a process, with and without the cuts described in NOTES.md.

    python -m reference_impl.lowering.load_probe --device cuda --out DIR

builds a small artifact (the ``linear`` zoo model, through the artifact cache), then loads it in fresh child
processes under several variants and prints a table: time to import torch, the first load (inductor import
plus the load call), the subprocesses the first load spawned (count and seconds), a second load in the same
process, and whether a run matched eager. Per-variant logs (stdout/stderr, the subprocess list and a cProfile
of the first load) and ``results.json`` go to ``--out``.

Variants:

* ``torch/cold``      ``torch._inductor.aoti_load_package`` with an empty inductor cache dir (a fresh machine)
* ``torch/warm``      the same, again, on the now warm inductor cache dir (persisting TORCHINDUCTOR_CACHE_DIR)
* ``torch/isa-ok``    the same with ``TORCHINDUCTOR_VEC_ISA_OK=1`` (skips the ISA dry-compile probes)
* ``fast``            ``load_package_fast`` of the runtime (no inductor import, no device-info probing)
* ``fast/cold-pyc``   the fast loader with an empty ``PYTHONPYCACHEPREFIX`` (every module's bytecode rebuilt)
* ``torch/cold-pyc``  torch's loader with empty inductor cache *and* empty bytecode cache (the worst case)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[2]
_CHILD_BOOT = "import runpy,sys; p=sys.argv[1]; sys.argv=sys.argv[1:]; runpy.run_path(p, run_name='__main__')"

VARIANTS: dict[str, dict[str, Any]] = {
    "torch/cold": {"loader": "torch", "inductor_dir": "cold-a"},
    "torch/warm": {"loader": "torch", "inductor_dir": "cold-a"},  # second use of the same dir
    "torch/isa-ok": {"loader": "torch", "inductor_dir": "cold-b", "env": {"TORCHINDUCTOR_VEC_ISA_OK": "1"}},
    "fast": {"loader": "fast", "inductor_dir": "cold-c"},
    "fast/cold-pyc": {"loader": "fast", "inductor_dir": "cold-d", "pyc_prefix": "pyc-a"},
    "torch/cold-pyc": {"loader": "torch", "inductor_dir": "cold-e", "pyc_prefix": "pyc-b"},
}


# --- child -----------------------------------------------------------------------------------------------


def _child(loader_kind: str, artifact: str, device: str, out_json: str, profile_path: str) -> int:
    calls = _record_subprocesses()
    result: dict[str, Any] = {"loader": loader_kind}
    wall0 = time.time()
    t0 = time.perf_counter()
    import torch

    result["import_torch_s"] = time.perf_counter() - t0
    index = 0 if device.startswith("cuda") else -1
    target = torch.device("cuda", 0) if device.startswith("cuda") else torch.device("cpu")
    if target.type == "cuda":
        t = time.perf_counter()
        torch.cuda.init()
        torch.empty(1, device=target)
        result["cuda_init_s"] = time.perf_counter() - t  # kept out of the load figures

    profiler = cProfile.Profile()
    t1 = time.perf_counter()
    profiler.enable()
    model, load = _first_load(loader_kind, artifact, index, result)
    profiler.disable()
    result["first_load_s"] = time.perf_counter() - t1
    result["subprocesses"] = list(calls)
    result["subprocess_s"] = sum(c["seconds"] for c in calls)
    result["max_abs_err"] = _max_abs_err(model, loader_kind, target)

    t = time.perf_counter()
    load(artifact, device_index=index)
    result["second_load_s"] = time.perf_counter() - t

    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(30)
    Path(profile_path).write_text(stream.getvalue())
    result["bytecode"] = _bytecode_state(torch, wall0)
    Path(out_json).write_text(json.dumps(result, indent=1))
    return 0


def _record_subprocesses() -> list[dict[str, Any]]:
    """Patch ``subprocess.Popen`` for the rest of this (child) process: every subprocess's command, seconds
    and return code, appended to the list returned, when it is first waited for."""
    calls: list[dict[str, Any]] = []
    original_init = subprocess.Popen.__init__
    original_wait = subprocess.Popen.wait

    def init(self: subprocess.Popen, args: Any, *a: Any, **k: Any) -> None:
        self._probe_started = time.perf_counter()  # type: ignore[attr-defined]
        self._probe_argv = args if isinstance(args, str) else " ".join(map(str, args))  # type: ignore[attr-defined]
        original_init(self, args, *a, **k)

    def wait(self: subprocess.Popen, timeout: float | None = None) -> int:
        code = original_wait(self, timeout)
        if not getattr(self, "_probe_recorded", False):
            self._probe_recorded = True  # type: ignore[attr-defined]
            calls.append(
                {
                    "argv": self._probe_argv[:300],  # type: ignore[attr-defined]
                    "seconds": time.perf_counter() - self._probe_started,  # type: ignore[attr-defined]
                    "rc": code,
                }
            )
        return code

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    subprocess.Popen.wait = wait  # type: ignore[method-assign]
    return calls


def _first_load(
    loader_kind: str, artifact: str, index: int, result: dict[str, Any]
) -> tuple[Any, Callable[..., Any]]:
    """The process's first load of ``artifact`` with ``loader_kind``'s loader, timed into ``result`` (the
    loader's import apart from its call); returns the model and the loader, for the second load."""
    if loader_kind == "torch":
        t = time.perf_counter()
        import torch._inductor
        import torch._inductor.package

        result["inductor_import_s"] = time.perf_counter() - t
        load: Callable[..., Any] = torch._inductor.aoti_load_package
    else:
        from reference_impl.format.package_loader import load_package_fast

        result["inductor_import_s"] = 0.0
        load = load_package_fast
    t = time.perf_counter()
    model = load(artifact, device_index=index)
    result["load_call_s"] = time.perf_counter() - t
    return model, load


def _max_abs_err(model: Any, loader_kind: str, target: Any) -> float:
    """One run of the loaded trivial model against eager: the largest absolute difference."""
    import torch

    from reference_impl.lowering.trivial import trivial_linear

    module, inputs = trivial_linear(target)
    outputs = model.run(list(inputs)) if loader_kind == "fast" else [model(*inputs)]
    with torch.no_grad():
        expected = module(*inputs)
    if target.type == "cuda":
        torch.cuda.synchronize()
    return (outputs[0].double() - expected.double()).abs().max().item()


def _bytecode_state(torch: Any, since: float) -> dict[str, Any]:
    """Whether torch's bytecode was (re)written during this process, and whether it could be."""
    import importlib.util

    source = Path(torch.__file__).parent / "_inductor" / "codecache.py"
    cached = Path(importlib.util.cache_from_source(str(source)))
    torch_dir = Path(torch.__file__).parent
    fresh = 0
    for pyc in torch_dir.rglob("*.pyc"):
        with contextlib.suppress(OSError):
            fresh += pyc.stat().st_mtime >= since
    prefix = os.environ.get("PYTHONPYCACHEPREFIX")
    if prefix:
        fresh += sum(1 for _ in Path(prefix).rglob("*.pyc"))
    return {
        "dont_write_bytecode": sys.dont_write_bytecode,
        "pycache_prefix": prefix,
        "codecache_pyc": str(cached),
        "codecache_pyc_exists": cached.exists(),
        "site_packages_writable": os.access(torch_dir, os.W_OK),
        "pyc_written_this_process": fresh,
    }


# --- parent ----------------------------------------------------------------------------------------------


def _build_artifact(device: str, out: Path) -> tuple[Path, dict[str, Any]]:

    from reference_impl.format.blob import unpack_blob
    from reference_impl.lowering.preprocess import preprocess
    from reference_impl.lowering.trivial import trivial_linear

    module, inputs = trivial_linear(device)
    start = time.perf_counter()
    result = preprocess(module, inputs, device=device)
    info = {
        "seconds": time.perf_counter() - start,
        "cache_hit": result.cache_hit,
        "build_seconds": result.compile_seconds,
        "kernels": list(result.kernels),
        "cxx": os.environ.get("CXX"),
    }
    path = out / f"probe-{device.replace(':', '')}.pt2"
    path.write_bytes(unpack_blob(result.blob).artifact)
    return path, info


def _run_variant(
    name: str, spec: dict[str, Any], artifact: Path, device: str, out: Path, scratch: Path, timeout_s: float
) -> dict[str, Any]:
    slug = name.replace("/", "_")
    env = dict(os.environ)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / spec["inductor_dir"])
    if "pyc_prefix" in spec:
        env["PYTHONPYCACHEPREFIX"] = str(scratch / spec["pyc_prefix"])
    env.update(spec.get("env", {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    result_json = out / f"{slug}.json"
    # Run this file as a script (not ``-m``), so that importing the package (and torch with it) happens
    # inside the timed region of the child rather than before it.
    command = [
        sys.executable,
        "-c",
        _CHILD_BOOT,
        str(Path(__file__).resolve()),
        "--child",
        spec["loader"],
        "--artifact",
        str(artifact),
        "--device",
        device,
        "--result",
        str(result_json),
        "--profile",
        str(out / f"{slug}.profile.txt"),
    ]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
            cwd=str(_REPO_ROOT),
        )
        rc, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        rc, log = None, f"timed out after {timeout_s} s\n{error.stdout or ''}{error.stderr or ''}"
    wall = time.perf_counter() - start
    (out / f"{slug}.log").write_text(log if isinstance(log, str) else str(log))
    try:
        data = json.loads(result_json.read_text())
    except (OSError, ValueError):
        data = {}
    data.update({"variant": name, "rc": rc, "process_wall_s": wall})
    return data


def _table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'variant':<16} {'rc':>4} {'proc s':>7} {'import torch':>12} {'cuda init':>9} {'inductor imp':>12} "
        f"{'load call':>9} {'FIRST LOAD':>10} {'subproc n/s':>12} {'2nd load':>9} {'pyc new':>7} {'ok':>3}"
    )
    lines = [header, "-" * len(header)]

    def cell(r: dict[str, Any], key: str, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
        value = r.get(key)
        return fmt.format(value * scale) if isinstance(value, (int, float)) else "-"

    for r in rows:
        n = len(r.get("subprocesses", [])) if "subprocesses" in r else None
        sub = f"{n}/{r.get('subprocess_s', 0):.1f}" if n is not None else "-"
        ok = "yes" if isinstance(r.get("max_abs_err"), float) and r["max_abs_err"] <= 1e-3 else "NO"
        pyc = r.get("bytecode", {}).get("pyc_written_this_process", "-")
        lines.append(
            f"{r['variant']:<16} {r.get('rc')!s:>4} {cell(r, 'process_wall_s'):>7} "
            f"{cell(r, 'import_torch_s'):>12} {cell(r, 'cuda_init_s'):>9} {cell(r, 'inductor_import_s'):>12} "
            f"{cell(r, 'load_call_s'):>9} "
            f"{cell(r, 'first_load_s'):>10} {sub:>12} {cell(r, 'second_load_s', 1000, '{:.1f}ms'):>9} "
            f"{pyc!s:>7} {ok:>3}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.lowering.load_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", default=None, help="directory for logs and results.json (default: a temp dir)"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of variants")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per child (default 180)")
    parser.add_argument("--child", choices=("torch", "fast"), help=argparse.SUPPRESS)
    parser.add_argument("--artifact", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child, args.artifact, args.device, args.result, args.profile)

    out = Path(args.out or tempfile.mkdtemp(prefix="load-probe-"))
    out.mkdir(parents=True, exist_ok=True)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    artifact, build = _build_artifact(args.device, out)
    print(
        f"artifact: {artifact} (build {build['seconds']:.1f} s, "
        f"cache {'hit' if build['cache_hit'] else 'miss'}, CXX={build['cxx']}, kernels={build['kernels']})",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="load-probe-scratch-") as scratch:
        for name in names:
            row = _run_variant(name, VARIANTS[name], artifact, args.device, out, Path(scratch), args.timeout)
            rows.append(row)
            print(
                f"  {name}: rc={row.get('rc')} first load {row.get('first_load_s', float('nan')):.2f} s",
                flush=True,
            )
    (out / "results.json").write_text(
        json.dumps({"device": args.device, "build": build, "rows": rows}, indent=1)
    )
    print()
    print(f"first-load probe, device={args.device}, python={sys.version.split()[0]}, logs in {out}")
    print(_table(rows))
    return 0 if all(r.get("rc") == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
