"""Find the backend under test from ``--backend module:attr`` or ``CONFORMANCE_BACKEND``: the one loader the
suite (``conformance/conftest.py``), the pre-lowering and the bench (``harness.bench``) share. It imports
the backend by name, at run time, so ``harness`` never imports a backend (or the suite) statically.

A backend package outside this repository is found through ``--backend-path DIR`` (or
``$CONFORMANCE_BACKEND_PATH``; several directories joined with ``os.pathsep``): the directory that holds
the package, put first on ``sys.path``. :func:`use_backend_path` also exports it, so every process the run
starts (xdist workers, the pre-lowering, bench workers) finds the same package, and the suite writes it
into every repro line. Nothing is installed, so it survives any venv rebuild.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import settings

DEFAULT_BACKEND = "reference_impl:BACKEND"
BACKEND_ENV_VAR = settings.BACKEND.name
BACKEND_PATH_ENV_VAR = settings.BACKEND_PATH.name


class BackendLoadError(Exception):
    """The backend named by the user cannot be loaded or is not a backend."""


def backend_spec(cli_value: str | None) -> str:
    """The backend spec in force: the command line wins over the environment, which wins over the default."""
    return cli_value or os.environ.get(BACKEND_ENV_VAR) or DEFAULT_BACKEND


def backend_path(cli_value: str | Sequence[str] | None = None) -> list[str]:
    """The directories in force, absolute: the command line's ``--backend-path`` (repeatable, or joined
    with ``os.pathsep``) wins over ``$CONFORMANCE_BACKEND_PATH``; empty when neither is given."""
    values = [cli_value] if isinstance(cli_value, str) else list(cli_value or [])
    raw = [part for value in values for part in value.split(os.pathsep) if part]
    if not raw:
        raw = [part for part in os.environ.get(BACKEND_PATH_ENV_VAR, "").split(os.pathsep) if part]
    return [str(Path(part).expanduser().resolve()) for part in raw]


def use_backend_path(directories: Sequence[str]) -> None:
    """Put ``directories`` first on ``sys.path`` and export them (``$CONFORMANCE_BACKEND_PATH``) for every
    process this one starts; a directory that does not exist is a BackendLoadError naming it."""
    missing = [d for d in directories if not Path(d).is_dir()]
    if missing:
        raise BackendLoadError(f"--backend-path: no such directory: {', '.join(missing)}")
    for directory in reversed(directories):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    if directories:
        os.environ[BACKEND_PATH_ENV_VAR] = os.pathsep.join(directories)


def load_backend(spec: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and check it carries the protocol's identity.
    ``$CONFORMANCE_BACKEND_PATH`` (see :func:`use_backend_path`) is searched first."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise BackendLoadError(
            f"backend spec {spec!r} must have the form 'module:attr' (for example {DEFAULT_BACKEND!r})"
        )
    use_backend_path(backend_path())
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if getattr(exc, "name", None) == module_name.split(".")[0]:
            searched = backend_path()
            where = f" (searched --backend-path {os.pathsep.join(searched)} first)" if searched else ""
            hint = (
                f"{where}. For a backend package outside this repository, pass the directory that holds "
                f"{module_name.split('.')[0]!r} with --backend-path DIR (or ${BACKEND_PATH_ENV_VAR}); "
                "see README, 'Using it on your backend'"
            )
        raise BackendLoadError(
            f"backend spec {spec!r}: cannot import module {module_name!r}: {exc}{hint}"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BackendLoadError(
                f"backend spec {spec!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
        except ImportError as exc:  # a lazily built backend whose dependencies are missing
            raise BackendLoadError(f"backend spec {spec!r}: cannot load {attr_path!r}: {exc}") from exc
    lacking = [attr for attr in ("name", "version") if not isinstance(getattr(obj, attr, None), str)]
    if lacking:
        raise BackendLoadError(
            f"backend spec {spec!r}: the object lacks the protocol identity attribute(s) {lacking} "
            "(each a str; see conformance/protocol.py)"
        )
    return obj
