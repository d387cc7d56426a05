"""A case needs protocol parts the backend may lack: the one place such a case is skipped, and why.

Every part the protocol calls optional (``conformance/protocol.py``) is optional in every chapter: a case
that needs a part the backend lacks is *skipped* with the reason, never failed. Cases say what they need
with a gate fixture made by :func:`part_fixture` (it gives the case the backend, typed by the parts' protocols
from ``conformance/protocol.py``), or with :func:`require_part` mid-case, before they touch the backend; the
runtime option helper (``programs.option``) treats a backend without options as one that copies every output.
:func:`missing_part_reason` is the safety net behind them: an ``AttributeError`` for a protocol attribute
the backend does not have, wherever a case hits it, becomes the same skip (``outcomes.py``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import pytest

from conformance.protocol import (
    LOWER_OPTION_PARTS,
    PARTS,
    Backend,
    DevicePlacementBackend,
    LoweringBackend,
    RuntimeBackend,
    RuntimeOptionsBackend,
    missing_attributes,
)

#: Protocol attribute → the part it belongs to (optional attributes of a part included).
PART_OF_ATTRIBUTE: dict[str, str] = {
    **{attr: part for part, attrs in PARTS.items() for attr in attrs},
    "lower_options": "lowering",
    "lowering_devices": "lowering",
    "mm_out_calls": "mm_out",
    "mm_out_calls_per_execute": "mm_out",
    "mm_out_path": "mm_out",
}
_NO_ATTRIBUTE = re.compile(r"has no attribute '(\w+)'|^'?(\w+)'?$")


def skip_reason(backend: Backend, part: str) -> str | None:
    """Why a case needing ``part`` cannot run on ``backend``; None when the backend implements it."""
    missing = missing_attributes(backend, part)
    if not missing:
        return None
    return f"backend {backend.name!r} does not implement protocol part {part!r} (lacks {missing})"


def require_part(backend: Backend, *parts: str) -> None:
    """Skip (never fail) a case whose protocol parts the backend does not implement (the first one missing
    gives the reason)."""
    for part in parts:
        reason = skip_reason(backend, part)
        if reason:
            pytest.skip(reason)


class LoweringRuntimeBackend(LoweringBackend, RuntimeBackend, Protocol):
    """Parts ``lowering`` + ``runtime``: lowers programs and runs them (the ``runtime`` fixture's backend)."""


class OptionsRuntimeBackend(LoweringRuntimeBackend, RuntimeOptionsBackend, Protocol):
    """Parts ``runtime_options`` + ``lowering`` + ``runtime``: the runtime option on programs it runs."""


class PlacementRuntimeBackend(DevicePlacementBackend, RuntimeBackend, Protocol):
    """Parts ``device_placement`` + ``runtime``: export-time placement and a runtime to run what it lowers."""


def part_fixture(
    *parts: str,
    doc: str,
    first: Sequence[str] = (),
    hold: Callable[[Any], AbstractContextManager[object]] | None = None,
) -> Callable[..., object]:
    """A gate fixture: gives a case the backend when it implements every protocol part in ``parts``, else
    skips the case with :func:`require_part`'s reason (the first part missing). Assign it to the name the
    cases ask for and annotate them with the parts' protocol (``conformance/protocol.py``, or the
    combinations above); pytest does not check that annotation, so it is the reader's contract with the gate.

    ``first``: fixtures set up before the gate, whatever the backend lacks (e.g. one that reports the
    implementation once per module). ``hold``: a context manager around the case, entered with the backend
    (e.g. one that restores an option the case may change)."""
    unknown = [part for part in parts if part not in PARTS and part not in LOWER_OPTION_PARTS]
    if not parts or unknown:
        raise ValueError(f"part_fixture needs protocol parts of {[*PARTS, *LOWER_OPTION_PARTS]}, got {parts}")

    def gate(backend: Backend, request: pytest.FixtureRequest) -> Iterator[Backend]:
        for name in first:
            request.getfixturevalue(name)
        require_part(backend, *parts)
        with hold(backend) if hold is not None else contextlib.nullcontext():
            yield backend

    gate.__doc__ = doc
    return pytest.fixture(gate)


def missing_part_reason(backend: Backend, exc: BaseException) -> str | None:
    """The skip reason when ``exc`` is the ``AttributeError`` of looking up a protocol attribute that
    ``backend`` lacks (a case reached a part it did not ask for); None for any other exception — an
    ``AttributeError`` on another object, or for an attribute the backend has, is a real failure."""
    if not isinstance(exc, AttributeError):
        return None
    if getattr(exc, "obj", None) is not None and exc.obj is not backend:
        return None
    name = getattr(exc, "name", None)
    if name is None:  # raised by a backend's own __getattr__: the name is in the message
        match = _NO_ATTRIBUTE.search(str(exc).strip())
        name = next((g for g in match.groups() if g), None) if match else None
    part = PART_OF_ATTRIBUTE.get(name or "")
    if part is None or hasattr(backend, name or ""):
        return None
    return skip_reason(backend, part) or (
        f"backend {backend.name!r} has no protocol attribute {name!r} (part {part!r})"
    )
