"""The multi-method program file: one manifest, many method blobs (SPEC §1a "Program")."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from reference_impl.format import errors
from reference_impl.format.blob import pack_blob
from reference_impl.format.program import (
    PROGRAM_MAGIC,
    MethodEntry,
    Program,
    build_program,
    program_from_bytes,
    program_to_bytes,
    read_program,
    write_program,
)

TORCH = "2.13.0+cpu"


def blob(name: str, artifact: bytes | None = None, **overrides: Any) -> bytes:
    kwargs: dict[str, Any] = {"device": "cpu", "torch_version": TORCH, "cuda_version": None}
    kwargs.update(overrides)
    payload = artifact if artifact is not None else f"artifact of {name}".encode()
    return pack_blob(payload, method_name=name, **kwargs)


def two_methods() -> dict[str, bytes]:
    return {"encoder": blob("encoder"), "decoder": blob("decoder")}


def small_file() -> bytes:
    return program_to_bytes(build_program(two_methods().items()))


def frame(manifest: dict[str, Any], *, version: int = 1) -> bytes:
    """The documented envelope, written independently of the implementation (with a valid checksum)."""
    text = json.dumps(manifest).encode()
    head = struct.pack(">8sHI", PROGRAM_MAGIC, version, len(text)) + text
    return head + hashlib.sha256(head).digest()


def craft(pairs: list[tuple[str, bytes]], **changes: Any) -> bytes:
    """A program file whose manifest lists ``pairs`` with correct offsets and hashes, plus ``changes``."""
    rows, offset = [], 0
    for name, data in pairs:
        digest = hashlib.sha256(data).hexdigest()
        rows.append({"name": name, "offset": offset, "length": len(data), "sha256": digest})
        offset += len(data)
    manifest: dict[str, Any] = {
        "methods": rows,
        "device": "cpu",
        "torch_version": TORCH,
        "cuda_version": None,
        "created_by": {"tool": "test"},
    }
    manifest.update(changes)
    return frame(manifest) + b"".join(data for _, data in pairs)


# --- round trip -----------------------------------------------------------------------------------------


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "model.aotiprog"
    blobs = two_methods()
    write_program(path, blobs, device="cpu", torch_version=TORCH, cuda_version=None)
    program = read_program(path, runtime_device="cpu", runtime_torch_version="2.13.2")
    assert program.method_names == ("encoder", "decoder")  # order kept
    assert dict(program.methods) == blobs
    assert program.method("decoder") == blobs["decoder"]
    assert program.contents("encoder").artifact == b"artifact of encoder"
    assert (program.device, program.torch_version, program.cuda_version) == ("cpu", TORCH, None)
    assert program.format_version == 1
    assert program.created_by["tool"] == "reference_impl"
    assert sorted(os.listdir(tmp_path)) == ["model.aotiprog"]  # no temp file left behind


def test_layout_matches_the_documentation() -> None:
    blobs = two_methods()
    data = small_file()
    magic, version, length = struct.unpack_from(">8sHI", data)
    assert (magic, version) == (b"AOTIPRG\0", 1)
    manifest = json.loads(data[14 : 14 + length])
    assert data[14 + length : 46 + length] == hashlib.sha256(data[: 14 + length]).digest()
    assert set(manifest) == {"methods", "device", "torch_version", "cuda_version", "created_by"}
    body = data[46 + length :]
    for row, (name, payload) in zip(manifest["methods"], blobs.items(), strict=True):
        assert row["name"] == name
        assert body[row["offset"] : row["offset"] + row["length"]] == payload
        assert row["sha256"] == hashlib.sha256(payload).hexdigest()
    assert small_file() == data  # deterministic: a content cache can key on the bytes


def test_entries_and_manifest() -> None:
    program = build_program(two_methods().items())
    first, second = program.entries()
    assert first == MethodEntry("encoder", 0, len(program.method("encoder")), first.sha256)
    assert second.offset == first.length
    assert program.manifest()["methods"][1]["name"] == "decoder"


def test_program_is_read_only() -> None:
    program = build_program(two_methods().items())
    with pytest.raises(TypeError):
        program.methods["x"] = b""  # type: ignore[index]


def test_cuda_program_round_trips() -> None:
    pairs = [(n, blob(n, device="cuda", cuda_version="12.8")) for n in ("prefill", "decode")]
    data = program_to_bytes(build_program(pairs))
    program = program_from_bytes(data, runtime_device="cuda:0")
    assert (program.device, program.cuda_version) == ("cuda", "12.8")


def test_write_replaces_atomically_and_keeps_the_old_file_on_error(tmp_path: Path) -> None:
    path = tmp_path / "p.bin"
    write_program(path, {"a": blob("a")}, device="cpu", torch_version=TORCH, cuda_version=None)
    old = path.read_bytes()
    with pytest.raises(errors.MethodNameMismatchError):
        write_program(path, {"a": blob("b")}, device="cpu", torch_version=TORCH, cuda_version=None)
    assert path.read_bytes() == old
    write_program(path, {"b": blob("b")}, device="cpu", torch_version=TORCH, cuda_version=None)
    assert read_program(path).method_names == ("b",)
    assert sorted(os.listdir(tmp_path)) == ["p.bin"]


# --- building -------------------------------------------------------------------------------------------


def test_duplicate_method_names_are_rejected_by_name() -> None:
    with pytest.raises(errors.DuplicateMethodError, match=r"method 'decode' appears twice"):
        build_program([("decode", blob("decode")), ("prefill", blob("prefill")), ("decode", blob("decode"))])


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", errors.EmptyMethodNameError),
        ("bad\udcffname", errors.MethodNameEncodingError),
        ("a\0b", errors.MethodNameNulError),
        (b"forward", errors.MethodNameTypeError),
    ],
)
def test_bad_method_names_are_rejected(name: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        build_program([(name, blob("forward"))])


def test_empty_program_is_rejected() -> None:
    with pytest.raises(errors.EmptyProgramError):
        build_program([])
    with pytest.raises(errors.EmptyProgramError):
        Program(methods={}, device="cpu", torch_version=TORCH, cuda_version=None)


def test_pair_name_must_match_the_blob_header() -> None:
    with pytest.raises(errors.MethodNameMismatchError, match=r"'decoder'.*'encoder'"):
        build_program([("decoder", blob("encoder"))])


def test_blobs_must_share_target_and_toolchain() -> None:
    with pytest.raises(errors.ManifestMismatchError, match=r"device='cuda'"):
        build_program([("a", blob("a")), ("b", blob("b", device="cuda", cuda_version="12.8"))])
    with pytest.raises(errors.ManifestMismatchError, match=r"torch_version"):
        build_program([("a", blob("a")), ("b", blob("b", torch_version="2.12.0"))])
    with pytest.raises(errors.ManifestMismatchError, match=r"device"):
        build_program([("a", blob("a"))], device="cuda")


def test_unknown_method_lists_the_available_ones() -> None:
    program = build_program(two_methods().items())
    with pytest.raises(errors.UnknownMethodError, match=r"'forward'.*\['encoder', 'decoder'\]") as info:
        program.method("forward")
    assert isinstance(info.value, LookupError)
    with pytest.raises(errors.UnknownMethodError):
        program.method(["unhashable"])  # type: ignore[arg-type]


# --- reading: truncation and tampering ------------------------------------------------------------------


def test_every_truncation_is_a_truncated_program_error() -> None:
    data = small_file()
    for length in range(len(data)):
        with pytest.raises(errors.TruncatedProgramError):
            program_from_bytes(data[:length])


def test_a_flipped_byte_anywhere_is_an_error() -> None:
    """The format has no byte that carries no meaning, so every single flip must be detected."""
    data = small_file()
    manifest_end = 46 + struct.unpack_from(">I", data, 10)[0]
    program = build_program(two_methods().items())
    spans = {e.name: (manifest_end + e.offset, manifest_end + e.offset + e.length) for e in program.entries()}
    for position in range(len(data)):
        for mask in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[position] ^= mask
            with pytest.raises(errors.LoweringFormatError) as info:
                program_from_bytes(bytes(flipped))
            owner = next((name for name, (lo, hi) in spans.items() if lo <= position < hi), None)
            if owner is not None:
                assert isinstance(info.value, errors.ContentHashMismatchError)
                assert f"method {owner!r}" in str(info.value)
            elif 14 <= position < manifest_end:
                # Inside the manifest or its checksum (past the length field): a checksum error.
                assert isinstance(info.value, errors.HeaderChecksumError), position


def test_flipped_manifest_byte_reads_clearly() -> None:
    data = bytearray(small_file())
    data[20] ^= 0x01
    with pytest.raises(errors.HeaderChecksumError, match=r"program manifest: SHA-256 .* tampered"):
        program_from_bytes(bytes(data))


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(errors.TrailingDataError):
        program_from_bytes(small_file() + b"x")


def test_unsupported_version_says_which_are_supported() -> None:
    data = bytearray(small_file())
    data[8:10] = struct.pack(">H", 7)
    with pytest.raises(errors.UnsupportedFormatVersionError, match=r"version 7 .*\[1\]"):
        program_from_bytes(bytes(data))


def test_a_blob_is_not_a_program() -> None:
    with pytest.raises(errors.BadMagicError, match=r"AOTIPRG"):
        program_from_bytes(blob("forward"))
    with pytest.raises(errors.MalformedManifestError, match=r"must be bytes"):
        program_from_bytes(None)  # type: ignore[arg-type]


# --- reading: manifests that are well formed but wrong ------------------------------------------------


def test_crafted_file_reads() -> None:
    assert program_from_bytes(craft([("a", blob("a"))])).method_names == ("a",)


def test_manifest_name_disagreeing_with_the_blob_header() -> None:
    with pytest.raises(errors.MethodNameMismatchError, match=r"expected method 'decoder'.*'encoder'"):
        program_from_bytes(craft([("decoder", blob("encoder"))]))


def test_manifest_target_disagreeing_with_the_blob_header() -> None:
    with pytest.raises(errors.ManifestMismatchError, match=r"method 'a'.*device='cpu'.*device='cuda'"):
        program_from_bytes(craft([("a", blob("a"))], device="cuda"))
    with pytest.raises(errors.ManifestMismatchError, match=r"cuda_version"):
        program_from_bytes(craft([("a", blob("a"))], cuda_version="12.8"))


def test_duplicate_name_in_manifest() -> None:
    with pytest.raises(errors.DuplicateMethodError, match=r"'a' appears twice"):
        program_from_bytes(craft([("a", blob("a")), ("a", blob("a"))]))


def test_empty_methods_in_manifest() -> None:
    with pytest.raises(errors.EmptyProgramError):
        program_from_bytes(craft([]))


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", errors.EmptyMethodNameError),
        ("\ud800", errors.MethodNameEncodingError),
        (7, errors.MalformedManifestError),
    ],
)
def test_bad_name_in_manifest(name: Any, error: type[Exception]) -> None:
    data = craft([("a", blob("a"))])
    manifest = json.loads(data[14 : 14 + struct.unpack_from(">I", data, 10)[0]])
    manifest["methods"][0]["name"] = name
    with pytest.raises(error):
        program_from_bytes(frame(manifest) + blob("a"))


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda m: m["methods"][1].update(offset=0), errors.MalformedManifestError, "contiguously"),
        (lambda m: m["methods"][0].update(length=0), errors.MalformedManifestError, "never empty"),
        (
            lambda m: m["methods"][0].update(sha256="0" * 63),
            errors.MalformedManifestError,
            "64 lowercase hex",
        ),
        (lambda m: m["methods"][0].update(extra=1), errors.MalformedManifestError, "unknown keys"),
        (lambda m: m.update(methods={}), errors.MalformedManifestError, "must be a list"),
        (lambda m: m.update(methods=[1]), errors.MalformedManifestError, "must be an object"),
        (lambda m: m.update(device="mps"), errors.MalformedManifestError, "device must be one of"),
        (lambda m: m.update(created_by={"tool": 1}), errors.MalformedManifestError, "created_by"),
        (lambda m: m.pop("torch_version"), errors.MalformedManifestError, "missing keys"),
        (lambda m: m["methods"][1].update(sha256="0" * 64), errors.ContentHashMismatchError, "method 'b'"),
        (
            lambda m: m["methods"][1].update(length=m["methods"][1]["length"] + 1),
            errors.TruncatedProgramError,
            "truncated",
        ),
        (
            lambda m: m["methods"][1].update(length=m["methods"][1]["length"] - 1),
            errors.TrailingDataError,
            "must end there",
        ),
    ],
)
def test_inconsistent_manifests(mutate: Any, error: type[Exception], match: str) -> None:
    pairs = [("a", blob("a")), ("b", blob("b"))]
    data = craft(pairs)
    manifest = json.loads(data[14 : 14 + struct.unpack_from(">I", data, 10)[0]])
    mutate(manifest)
    with pytest.raises(error, match=match):
        program_from_bytes(frame(manifest) + b"".join(d for _, d in pairs))


# --- reading: the runtime -------------------------------------------------------------------------------


def test_runtime_device_and_torch_version(tmp_path: Path) -> None:
    path = tmp_path / "p.bin"
    write_program(path, two_methods(), device="cpu", torch_version=TORCH, cuda_version=None)
    with pytest.raises(errors.WrongTargetError, match=r"'cpu'.*'cuda'"):
        read_program(path, runtime_device="cuda")
    with pytest.raises(errors.ToolchainMismatchError, match=r"2.12"):
        read_program(path, runtime_torch_version="2.12.1")


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_program(tmp_path / "absent")
