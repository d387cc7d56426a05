"""The processed blob a backend's preprocess returns for one method: a versioned header plus the artifact.

Byte layout (the envelope of ``framing.py``; integers big-endian)::

    0      8   magic b"AOTIREF\\0"
    8      2   format version, uint16 (supported: 1)
    10     4   header length H, uint32
    14     H   header JSON (UTF-8, sorted keys, compact), exactly these keys:
                 method_name      str   (method-name rules of compile_spec.py)
                 device           "cpu" | "cuda"   (device *type* the artifact targets)
                 torch_version    str   ("MAJOR.MINOR...", the torch that built it)
                 cuda_version     str | null
                 artifact_size    int   (N)
                 artifact_sha256  str   (64 lowercase hex digits)
                 extra            object (free-form JSON: fallback kernels, pass report, ...)
    14+H   32  SHA-256 of bytes [0, 14+H)
    46+H   N   artifact bytes (opaque: an AOTInductor package); nothing may follow

Carrying the method name here means users need not pass a ``method_name`` compile spec; when they do, it
must agree. Every byte is checked on read: a flip anywhere is an error, never a silent change.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reference_impl.format.compile_spec import CompileSpec, find_method_name, validate_method_name
from reference_impl.format.errors import (
    ContentHashMismatchError,
    LoweringFormatError,
    MalformedHeaderError,
    MethodNameMismatchError,
    ToolchainMismatchError,
    TrailingDataError,
    TruncatedBlobError,
    WrongTargetError,
)
from reference_impl.format.framing import FrameKind, decode_frame, encode_frame, expect_field, expect_keys

BLOB_MAGIC = b"AOTIREF\0"
BLOB_FORMAT_VERSION = 1
SUPPORTED_BLOB_VERSIONS = frozenset({BLOB_FORMAT_VERSION})
DEVICE_TYPES = ("cpu", "cuda")

BLOB_FRAME = FrameKind(
    noun="blob header",
    magic=BLOB_MAGIC,
    supported_versions=SUPPORTED_BLOB_VERSIONS,
    truncated=TruncatedBlobError,
    malformed=MalformedHeaderError,
)
_HEADER_KEYS = frozenset(
    {"method_name", "device", "torch_version", "cuda_version", "artifact_size", "artifact_sha256", "extra"}
)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MAJOR_MINOR = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True)
class BlobContents:
    """A decoded, verified blob: its header fields and the artifact bytes."""

    format_version: int
    method_name: str
    device: str
    torch_version: str
    cuda_version: str | None
    artifact_sha256: str
    artifact: bytes = field(repr=False)
    extra: dict[str, Any] = field(default_factory=dict)


def torch_major_minor(version: str, *, what: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``"2.13.0+cu128"``."""
    match = _MAJOR_MINOR.match(version) if isinstance(version, str) else None
    if match is None:
        raise ToolchainMismatchError(f"{what} {version!r} does not start with MAJOR.MINOR (e.g. '2.13.0')")
    return int(match.group(1)), int(match.group(2))


def check_runtime_compat(
    *,
    subject: str,
    device: str,
    torch_version: str,
    runtime_device: str | None,
    runtime_torch_version: str | None,
) -> None:
    """Refuse an artifact built for another device type, or another torch major.minor, than the runtime's."""
    if runtime_device is not None:
        runtime_type = str(runtime_device).split(":", 1)[0]  # "cuda:1" runs artifacts built for "cuda"
        if runtime_type != device:
            raise WrongTargetError(
                f"{subject} was built for device type {device!r} "
                f"but the runtime device is {runtime_device!r}; "
                "an artifact runs only on the device type it was compiled for"
            )
    if runtime_torch_version is not None:
        built = torch_major_minor(torch_version, what=f"{subject} torch version")
        running = torch_major_minor(runtime_torch_version, what="runtime torch version")
        if built != running:
            raise ToolchainMismatchError(
                f"{subject} was built with torch {torch_version} "
                f"but the runtime is torch {runtime_torch_version}; "
                "major.minor versions must match (AOTInductor artifacts are not ABI-stable across them)"
            )


def check_target_fields(
    device: object,
    torch_version: object,
    cuda_version: object,
    *,
    where: str,
    error: type[LoweringFormatError] = MalformedHeaderError,
) -> None:
    """Device type, torch and CUDA version rules, shared by blob headers and program manifests."""
    if device not in DEVICE_TYPES:
        raise error(f"{where}: device must be one of {list(DEVICE_TYPES)}, got {device!r}")
    if not isinstance(torch_version, str) or _MAJOR_MINOR.match(torch_version) is None:
        raise error(f"{where}: torch_version must be a str starting with MAJOR.MINOR, got {torch_version!r}")
    if cuda_version is not None and (not isinstance(cuda_version, str) or not cuda_version):
        raise error(f"{where}: cuda_version must be a non-empty str or None, got {cuda_version!r}")


def pack_blob(
    artifact: bytes,
    *,
    method_name: str,
    device: str,
    torch_version: str,
    cuda_version: str | None,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """Wrap ``artifact`` in a versioned header naming its method, target and toolchain."""
    if not isinstance(artifact, (bytes, bytearray, memoryview)):
        raise MalformedHeaderError(f"artifact must be bytes, got {type(artifact).__name__}")
    artifact = bytes(artifact)
    # Same rules as unpack, so a blob that packs always unpacks.
    validate_method_name(method_name, what="pack_blob method name")
    check_target_fields(device, torch_version, cuda_version, where="pack_blob")
    if extra is not None and not isinstance(extra, dict):
        raise MalformedHeaderError(f"pack_blob: extra must be a dict or None, got {type(extra).__name__}")
    header = {
        "method_name": method_name,
        "device": device,
        "torch_version": torch_version,
        "cuda_version": cuda_version,
        "artifact_size": len(artifact),
        "artifact_sha256": hashlib.sha256(artifact).hexdigest(),
        "extra": dict(extra or {}),
    }
    return encode_frame(BLOB_FRAME, BLOB_FORMAT_VERSION, header) + artifact


def _parse(data: bytes) -> BlobContents:
    frame = decode_frame(BLOB_FRAME, data)
    header = frame.metadata
    expect_keys(BLOB_FRAME, header, _HEADER_KEYS, "blob header")
    where = "blob header"
    method_name = expect_field(BLOB_FRAME, header, "method_name", str, where)
    device = expect_field(BLOB_FRAME, header, "device", str, where)
    torch_version = expect_field(BLOB_FRAME, header, "torch_version", str, where)
    cuda_version = expect_field(BLOB_FRAME, header, "cuda_version", (str, type(None)), where)
    size = expect_field(BLOB_FRAME, header, "artifact_size", int, where)
    digest = expect_field(BLOB_FRAME, header, "artifact_sha256", str, where)
    extra = expect_field(BLOB_FRAME, header, "extra", dict, where)
    validate_method_name(method_name, what="blob header method name")
    check_target_fields(device, torch_version, cuda_version, where=where)
    if size < 0:
        raise MalformedHeaderError(f"blob header: artifact_size must be >= 0, got {size}")
    if _SHA256_HEX.fullmatch(digest) is None:
        raise MalformedHeaderError(
            f"blob header: artifact_sha256 must be 64 lowercase hex digits, got {digest!r}"
        )

    available = len(data) - frame.body_offset
    if available < size:
        raise TruncatedBlobError(
            f"blob for method {method_name!r} declares a {size}-byte artifact "
            f"but only {available} bytes follow the header (truncated)"
        )
    if available > size:
        raise TrailingDataError(
            f"blob for method {method_name!r}: {available - size} bytes follow "
            f"the declared {size}-byte artifact; a blob must end where its artifact ends"
        )
    artifact = bytes(data[frame.body_offset :])
    actual = hashlib.sha256(artifact).hexdigest()
    if actual != digest:
        raise ContentHashMismatchError(
            f"artifact of method {method_name!r} has SHA-256 {actual} but the header records {digest}; "
            "the artifact is corrupt or was tampered with"
        )
    return BlobContents(
        format_version=frame.version,
        method_name=method_name,
        device=device,
        torch_version=torch_version,
        cuda_version=cuda_version,
        artifact_sha256=digest,
        artifact=artifact,
        extra=extra,
    )


def unpack_blob(
    data: bytes,
    *,
    expected_method: str | None = None,
    compile_specs: Sequence[CompileSpec] | None = None,
    runtime_torch_version: str | None = None,
    runtime_device: str | None = None,
) -> BlobContents:
    """Verify and decode a blob; optionally check it against the caller's method name, specs and runtime.

    ``compile_specs`` is optional; when it holds a ``method_name`` spec, that name must equal the blob's.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedHeaderError(f"blob must be bytes, got {type(data).__name__}")
    contents = _parse(data)
    if expected_method is not None and expected_method != contents.method_name:
        raise MethodNameMismatchError(
            f"expected method {expected_method!r} but the blob header names {contents.method_name!r}; "
            "a blob must be used under the name it was built for"
        )
    if compile_specs is not None:
        spec_name = find_method_name(compile_specs)
        if spec_name is not None and spec_name != contents.method_name:
            raise MethodNameMismatchError(
                f"the 'method_name' compile spec says {spec_name!r} but the blob header names "
                f"{contents.method_name!r}; when both are given they must agree"
            )
    check_runtime_compat(
        subject=f"blob for method {contents.method_name!r}",
        device=contents.device,
        torch_version=contents.torch_version,
        runtime_device=runtime_device,
        runtime_torch_version=runtime_torch_version,
    )
    return contents
