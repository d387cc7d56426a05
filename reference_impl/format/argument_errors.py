"""The runtime's argument errors that the format floor raises too.

``RuntimeArgumentError`` is the base of every contract violation of ``init`` / ``execute`` / ``destroy`` /
``execute_stats`` (a ``ValueError``, the suite's *invalid-argument* error). It lives below the runtime
because the I/O spec (``iospec.py``) raises ``IOSpecError`` for a malformed ``extra["io"]`` (a bad ``init``
argument) and checks tensors with the runtime's ``InputError`` / ``OutputError``, typed as its subclasses.
The runtime's own subclasses are in ``reference_impl/runtime/errors.py``.

They are not ``LoweringFormatError`` subclasses (``errors.py``, the containers' errors) on purpose.
"""

from __future__ import annotations

__all__ = ["IOSpecError", "RuntimeArgumentError"]


class RuntimeArgumentError(ValueError):
    """An argument of ``init`` / ``execute`` / ``destroy`` / ``execute_stats`` breaks a rule."""


class IOSpecError(RuntimeArgumentError):
    """A blob's input/output metadata (``extra["io"]``) is malformed."""
