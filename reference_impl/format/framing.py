"""The self-checking envelope shared by processed blobs and program files.

Layout (all integers big-endian)::

    offset   size  field
    0        8     magic (identifies the format)
    8        2     format version, uint16
    10       4     metadata length L, uint32
    14       L     metadata: one JSON object, UTF-8, sorted keys, no insignificant whitespace
    14+L     32    SHA-256 of bytes [0, 14+L)  (magic, version, length and metadata)
    46+L     ...   body (its extent is declared by the metadata; the owner checks it)

Why a checksum over the metadata: without it, a flipped byte inside a JSON string (a version, a device) would
still parse and silently change meaning. With it, every byte of the envelope is checked. Reading never raises
anything but the ``LoweringFormatError`` subclasses named by the ``FrameKind``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

from reference_impl.format.errors import (
    BadMagicError,
    HeaderChecksumError,
    LoweringFormatError,
    TruncatedError,
    UnsupportedFormatVersionError,
)

_PREFIX = struct.Struct(">8sHI")
PREFIX_SIZE = _PREFIX.size  # 14
DIGEST_SIZE = hashlib.sha256().digest_size  # 32
_MAX_VERSION = 0xFFFF
_MAX_METADATA = 0xFFFFFFFF


@dataclass(frozen=True)
class FrameKind:
    """What one envelope format is called, how it starts, and which errors it raises."""

    noun: str  # "blob header" / "program manifest", used in messages
    magic: bytes
    supported_versions: frozenset[int]
    truncated: type[TruncatedError]
    malformed: type[LoweringFormatError]


@dataclass(frozen=True)
class Frame:
    """A decoded envelope: its version, its metadata object and where the body starts."""

    version: int
    metadata: dict[str, Any]
    body_offset: int


def encode_frame(kind: FrameKind, version: int, metadata: dict[str, Any]) -> bytes:
    """Magic, version, length-prefixed canonical JSON and its SHA-256; the caller appends the body."""
    if not 0 <= version <= _MAX_VERSION:
        raise kind.malformed(f"{kind.noun} version {version} does not fit in uint16")
    try:
        text = json.dumps(
            metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        encoded = text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # unserialisable value, NaN, lone surrogate
        raise kind.malformed(f"{kind.noun} is not representable as UTF-8 JSON: {exc}") from None
    if len(encoded) > _MAX_METADATA:
        raise kind.malformed(f"{kind.noun} is {len(encoded)} bytes; the limit is {_MAX_METADATA}")
    head = _PREFIX.pack(kind.magic, version, len(encoded)) + encoded
    return head + hashlib.sha256(head).digest()


def _reject_duplicate_keys(kind: FrameKind, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two values for one key would make one of them carry no meaning; refuse rather than pick one.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise kind.malformed(f"{kind.noun} has the key {key!r} twice; JSON keys must be unique")
        result[key] = value
    return result


def _reject_constant(kind: FrameKind, name: str) -> Any:
    raise kind.malformed(f"{kind.noun} contains {name}; only finite JSON numbers are allowed")


def decode_frame(kind: FrameKind, data: bytes) -> Frame:
    """Check magic, version, length and checksum, then parse the metadata object."""
    size = len(data)
    if size < len(kind.magic):
        if data == kind.magic[:size]:
            raise kind.truncated(
                f"{kind.noun}: data is {size} bytes, shorter than the {len(kind.magic)}-byte magic"
            )
        raise BadMagicError(f"{kind.noun}: data starts with {bytes(data)!r}, not the magic {kind.magic!r}")
    if data[: len(kind.magic)] != kind.magic:
        raise BadMagicError(
            f"{kind.noun}: data starts with {bytes(data[: len(kind.magic)])!r}, not the magic {kind.magic!r}"
        )
    if size < PREFIX_SIZE:
        raise kind.truncated(
            f"{kind.noun}: data is {size} bytes; the magic, version and length need {PREFIX_SIZE}"
        )
    _, version, length = _PREFIX.unpack_from(data, 0)
    if version not in kind.supported_versions:
        raise UnsupportedFormatVersionError(
            f"{kind.noun}: format version {version} is not supported; "
            f"supported versions are {sorted(kind.supported_versions)}"
        )
    end = PREFIX_SIZE + length
    if size < end + DIGEST_SIZE:
        raise kind.truncated(
            f"{kind.noun}: declares {length} bytes of metadata plus a {DIGEST_SIZE}-byte checksum, "
            f"but only {size - PREFIX_SIZE} bytes follow the prefix (truncated or corrupt)"
        )
    recorded = bytes(data[end : end + DIGEST_SIZE])
    actual = hashlib.sha256(data[:end]).digest()
    if recorded != actual:
        raise HeaderChecksumError(
            f"{kind.noun}: SHA-256 is {actual.hex()} but {recorded.hex()} is recorded; "
            "the data is corrupt or was tampered with"
        )
    try:
        metadata = json.loads(
            bytes(data[PREFIX_SIZE:end]).decode("utf-8"),
            object_pairs_hook=lambda pairs: _reject_duplicate_keys(kind, pairs),
            parse_constant=lambda name: _reject_constant(kind, name),
        )
    except UnicodeDecodeError as exc:
        raise kind.malformed(f"{kind.noun} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise kind.malformed(f"{kind.noun} is not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise kind.malformed(f"{kind.noun} must be a JSON object, got {type(metadata).__name__}")
    return Frame(version=version, metadata=metadata, body_offset=end + DIGEST_SIZE)


def expect_keys(kind: FrameKind, obj: dict[str, Any], keys: frozenset[str], where: str) -> None:
    """Require exactly ``keys``: a missing key is malformed, and so is an unknown one (it means nothing)."""
    missing = sorted(keys - obj.keys())
    unknown = sorted(obj.keys() - keys)
    if missing or unknown:
        raise kind.malformed(
            f"{where}: missing keys {missing}, unknown keys {unknown}; expected exactly {sorted(keys)}"
        )


def expect_field(
    kind: FrameKind, obj: dict[str, Any], key: str, types: type | tuple[type, ...], where: str
) -> Any:
    """``obj[key]`` if it has one of ``types`` (``bool`` never passes for ``int``), else a malformed error."""
    value = obj.get(key)
    allowed = types if isinstance(types, tuple) else (types,)
    # JSON true/false load as bool, a subclass of int: never accept one where a number is required.
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
        raise kind.malformed(f"{where}: {key!r} must be {names}, got {value!r}")
    return value
