"""Minimal backends: the reference's parts, any combination of the optional ones, for the proof that every
optional part is optional in every chapter (``tests/conformance/test_optional_parts.py``).

A backend here is one point of :data:`DIMENSIONS`: each optional protocol part or attribute present or
absent (or, for the placement keys of ``lower_options``, one of a few values), and each target it lowers
for (``lowering_devices``) there or not. The
parts it has delegate to the reference backend unchanged — real lowering, real programs — so whatever a
case concludes about a present part is the reference's verdict; what differs is only which parts exist.

Its ``preflight`` checks nothing (there is nothing of its own to build): the part is about how the suite
treats a backend that has one, not about the reference's toolchain, which other self-tests prove.

Every lookup of an optional attribute — present or absent, through ``getattr``, ``hasattr`` or a call — is
recorded in the backend's :class:`Probe` as the dimension it reveals: that is all a case can learn about
which parts exist, and what ``tests/conformance/part_probe.py`` explores.

Select one with ``--backend tests.minimal_backends:<spec>``, ``<spec>`` being ``full`` or comma-separated
``dimension=value`` pairs (the others as the reference has them), e.g.
``tests.minimal_backends:runtime_options=absent,lowers_cuda=no``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.protocol import SKIP_D2H
from reference_impl import BACKEND as REFERENCE

#: Dimension → its values; the first is the reference's (what ``full`` has, and what an unassigned
#: dimension takes). ``absent`` means the attribute does not exist. 2^10 x 3 x 2 = 6,144 combinations.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "mm_out": ("yes", "absent"),
    "mm_out_calls": ("yes", "absent"),  # mm_out_calls and mm_out_calls_per_execute
    "mm_out_path": ("yes", "absent"),
    "view_pass": ("yes", "absent"),
    "preflight": ("yes", "absent"),
    "lowering": ("yes", "absent"),
    # lowering_devices, one target at a time: what a case can learn is whether the target it asks about is
    # in it (Targets). Absent is the protocol's default, both: the same for the suite, which reads the
    # attribute only through protocol.lowering_devices() (a self-test checks).
    "lowers_cpu": ("yes", "no"),
    "lowers_cuda": ("yes", "no"),
    "device_placement": ("both-keys", "h2d-key-only", "absent"),  # lower_options
    "runtime": ("yes", "absent"),
    "runtime_options": ("yes", "absent"),
    "known_failures": ("absent", "empty"),
}
#: Attribute → the dimension its lookup reveals.
ATTRIBUTE_DIMENSION: dict[str, str] = {
    "mm_out": "mm_out",
    "mm_out_calls": "mm_out_calls",
    "mm_out_calls_per_execute": "mm_out_calls",
    "mm_out_path": "mm_out_path",
    "view_copy_pass": "view_pass",
    "preflight": "preflight",
    "lower": "lowering",
    "lower_options": "device_placement",
    "init": "runtime",
    "execute": "runtime",
    "destroy": "runtime",
    "execute_stats": "runtime",
    "set_option": "runtime_options",
    "get_option": "runtime_options",
    "known_failures": "known_failures",
}
_ABSENT = object()
Assignment = Mapping[str, str]


def minimal_preflight(device: str) -> tuple[bool, str]:
    return True, f"preflight [{device}]: nothing to build (minimal backend)"


def _lower(probe: Probe) -> Any:
    """The reference's ``lower``, held to the ``lower_options`` this backend advertises, as a backend of
    its own would be: a key it does not list is a ValueError, and without ``lower_options`` at all it takes
    no ``options`` (a TypeError). What it accepts depends on the placement setting: recorded as looked up."""

    def lower(methods: Mapping[str, Any], *, device: str, options: Mapping[str, Any] | None = None) -> bytes:
        if options:
            probe.looked_up.add("device_placement")
            allowed = _value("lower_options", probe.setting("device_placement"))
            if allowed is _ABSENT:
                raise TypeError("lower() got an unexpected keyword argument 'options'")
            unknown = sorted(set(options) - set(allowed))
            if unknown:
                raise ValueError(f"lower: argument 'options' has unknown key(s) {unknown}")
        return REFERENCE.lower(methods, device=device, **({"options": dict(options)} if options else {}))

    return lower


def _value(attr: str, setting: str) -> Any:
    """What attribute ``attr`` is under its dimension's ``setting``."""
    if setting == "absent":
        return _ABSENT
    if attr == "lower_options":
        keys = REFERENCE.lower_options
        return keys if setting == "both-keys" else keys - {SKIP_D2H}
    if attr == "known_failures":
        return ()
    if attr == "preflight":
        return minimal_preflight
    return getattr(REFERENCE, attr)


class Targets(tuple):  # type: ignore[type-arg]
    """The backend's ``lowering_devices``: asking whether it holds a target records that target's dimension
    (``lowers_<target>``), going through all of it records both."""

    probe: Probe

    def __new__(cls, probe: Probe) -> Targets:
        targets = super().__new__(cls, (t for t in TARGETS if probe.setting(f"lowers_{t}") == "yes"))
        targets.probe = probe
        return targets

    def __contains__(self, target: object) -> bool:
        if target in TARGETS:
            self.probe.looked_up.add(f"lowers_{target}")
        return super().__contains__(target)

    def __iter__(self) -> Any:
        self.probe.looked_up.update(f"lowers_{t}" for t in TARGETS)
        return super().__iter__()

    def __len__(self) -> int:
        self.probe.looked_up.update(f"lowers_{t}" for t in TARGETS)
        return super().__len__()


TARGETS = ("cpu", "cuda")


@dataclass
class Probe:
    """Which dimensions hold which values now, and which ones were looked up since ``reset``."""

    assignment: dict[str, str] = field(default_factory=dict)
    looked_up: set[str] = field(default_factory=set)

    def reset(self, assignment: Assignment) -> None:
        self.assignment = dict(assignment)
        self.looked_up = set()

    def setting(self, dimension: str) -> str:
        return self.assignment.get(dimension, DIMENSIONS[dimension][0])


class MinimalBackend:
    """The reference with only the parts its probe's assignment gives it."""

    name = "minimal"
    version = "0"

    def __init__(self, assignment: Assignment | None = None) -> None:
        self.probe = Probe(dict(assignment or {}))

    def __getattribute__(self, attr: str) -> Any:
        if attr == "lowering_devices":  # always there; which targets it holds is recorded as they are asked
            return Targets(object.__getattribute__(self, "probe"))
        dimension = ATTRIBUTE_DIMENSION.get(attr)
        if dimension is None:
            return object.__getattribute__(self, attr)
        probe: Probe = object.__getattribute__(self, "probe")
        probe.looked_up.add(dimension)
        value = _value(attr, probe.setting(dimension))
        if attr == "lower" and value is not _ABSENT:
            value = _lower(probe)
        if value is _ABSENT:
            raise AttributeError(f"'MinimalBackend' object has no attribute {attr!r}", name=attr, obj=self)
        return value

    def __repr__(self) -> str:
        return f"MinimalBackend({describe(self.probe.assignment)})"


def describe(assignment: Assignment) -> str:
    """``runtime_options=absent,lowers_cuda=no``; ``full`` for the reference's combination."""
    shown = [f"{k}={v}" for k, v in sorted(assignment.items()) if v != DIMENSIONS[k][0]]
    return ",".join(shown) or "full"


def parse(spec: str) -> dict[str, str]:
    """The assignment a spec names (see the module docstring); ValueError naming what is wrong."""
    if spec == "full":
        return {}
    assignment: dict[str, str] = {}
    for pair in spec.split(","):
        dimension, _, value = pair.partition("=")
        if dimension not in DIMENSIONS or value not in DIMENSIONS[dimension]:
            known = "; ".join(f"{d}: {'|'.join(v)}" for d, v in DIMENSIONS.items())
            raise ValueError(f"minimal backend spec {spec!r}: {pair!r} is not one of {known}")
        assignment[dimension] = value
    return assignment


def __getattr__(spec: str) -> MinimalBackend:
    if spec.startswith("__"):
        raise AttributeError(spec)
    return MinimalBackend(parse(spec))
