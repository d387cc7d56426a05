"""The backend's toolchain preflight, through the protocol: one place for the suite and the pre-lowering.

A backend that compiles (the reference: AOTInductor with the machine's C++ compiler) may offer
``preflight(device) -> (ok, message)`` (optional protocol attribute): compile, load and run something trivial
so that a broken toolchain stops a run with its diagnosis instead of failing every case (SPEC §3).
"""

from __future__ import annotations

from conformance.protocol import implements


def run_preflight(backend: object, device: str) -> tuple[bool, list[str]]:
    """(ok, the lines to show): the verdict, and what the check cost when the backend says so. A backend
    without a preflight passes with nothing to show."""
    if not implements(backend, "preflight"):
        return True, []
    ok, message = backend.preflight(device)
    first, *rest = message.splitlines() if message else [f"ok={ok}"]
    lines = [first if first.startswith("preflight") else f"preflight [{device}]: {first}"]
    # What the check cost (the reference's "compile … (cache hit), first load …, total … s" line).
    lines += [line.rstrip() for line in rest if "total" in line][:1]
    if not ok:
        lines += [line.rstrip() for line in rest if "total" not in line]
    return bool(ok), lines
