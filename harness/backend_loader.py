"""Find the backend under test from ``--backend module:attr`` or ``CONFORMANCE_BACKEND``: the one loader the
suite (``conformance/conftest.py``) and the bench (``harness.bench``) share. It imports the backend by name,
at run time, so ``harness`` never imports a backend (or the suite) statically."""

from __future__ import annotations

import importlib
import os
from typing import Any

DEFAULT_BACKEND = "reference_impl:BACKEND"
BACKEND_ENV_VAR = "CONFORMANCE_BACKEND"


class BackendLoadError(Exception):
    """The backend named by the user cannot be loaded or is not a backend."""


def backend_spec(cli_value: str | None) -> str:
    """The backend spec in force: the command line wins over the environment, which wins over the default."""
    return cli_value or os.environ.get(BACKEND_ENV_VAR) or DEFAULT_BACKEND


def load_backend(spec: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and check it carries the protocol's identity."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise BackendLoadError(
            f"backend spec {spec!r} must have the form 'module:attr' (for example {DEFAULT_BACKEND!r})"
        )
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendLoadError(f"backend spec {spec!r}: cannot import module {module_name!r}: {exc}") from exc
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
