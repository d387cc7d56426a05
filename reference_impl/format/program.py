"""A multi-method program (``encoder`` + ``decoder``, ``prefill`` + ``decode``) in one file.

Byte layout (the envelope of ``framing.py``; integers big-endian)::

    0      8   magic b"AOTIPRG\\0"
    8      2   format version, uint16 (supported: 1)
    10     4   manifest length M, uint32
    14     M   manifest JSON (UTF-8, sorted keys, compact), exactly these keys:
                 methods        [{name, offset, length, sha256}, ...]   in file order, at least one
                 device         "cpu" | "cuda"
                 torch_version  str
                 cuda_version   str | null
                 created_by     {str: str}   (tool, tool version, Python; no timestamp, so output is
                                               reproducible and content-cacheable)
    14+M   32  SHA-256 of bytes [0, 14+M)
    46+M   ... the method blobs (``blob.py``), concatenated in manifest order; method i occupies
               [46+M+offset_i, 46+M+offset_i+length_i); offsets are contiguous from 0, nothing follows

Why a custom container rather than a zip: a zip has many bytes that carry no meaning (timestamps, extra
fields, a central directory duplicating local headers), CRC-32 is no tamper check, and ``zipfile`` raises a
zoo of exception types on truncated input. Here every byte is covered by a check, so any truncation or flipped
byte is reported as a ``LoweringFormatError`` and nothing else.

Reading checks, in order: envelope (magic, version, checksum, JSON), manifest schema, file length, each
method's SHA-256, each blob's own header (its method name, device and toolchain must match the manifest), and
finally the runtime's device type and torch version when given.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from reference_impl._version import __version__
from reference_impl.format.blob import (
    BlobContents,
    check_runtime_compat,
    check_target_fields,
    unpack_blob,
)
from reference_impl.format.compile_spec import validate_method_name
from reference_impl.format.errors import (
    ContentHashMismatchError,
    DuplicateMethodError,
    EmptyProgramError,
    MalformedManifestError,
    ManifestMismatchError,
    TrailingDataError,
    TruncatedProgramError,
    UnknownMethodError,
)
from reference_impl.format.framing import FrameKind, decode_frame, encode_frame, expect_field, expect_keys

PROGRAM_MAGIC = b"AOTIPRG\0"
PROGRAM_FORMAT_VERSION = 1
SUPPORTED_PROGRAM_VERSIONS = frozenset({PROGRAM_FORMAT_VERSION})

PROGRAM_FRAME = FrameKind(
    noun="program manifest",
    magic=PROGRAM_MAGIC,
    supported_versions=SUPPORTED_PROGRAM_VERSIONS,
    truncated=TruncatedProgramError,
    malformed=MalformedManifestError,
)
_MANIFEST_KEYS = frozenset({"methods", "device", "torch_version", "cuda_version", "created_by"})
_ENTRY_KEYS = frozenset({"name", "offset", "length", "sha256"})
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_UNSET: Any = object()


def default_created_by() -> dict[str, str]:
    """Creation info recorded in new manifests: which tool wrote the file, and under which Python."""
    return {"tool": "reference_impl", "tool_version": __version__, "python": platform.python_version()}


@dataclass(frozen=True)
class MethodEntry:
    """One manifest row: where a method's blob lies in the blob section, and its SHA-256."""

    name: str
    offset: int
    length: int
    sha256: str


@dataclass(frozen=True)
class Program:
    """Named method blobs (in order) plus the manifest fields they share. Validated on construction."""

    methods: Mapping[str, bytes] = field(repr=False)
    device: str
    torch_version: str
    cuda_version: str | None
    created_by: Mapping[str, str] = field(default_factory=default_created_by)
    format_version: int = PROGRAM_FORMAT_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.methods, Mapping):
            raise MalformedManifestError(f"program methods must map names to blobs, got {self.methods!r}")
        if not self.methods:
            raise EmptyProgramError("a program needs at least one method; none were given")
        check_target_fields(
            self.device, self.torch_version, self.cuda_version, where="program", error=MalformedManifestError
        )
        _check_created_by(self.created_by)
        # Read-only copies: a Program is a value, and its manifest must keep describing its blobs.
        methods = {validate_method_name(name): bytes(blob) for name, blob in self.methods.items()}
        for name, blob in methods.items():
            _check_blob_agrees(self, name, blob)
        object.__setattr__(self, "methods", MappingProxyType(methods))
        object.__setattr__(self, "created_by", MappingProxyType(dict(self.created_by)))

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(self.methods)

    def method(self, name: str) -> bytes:
        """The blob of method ``name``; ``UnknownMethodError`` listing the available methods otherwise."""
        try:
            return self.methods[name]
        except (KeyError, TypeError):
            raise UnknownMethodError(
                f"program has no method {name!r}; available methods: {list(self.methods)}"
            ) from None

    def contents(self, name: str) -> BlobContents:
        """The decoded blob (header fields and artifact) of method ``name``."""
        return unpack_blob(self.method(name), expected_method=name)

    def entries(self) -> tuple[MethodEntry, ...]:
        """The manifest rows, with offsets relative to the start of the blob section."""
        rows, offset = [], 0
        for name, blob in self.methods.items():
            rows.append(MethodEntry(name, offset, len(blob), hashlib.sha256(blob).hexdigest()))
            offset += len(blob)
        return tuple(rows)

    def manifest(self) -> dict[str, Any]:
        """The manifest object exactly as written to the file."""
        return {
            "methods": [vars(entry).copy() for entry in self.entries()],
            "device": self.device,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "created_by": dict(self.created_by),
        }


def _check_created_by(created_by: object) -> None:
    if not isinstance(created_by, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in created_by.items()
    ):
        raise MalformedManifestError(f"program created_by must map str to str, got {created_by!r}")


def _check_blob_agrees(program: Program, name: str, blob: bytes) -> None:
    """The blob's own header must name ``name`` and share the program's device and toolchain."""
    contents = unpack_blob(blob, expected_method=name)  # MethodNameMismatchError names both names
    for attr in ("device", "torch_version", "cuda_version"):
        ours, theirs = getattr(program, attr), getattr(contents, attr)
        if ours != theirs:
            raise ManifestMismatchError(
                f"method {name!r}: its blob header says {attr}={theirs!r} but the program manifest says "
                f"{attr}={ours!r}; every method of a program must be built for the same target and toolchain"
            )


def build_program(
    pairs: Iterable[tuple[str, bytes]],
    *,
    device: str | None = None,
    torch_version: str | None = None,
    cuda_version: str | None = _UNSET,
    created_by: Mapping[str, str] | None = None,
) -> Program:
    """A program from ``(name, blob)`` pairs in order, rejecting duplicate names.

    Device, torch and CUDA versions default to those in the first blob's header; given explicitly, every blob
    must agree with them (``ManifestMismatchError`` otherwise).
    """
    methods: dict[str, bytes] = {}
    for name, blob in pairs:
        validate_method_name(name)
        if name in methods:
            raise DuplicateMethodError(
                f"method {name!r} appears twice; method names in a program must be unique"
            )
        methods[name] = blob
    if not methods:
        raise EmptyProgramError("a program needs at least one method; none were given")
    first_name, first_blob = next(iter(methods.items()))
    first = unpack_blob(first_blob, expected_method=first_name)
    return Program(
        methods=methods,
        device=first.device if device is None else device,
        torch_version=first.torch_version if torch_version is None else torch_version,
        cuda_version=first.cuda_version if cuda_version is _UNSET else cuda_version,
        created_by=default_created_by() if created_by is None else created_by,
    )


def program_to_bytes(program: Program) -> bytes:
    """The file image of ``program``: envelope with the manifest, then the blobs in manifest order."""
    return encode_frame(PROGRAM_FRAME, program.format_version, program.manifest()) + b"".join(
        program.methods.values()
    )


def _parse_entries(raw: object) -> list[MethodEntry]:
    where = "program manifest"
    if not isinstance(raw, list):
        raise MalformedManifestError(f"{where}: 'methods' must be a list, got {raw!r}")
    if not raw:
        raise EmptyProgramError(f"{where}: 'methods' is empty; a program needs at least one method")
    entries: list[MethodEntry] = []
    seen: set[str] = set()
    expected_offset = 0
    for index, row in enumerate(raw):
        at = f"{where} methods[{index}]"
        if not isinstance(row, dict):
            raise MalformedManifestError(f"{at} must be an object, got {row!r}")
        expect_keys(PROGRAM_FRAME, row, _ENTRY_KEYS, at)
        name = validate_method_name(expect_field(PROGRAM_FRAME, row, "name", str, at), what=f"{at} name")
        if name in seen:
            raise DuplicateMethodError(f"{at}: method {name!r} appears twice; method names must be unique")
        seen.add(name)
        offset = expect_field(PROGRAM_FRAME, row, "offset", int, at)
        length = expect_field(PROGRAM_FRAME, row, "length", int, at)
        digest = expect_field(PROGRAM_FRAME, row, "sha256", str, at)
        if offset != expected_offset:
            raise MalformedManifestError(
                f"{at} ({name!r}) has offset {offset}, expected {expected_offset}; "
                "blobs are stored contiguously in manifest order"
            )
        if length <= 0:
            raise MalformedManifestError(f"{at} ({name!r}) has length {length}; a blob is never empty")
        if _SHA256_HEX.fullmatch(digest) is None:
            raise MalformedManifestError(f"{at} ({name!r}): sha256 must be 64 lowercase hex digits")
        entries.append(MethodEntry(name, offset, length, digest))
        expected_offset += length
    return entries


def program_from_bytes(
    data: bytes,
    *,
    runtime_device: str | None = None,
    runtime_torch_version: str | None = None,
) -> Program:
    """Verify and decode a program file image; optionally check it against the runtime."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedManifestError(f"program data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    frame = decode_frame(PROGRAM_FRAME, data)
    manifest = frame.metadata
    where = "program manifest"
    expect_keys(PROGRAM_FRAME, manifest, _MANIFEST_KEYS, where)
    entries = _parse_entries(manifest["methods"])
    device, torch_version, cuda_version = (manifest[k] for k in ("device", "torch_version", "cuda_version"))
    check_target_fields(device, torch_version, cuda_version, where=where, error=MalformedManifestError)
    created_by = manifest["created_by"]
    _check_created_by(created_by)

    body = data[frame.body_offset :]
    total = sum(entry.length for entry in entries)
    if len(body) < total:
        raise TruncatedProgramError(
            f"program declares {total} bytes of method blobs but only {len(body)} follow the manifest "
            f"(truncated); methods: {[entry.name for entry in entries]}"
        )
    if len(body) > total:
        raise TrailingDataError(
            f"program: {len(body) - total} bytes follow the last method blob; the file must end there"
        )
    methods: dict[str, bytes] = {}
    for entry in entries:
        blob = body[entry.offset : entry.offset + entry.length]
        actual = hashlib.sha256(blob).hexdigest()
        if actual != entry.sha256:
            raise ContentHashMismatchError(
                f"method {entry.name!r}: blob SHA-256 is {actual} but the manifest records {entry.sha256}; "
                "the file is corrupt or was tampered with"
            )
        methods[entry.name] = blob
    program = Program(
        methods=methods,
        device=device,
        torch_version=torch_version,
        cuda_version=cuda_version,
        created_by=created_by,
        format_version=frame.version,
    )
    check_runtime_compat(
        subject="program",
        device=program.device,
        torch_version=program.torch_version,
        runtime_device=runtime_device,
        runtime_torch_version=runtime_torch_version,
    )
    return program


def write_program(
    path: str | os.PathLike[str],
    blobs: Mapping[str, bytes],
    *,
    device: str,
    torch_version: str,
    cuda_version: str | None,
    created_by: Mapping[str, str] | None = None,
) -> None:
    """Write a program file atomically: a reader sees the old file or the whole new one, never a prefix."""
    program = build_program(
        blobs.items(),
        device=device,
        torch_version=torch_version,
        cuda_version=cuda_version,
        created_by=created_by,
    )
    data = program_to_bytes(program)
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; a program file is meant to be shared
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def read_program(
    path: str | os.PathLike[str],
    *,
    runtime_device: str | None = None,
    runtime_torch_version: str | None = None,
) -> Program:
    """Read and verify a program file (``OSError`` for I/O problems, ``LoweringFormatError`` for content)."""
    data = Path(path).read_bytes()
    return program_from_bytes(
        data, runtime_device=runtime_device, runtime_torch_version=runtime_torch_version
    )
