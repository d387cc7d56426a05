"""What the run ran on, as a JSON-serialisable dict: host, Python, torch, CUDA, GPUs, driver, and the suite's
own commit (a result file then says which suite judged it, not only an evidence README written by hand).

Every probe is guarded: a machine without a GPU, a driver or NVML still gets a complete dict, with the
reason in place of the missing value. Nothing here allocates GPU memory.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import settings
from harness.machine_limits import usable_cores

_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CXX")
#: The checkout the suite runs from (harness/'s parent).
SUITE_ROOT = Path(__file__).resolve().parents[1]


def capture_environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    usable = usable_cores()  # what the run may keep busy: a pod's CPU quota, a container's CPU set
    env["usable_cores"] = usable.count
    if usable.bound_by:
        env["cores_bound_by"] = usable.bound_by
    env.update(_torch_info())
    env["driver_version"] = nvidia_driver_version()
    env["env"] = {name: os.environ.get(name) for name in _ENV_VARS}
    env["settings"] = settings.set_in()  # the project's settings this run had set (settings/)
    env["suite_commit"] = suite_commit()
    return env


def suite_commit(root: Path = SUITE_ROOT) -> str | None:
    """The suite's git commit, ``+changes`` where tracked files differ from it; else ``$GITHUB_SHA`` (a CI
    job's checkout without its history); None where neither says (an installed suite, a copied tree)."""
    try:
        head = _git(root, "rev-parse", "HEAD").strip()
        changed = bool(_git(root, "status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("GITHUB_SHA") or None
    return f"{head}+changes" if changed else head


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=10
    ).stdout


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("model name", "Model", "Hardware"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _torch_info() -> dict[str, Any]:
    # torch is imported here, not at module level, so loading the plugin (e.g. in xdist workers) stays cheap.
    try:
        import torch
    except Exception as exc:
        return {"torch": None, "torch_error": _reason(exc), "cuda_available": False, "gpus": []}
    info: dict[str, Any] = {"torch": str(torch.__version__), "torch_cuda": torch.version.cuda}
    try:
        # device_count() does not create a CUDA context; is_available() is built on it.
        count = torch.cuda.device_count()
    except Exception as exc:
        info.update(cuda_available=False, gpus=[], gpu_error=_reason(exc))
        return info
    info["cuda_available"] = count > 0
    info["gpus"] = [_gpu_info(torch, index) for index in range(count)]
    return info


def _gpu_info(torch: Any, index: int) -> dict[str, Any]:
    try:
        # Reads properties only: initialises the CUDA runtime in this process but allocates nothing.
        props = torch.cuda.get_device_properties(index)
    except Exception as exc:
        return {"index": index, "error": _reason(exc)}
    uuid = getattr(props, "uuid", None)
    return {
        "index": index,
        "name": str(props.name),
        "total_memory_bytes": int(props.total_memory),
        "capability": f"{props.major}.{props.minor}",
        "uuid": None if uuid is None else _format_uuid(str(uuid)),
    }


def _format_uuid(raw: str) -> str:
    # torch prints a bare UUID; NVML and nvidia-smi say "GPU-<uuid>". Use NVML's form so they can be matched.
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def nvidia_driver_version() -> str:
    """The driver version from NVML, or a sentence saying why it is not known."""
    try:
        import pynvml
    except Exception as exc:
        return f"unknown: pynvml not importable ({_reason(exc)})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return f"unknown: NVML did not initialise ({_reason(exc)})"
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as exc:
        return f"unknown: {_reason(exc)}"
    finally:
        with contextlib.suppress(Exception):  # a failed shutdown changes nothing we report
            pynvml.nvmlShutdown()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
