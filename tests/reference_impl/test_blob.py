"""The processed blob: versioned header + artifact, verified on every read (SPEC §1a "Method name")."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import pytest

from reference_impl.format import errors
from reference_impl.format.blob import BLOB_MAGIC, BlobContents, pack_blob, unpack_blob
from reference_impl.format.compile_spec import CompileSpec, method_name_spec

ARTIFACT = b"opaque AOTI package bytes \x00\x01\x02"


def make(method: str = "forward", *, artifact: Any = ARTIFACT, **overrides: Any) -> bytes:
    kwargs: dict[str, Any] = {
        "method_name": method,
        "device": "cpu",
        "torch_version": "2.13.0+cpu",
        "cuda_version": None,
    }
    kwargs.update(overrides)
    return pack_blob(artifact, **kwargs)


def frame(header: bytes, *, version: int = 1, magic: bytes = BLOB_MAGIC) -> bytes:
    """The documented envelope, written independently of the implementation (and with a valid checksum)."""
    head = struct.pack(">8sHI", magic, version, len(header)) + header
    return head + hashlib.sha256(head).digest()


def valid_header(**changes: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "method_name": "forward",
        "device": "cpu",
        "torch_version": "2.13.0",
        "cuda_version": None,
        "artifact_size": len(ARTIFACT),
        "artifact_sha256": hashlib.sha256(ARTIFACT).hexdigest(),
        "extra": {},
    }
    header.update(changes)
    return header


def test_round_trip_keeps_every_field() -> None:
    blob = make(
        "decoder",
        device="cuda",
        torch_version="2.13.0+cu128",
        cuda_version="12.8",
        extra={"fallback_kernels": ["aoti_torch_cuda_mm_out"], "pass_report": {"rewritten": 3}},
    )
    contents = unpack_blob(blob)
    assert contents == BlobContents(
        format_version=1,
        method_name="decoder",
        device="cuda",
        torch_version="2.13.0+cu128",
        cuda_version="12.8",
        artifact_sha256=hashlib.sha256(ARTIFACT).hexdigest(),
        artifact=ARTIFACT,
        extra={"fallback_kernels": ["aoti_torch_cuda_mm_out"], "pass_report": {"rewritten": 3}},
    )


def test_layout_matches_the_documentation() -> None:
    blob = make()
    magic, version, length = struct.unpack_from(">8sHI", blob)
    assert (magic, version) == (b"AOTIREF\0", 1)
    header = json.loads(blob[14 : 14 + length])
    assert header == valid_header(torch_version="2.13.0+cpu")
    assert blob[14 + length : 46 + length] == hashlib.sha256(blob[: 14 + length]).digest()
    assert blob[46 + length :] == ARTIFACT
    assert make() == blob  # deterministic: same inputs, same bytes


def test_empty_artifact_and_unicode_name() -> None:
    contents = unpack_blob(make("前向", artifact=b""))
    assert (contents.method_name, contents.artifact) == ("前向", b"")


def test_compile_spec_is_optional_and_must_agree() -> None:
    blob = make("encoder")
    assert unpack_blob(blob).method_name == "encoder"
    assert unpack_blob(blob, compile_specs=[method_name_spec("encoder")]).method_name == "encoder"
    assert unpack_blob(blob, compile_specs=[CompileSpec("other", b"x")]).method_name == "encoder"
    with pytest.raises(errors.MethodNameMismatchError) as info:
        unpack_blob(blob, compile_specs=[method_name_spec("decoder")])
    assert "'decoder'" in str(info.value)
    assert "'encoder'" in str(info.value)


def test_expected_method_must_agree() -> None:
    with pytest.raises(errors.MethodNameMismatchError, match=r"expected method 'decode'.*'prefill'"):
        unpack_blob(make("prefill"), expected_method="decode")


def test_bad_magic() -> None:
    blob = make()
    with pytest.raises(errors.BadMagicError, match=r"not the magic"):
        unpack_blob(b"PK\x03\x04" + blob[4:])
    with pytest.raises(errors.BadMagicError):
        unpack_blob(b"XY")


def test_every_truncation_is_reported_as_truncation() -> None:
    blob = make()
    for length in range(len(blob)):
        with pytest.raises(errors.TruncatedBlobError):
            unpack_blob(blob[:length])


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(errors.TrailingDataError, match=r"1 bytes follow"):
        unpack_blob(make() + b"\0")


def test_unsupported_version_says_which_are_supported() -> None:
    blob = bytearray(make())
    blob[8:10] = struct.pack(">H", 2)
    with pytest.raises(
        errors.UnsupportedFormatVersionError, match=r"version 2 .*supported versions are \[1\]"
    ):
        unpack_blob(bytes(blob))


def test_tampered_artifact_is_a_hash_mismatch() -> None:
    blob = bytearray(make("encoder"))
    blob[-1] ^= 0x01
    with pytest.raises(errors.ContentHashMismatchError, match=r"artifact of method 'encoder'"):
        unpack_blob(bytes(blob))


def test_tampered_header_is_a_checksum_error() -> None:
    blob = make(torch_version="2.13.0")
    tampered = blob.replace(b'"2.13.0"', b'"2.12.0"')
    with pytest.raises(errors.HeaderChecksumError, match=r"tampered"):
        unpack_blob(tampered)


def test_a_flip_anywhere_is_detected() -> None:
    blob = make()
    for position in range(len(blob)):
        flipped = bytearray(blob)
        flipped[position] ^= 0x20
        with pytest.raises(errors.LoweringFormatError):
            unpack_blob(bytes(flipped))


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"[1, 2]", "must be a JSON object"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"a": 1, "a": 2}', "key 'a' twice"),
        (json.dumps(valid_header(artifact_size=float("nan"))).encode(), "finite JSON numbers"),
    ],
)
def test_header_that_is_not_a_json_object(header: bytes, match: str) -> None:
    with pytest.raises(errors.MalformedHeaderError, match=match):
        unpack_blob(frame(header) + ARTIFACT)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"device": "tpu"}, "device must be one of"),
        ({"torch_version": "nightly"}, "MAJOR.MINOR"),
        ({"cuda_version": ""}, "cuda_version"),
        ({"artifact_size": True}, "'artifact_size' must be int"),
        ({"artifact_size": -1}, ">= 0"),
        ({"artifact_sha256": "ABC"}, "64 lowercase hex"),
        ({"extra": []}, "'extra' must be dict"),
        ({"unexpected": 1}, r"unknown keys \['unexpected'\]"),
    ],
)
def test_header_fields_are_checked(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(errors.MalformedHeaderError, match=match):
        unpack_blob(frame(json.dumps(valid_header(**changes)).encode()) + ARTIFACT)


def test_missing_header_key() -> None:
    header = valid_header()
    del header["device"]
    with pytest.raises(errors.MalformedHeaderError, match=r"missing keys \['device'\]"):
        unpack_blob(frame(json.dumps(header).encode()) + ARTIFACT)


def test_bad_method_name_in_header() -> None:
    header = json.dumps(valid_header(method_name="")).encode()
    with pytest.raises(errors.EmptyMethodNameError):
        unpack_blob(frame(header) + ARTIFACT)
    header = json.dumps(valid_header(method_name="\ud800")).encode()  # escaped lone surrogate
    with pytest.raises(errors.MethodNameEncodingError):
        unpack_blob(frame(header) + ARTIFACT)


def test_wrong_target_device() -> None:
    cpu_blob = make(device="cpu")
    cuda_blob = make(device="cuda", cuda_version="12.8")
    with pytest.raises(errors.WrongTargetError, match=r"built for device type 'cpu'.*'cuda:0'"):
        unpack_blob(cpu_blob, runtime_device="cuda:0")
    with pytest.raises(errors.WrongTargetError):
        unpack_blob(cuda_blob, runtime_device="cpu")
    assert unpack_blob(cuda_blob, runtime_device="cuda:1").device == "cuda"
    assert unpack_blob(cpu_blob, runtime_device="cpu").device == "cpu"


def test_toolchain_compares_major_minor() -> None:
    blob = make(torch_version="2.13.0+cpu")
    assert unpack_blob(blob, runtime_torch_version="2.13.1+cu128").torch_version == "2.13.0+cpu"
    with pytest.raises(errors.ToolchainMismatchError, match=r"torch 2\.13\.0\+cpu.*torch 2\.12\.0"):
        unpack_blob(blob, runtime_torch_version="2.12.0")
    with pytest.raises(errors.ToolchainMismatchError, match=r"major.minor"):
        unpack_blob(blob, runtime_torch_version="3.13.0")
    with pytest.raises(errors.ToolchainMismatchError, match=r"MAJOR.MINOR"):
        unpack_blob(blob, runtime_torch_version="unknown")


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"device": "cuda:0"}, errors.MalformedHeaderError),
        ({"torch_version": ""}, errors.MalformedHeaderError),
        ({"cuda_version": 12.8}, errors.MalformedHeaderError),
        ({"extra": {"x": object()}}, errors.MalformedHeaderError),
        ({"extra": {"x": float("inf")}}, errors.MalformedHeaderError),
        ({"extra": ["not", "a", "dict"]}, errors.MalformedHeaderError),
        ({"method_name": "a\0b"}, errors.MethodNameNulError),
        ({"method_name": ""}, errors.EmptyMethodNameError),
        ({"artifact": "text"}, errors.MalformedHeaderError),
    ],
)
def test_pack_rejects_bad_arguments(overrides: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        make(**overrides)


def test_unpack_rejects_non_bytes() -> None:
    with pytest.raises(errors.MalformedHeaderError, match=r"must be bytes"):
        unpack_blob("AOTIREF")  # type: ignore[arg-type]
    assert unpack_blob(memoryview(make())).artifact == ARTIFACT
