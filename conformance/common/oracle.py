"""The differential oracle: the same protocol call made on a second backend, and how the two answers are
compared — what must agree, and the differences the spec allows (each listed once, with its sentence).

The oracle is a backend like any other, loaded by the one backend loader from ``--oracle`` (default
``reference_impl:ORACLE``: the reference with options of its own, so that a backend under test that wraps the
reference cannot change what the oracle sees). It answers one question per call: *is this call an error,
and of which kind?* Values are never judged against the oracle's values: both are judged against float64
eager PyTorch, so a backend that rounds differently from the reference still passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from conformance.common.checks import fail, names_argument
from conformance.common.rules import rule_id
from conformance.protocol import Backend

DEFAULT_ORACLE = "reference_impl:ORACLE"
ORACLE_KEY = pytest.StashKey[Backend]()
ORACLE_SPEC_KEY = pytest.StashKey[str]()

# The rules this module checks (conformance/catalogue/rule_table.py).
SPURIOUS_ERROR = rule_id("differential/spurious-error")
MISSING_ERROR = rule_id("differential/missing-error")
ERROR_CLASS = rule_id("differential/error-class")
ERROR_ARGUMENT = rule_id("differential/error-argument")
#: What :func:`judge` fails a call with: a case judging calls declares these
#: (conformance/common/declared_rules.py).
JUDGED = (SPURIOUS_ERROR, MISSING_ERROR, ERROR_CLASS, ERROR_ARGUMENT)


@dataclass(frozen=True)
class AllowedDifference:
    """A way a correct backend may differ from the oracle, and the spec sentence that allows it."""

    what: str
    sentence: str
    source: str


#: Every difference the chapter tolerates. Nothing else may differ.
ALLOWED_DIFFERENCES: tuple[AllowedDifference, ...] = (
    AllowedDifference(
        "the exception raised for a contract violation is any ValueError (its own subclass or none)",
        "A contract violation raises an *invalid-argument* error: an instance of ``ValueError`` (a subclass "
        "is welcome)",
        "conformance/protocol.py",
    ),
    AllowedDifference(
        "error messages are worded freely; they must name the argument the oracle's message names",
        "whose message names the offending argument",
        "conformance/protocol.py",
    ),
    AllowedDifference(
        "output values differ within the dtype's tolerance of float64 eager, not bit for bit from the oracle",
        "eager PyTorch in float64; per-dtype tolerances in one place",
        "SPEC §2",
    ),
    AllowedDifference(
        "program bytes, their size and format differ",
        "returns one program file (its format is the backend's own business)",
        "conformance/protocol.py",
    ),
    AllowedDifference(
        "byte counters after an execute with a non-contiguous host input or a failed execute are not "
        "compared (a backend may move a strided tensor's storage as it likes, and a failed call moved "
        "nothing the spec counts)",
        "Per-execute counters of bytes moved host→device and device→host",
        "SPEC §1b",
    ),
    AllowedDifference(
        "the layout (strides) of returned outputs, and whether outputs= tensors are the returned objects",
        "Outputs are CPU tensors unless the method keeps them on the device",
        "conformance/protocol.py",
    ),
    AllowedDifference(
        "a backend that cannot lower a model at all (it fails without options too) is a coverage gap there",
        "A backend that cannot lower something raises ``ValueError`` (unsupported kernels, bad names) naming "
        "what and why",
        "conformance/protocol.py",
    ),
)


@dataclass
class CallResult:
    """What one call did: its return value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def kind(self) -> str:
        """``ok``, ``invalid-argument`` (ValueError), ``library`` (RuntimeError), ``type-error`` or the
        exception's class name: the categories the protocol distinguishes."""
        return "ok" if self.error is None else error_kind(self.error)

    def describe(self) -> str:
        if self.error is None:
            return "returned normally"
        return f"raised {type(self.error).__name__}: {_first_line(self.error)}"


def error_kind(exc: BaseException) -> str:
    if isinstance(exc, ValueError):
        return "invalid-argument"
    if isinstance(exc, TypeError):
        return "type-error"
    if isinstance(exc, RuntimeError):
        return "library"
    return type(exc).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [""])[0][:300]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CallResult:
    """Run one protocol call and keep what it did (a crash of the call is an outcome, not a test error)."""
    try:
        return CallResult(value=fn(*args, **kwargs))
    except Exception as exc:
        return CallResult(error=exc)


#: Arguments an error message may blame, by call; the oracle's message says which one it blamed.
BLAMED: dict[str, tuple[str, ...]] = {
    "execute": ("outputs", "inputs", "handle"),
    "init": ("program", "method"),
    "destroy": ("handle",),
    "execute_stats": ("handle",),
    "set_option": ("key", "value"),
    "get_option": ("key",),
    "lower": ("skip_h2d_for_method_inputs", "skip_d2h_for_method_outputs", "options", "methods"),
    "mm_out": ("out", "self", "mat2"),
}
#: Words that name an argument in the oracle's messages, beyond the argument's own name.
_ALIASES: dict[str, tuple[str, ...]] = {
    "key": ("option key", "key"),
    "value": ("value", "must be a str"),
    "method": ("method",),
    "program": ("program", "file", "manifest", "blob", "magic", "truncat", "checksum"),
}


def blamed_argument(function: str, message: str) -> str | None:
    """The argument of ``function`` the oracle's ``message`` names first, if any."""
    for argument in BLAMED.get(function, ()):
        if names_argument(message, argument):
            return argument
    return None


def _names(message: str, argument: str) -> bool:
    if names_argument(message, argument):
        return True
    lowered = message.lower()
    return any(re.search(rf"(?<!\w){re.escape(word)}", lowered) for word in _ALIASES.get(argument, ()))


def judge(
    function: str,
    call_text: str,
    got: CallResult,
    want: CallResult,
    also_broken: Sequence[str] = (),
) -> None:
    """The backend's outcome of one call against the oracle's, on what the spec determines.

    * the oracle returned and the backend raised: a valid call was refused (``differential/spurious-error``);
    * the oracle raised an invalid-argument error and the backend returned: a contract error is missing
      (``differential/missing-error``);
    * both raised, of different kinds (a ValueError subclass is a ValueError): ``differential/error-class``;
    * both raised, and the backend's message does not name the argument the oracle's names:
      ``differential/error-argument``. Where the call broke several arguments (``also_broken``: the others
      the oracle rejects on their own), naming any of them is right: which is checked first is the
      backend's business.
    """
    if want.ok and got.ok:
        return
    if want.ok:
        fail(
            SPURIOUS_ERROR,
            call_text,
            f"the oracle accepts this call, the backend {got.describe()}",
        )
    if got.ok:
        if want.kind in ("invalid-argument", "type-error"):
            fail(
                MISSING_ERROR,
                call_text,
                f"must be rejected (the oracle {want.describe()}); the backend returned normally",
            )
        return  # the oracle failed in its library: nothing the spec asks of the backend
    if got.kind != want.kind:
        fail(
            ERROR_CLASS,
            call_text,
            f"the backend {got.describe()} where the oracle raised a {want.kind} error "
            f"({type(want.error).__name__}: {_first_line(want.error)})",  # type: ignore[arg-type]
        )
    argument = blamed_argument(function, str(want.error))
    accepted = [a for a in (argument, *also_broken) if a is not None]
    if argument is not None and not any(_names(str(got.error), a) for a in accepted):
        fail(
            ERROR_ARGUMENT,
            call_text,
            f"the error must name the argument {argument!r} (as the oracle's does: "
            f"{_first_line(want.error)!r}); the backend said {_first_line(got.error)!r}",  # type: ignore[arg-type]
        )


def describe_args(args: Sequence[object]) -> str:
    return ", ".join(_short(a) for a in args)


#: Containers nested deeper than this are shown by their length.
_SHORT_DEPTH = 3


def _short(value: object, depth: int = 0) -> str:
    """A short description of an argument: a call's text is built for every monitored call, so it never
    formats a tensor's values or a module's tree (``repr`` of a ``lower`` call's ``methods`` did both, and
    was a fifth of a warm GPU run's case time)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            layout = f" {str(value.layout).removeprefix('torch.')}"
        else:
            layout = "" if value.is_contiguous() else f" strides {tuple(value.stride())}"
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}@{value.device}{layout}"
    if isinstance(value, torch.nn.Module):
        return f"<{type(value).__name__}>"
    if isinstance(value, (list, tuple, Mapping)) and depth >= _SHORT_DEPTH:
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_short(v, depth + 1) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(f"{_short(k, depth + 1)}: {_short(v, depth + 1)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
