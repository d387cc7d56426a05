"""Errors raised by the runtime: every contract violation is a ``ValueError`` naming the argument and rule.

A failure of the underlying library (AOTInductor, CUDA) stays a ``RuntimeError``. Program-format problems
(truncated, tampered, unknown method, wrong target or toolchain) surface as the format's own
``LoweringFormatError`` (also a ``ValueError``), with a note saying which ``init`` call hit them.

The base ``RuntimeArgumentError`` and ``IOSpecError`` live in the format floor
(``reference_impl/format/argument_errors.py``), whose I/O spec raises them; here are the errors only the
runtime raises.
"""

from __future__ import annotations

from reference_impl.format.argument_errors import RuntimeArgumentError
from reference_impl.runtime.options import OptionError

__all__ = ["DestroyedHandleError", "InputError", "OptionError", "OutputError"]


class DestroyedHandleError(RuntimeArgumentError):
    """The handle was destroyed (or is not a handle at all)."""


class InputError(RuntimeArgumentError):
    """``inputs`` breaks a rule: count, type, dtype, shape, layout or device."""


class OutputError(RuntimeArgumentError):
    """Caller-provided ``outputs`` break a rule: count, type, dtype, shape or device."""
