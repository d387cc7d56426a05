"""Compile specs: ``(key, bytes)`` options handed to a backend's preprocess, as ExecuTorch's ``CompileSpec``.

The one key defined so far is ``method_name``: the name of the method a processed blob implements. The name
travels in the blob header too (see ``blob.py``), so the spec is optional; when both exist they must agree.

Method-name rules (shared by specs, blob headers and program manifests): a ``str`` that is non-empty, has no
NUL character, encodes to UTF-8 (no lone surrogates) and is at most ``MAX_METHOD_NAME_BYTES`` UTF-8 bytes.
Names are compared exactly: no case folding, no Unicode normalisation, no trimming.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from reference_impl.format.errors import (
    EmptyMethodNameError,
    MethodNameEncodingError,
    MethodNameNulError,
    MethodNameTooLongError,
    MethodNameTypeError,
    MissingMethodNameError,
)

#: Upstream runtime options cap string values at 255 characters; a name must fit in one.
MAX_METHOD_NAME_BYTES = 255


class CompileSpecKey(str, enum.Enum):
    """Known compile spec keys. A ``str`` enum, so ``CompileSpecKey.METHOD_NAME == "method_name"``."""

    METHOD_NAME = "method_name"


def _key_text(key: object) -> str:
    # str(CompileSpecKey.X) is "CompileSpecKey.X" on Python >= 3.11; the wire form is the value.
    return key.value if isinstance(key, CompileSpecKey) else str(key)


@dataclass(frozen=True)
class CompileSpec:
    """One compile option: a text key and an opaque byte value."""

    key: str
    value: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"CompileSpec key must be a str, got {type(self.key).__name__}")
        if isinstance(self.value, (bytearray, memoryview)):
            object.__setattr__(self, "value", bytes(self.value))
        if not isinstance(self.value, bytes):
            raise TypeError(f"CompileSpec value must be bytes, got {type(self.value).__name__}")
        # Store the plain string so equality, hashing and repr do not depend on how the key was spelled.
        object.__setattr__(self, "key", _key_text(self.key))


def validate_method_name(name: object, *, what: str = "method name") -> str:
    """``name`` if it obeys the method-name rules, else the specific ``InvalidMethodNameError``."""
    if not isinstance(name, str):
        raise MethodNameTypeError(f"{what} must be a str, got {type(name).__name__}")
    if not name:
        raise EmptyMethodNameError(f"{what} is empty; a method name must have at least one character")
    if "\0" in name:
        raise MethodNameNulError(f"{what} {name!r} contains NUL; method names must not contain '\\0'")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MethodNameEncodingError(
            f"{what} {name!r} cannot be encoded as UTF-8 ({exc.reason} at index {exc.start}); "
            "method names must be valid Unicode text"
        ) from None
    if len(encoded) > MAX_METHOD_NAME_BYTES:
        raise MethodNameTooLongError(
            f"{what} {name[:32]!r}... is {len(encoded)} UTF-8 bytes; "
            f"method names must be at most {MAX_METHOD_NAME_BYTES} bytes"
        )
    return name


def decode_method_name(value: object, *, what: str = "method name") -> str:
    """Decode a method name from UTF-8 bytes and validate it."""
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise MethodNameTypeError(f"{what} must be UTF-8 bytes, got {type(value).__name__}")
    try:
        name = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MethodNameEncodingError(
            f"{what} {value!r} is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
            "method names must be UTF-8 encoded"
        ) from None
    return validate_method_name(name, what=what)


def method_name_spec(name: str) -> CompileSpec:
    """The ``method_name`` compile spec for ``name`` (validated, UTF-8 encoded)."""
    return CompileSpec(CompileSpecKey.METHOD_NAME.value, validate_method_name(name).encode("utf-8"))


def find_method_name(specs: Sequence[CompileSpec]) -> str | None:
    """The method name of the first ``method_name`` spec, or ``None`` when there is none.

    Any object with ``key`` and ``value`` attributes is accepted, so ExecuTorch's own ``CompileSpec`` works.
    """
    for spec in specs:
        if _key_text(spec.key) == CompileSpecKey.METHOD_NAME.value:
            # First match wins (upstream behaviour); later duplicates are ignored, not merged.
            return decode_method_name(spec.value, what="'method_name' compile spec value")
    return None


def method_name_from_specs(specs: Sequence[CompileSpec]) -> str:
    """The method name carried by ``specs``; ``MissingMethodNameError`` naming the keys seen if absent."""
    name = find_method_name(specs)
    if name is None:
        seen = [_key_text(spec.key) for spec in specs]
        raise MissingMethodNameError(
            f"no {CompileSpecKey.METHOD_NAME.value!r} compile spec among {seen!r}; "
            "pass method_name_spec(name) or carry the name in the processed blob"
        )
    return name
