"""Compile specs and method-name rules (SPEC §1a "Method name")."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from reference_impl.format import errors
from reference_impl.format.compile_spec import (
    MAX_METHOD_NAME_BYTES,
    CompileSpec,
    CompileSpecKey,
    find_method_name,
    method_name_from_specs,
    method_name_spec,
    validate_method_name,
)


def test_key_enum_is_a_str_with_the_wire_value() -> None:
    assert CompileSpecKey.METHOD_NAME == "method_name"
    assert CompileSpecKey("method_name") is CompileSpecKey.METHOD_NAME


def test_compile_spec_is_frozen_and_normalises_an_enum_key() -> None:
    spec = CompileSpec(CompileSpecKey.METHOD_NAME, b"forward")
    assert spec.key == "method_name"
    assert type(spec.key) is str
    assert spec == CompileSpec("method_name", b"forward")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.value = b"other"  # type: ignore[misc]


def test_compile_spec_rejects_wrong_types() -> None:
    with pytest.raises(TypeError, match=r"value must be bytes"):
        CompileSpec("method_name", "forward")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"key must be a str"):
        CompileSpec(1, b"x")  # type: ignore[arg-type]
    assert CompileSpec("k", bytearray(b"ab")).value == b"ab"


@pytest.mark.parametrize("name", ["forward", "decode", "décodeur", "前向", "🙂", "a" * MAX_METHOD_NAME_BYTES])
def test_method_name_round_trips_through_its_spec(name: str) -> None:
    spec = method_name_spec(name)
    assert spec.key == "method_name"
    assert spec.value == name.encode("utf-8")
    assert method_name_from_specs([spec]) == name


@pytest.mark.parametrize(
    ("name", "error", "rule"),
    [
        ("", errors.EmptyMethodNameError, "at least one character"),
        ("enc\0oder", errors.MethodNameNulError, "must not contain"),
        ("bad\ud800name", errors.MethodNameEncodingError, "valid Unicode"),
        ("a" * (MAX_METHOD_NAME_BYTES + 1), errors.MethodNameTooLongError, "at most 255 bytes"),
        # 128 two-byte characters: 128 characters but 256 bytes, so the limit is on bytes.
        ("é" * 128, errors.MethodNameTooLongError, "256 UTF-8 bytes"),
        (b"forward", errors.MethodNameTypeError, "must be a str"),
        (None, errors.MethodNameTypeError, "must be a str"),
    ],
)
def test_method_name_spec_rejects_bad_names(name: object, error: type[Exception], rule: str) -> None:
    with pytest.raises(error, match=rule) as info:
        method_name_spec(name)  # type: ignore[arg-type]
    assert isinstance(info.value, errors.InvalidMethodNameError)
    assert isinstance(info.value, errors.LoweringFormatError)
    assert isinstance(info.value, ValueError)


def test_type_errors_are_also_type_errors() -> None:
    with pytest.raises(TypeError):
        validate_method_name(3)


def test_limit_counts_bytes_not_characters() -> None:
    assert validate_method_name("é" * 127 + "a") == "é" * 127 + "a"  # 255 bytes


def test_first_method_name_spec_wins() -> None:
    specs = [CompileSpec("other", b"\xff"), method_name_spec("encoder"), method_name_spec("decoder")]
    assert method_name_from_specs(specs) == "encoder"


def test_missing_method_name_names_the_keys_it_saw() -> None:
    specs = [CompileSpec("foo", b"1"), CompileSpec("bar", b"2")]
    with pytest.raises(errors.MissingMethodNameError) as info:
        method_name_from_specs(specs)
    assert "no 'method_name' compile spec among ['foo', 'bar']" in str(info.value)
    with pytest.raises(errors.MissingMethodNameError, match=r"among \[\]"):
        method_name_from_specs([])
    assert find_method_name(specs) is None


def test_non_utf8_value_names_the_bytes_and_the_rule() -> None:
    with pytest.raises(errors.InvalidMethodNameError) as info:
        method_name_from_specs([CompileSpec("method_name", b"enc\xff\xfe")])
    message = str(info.value)
    assert repr(b"enc\xff\xfe") in message
    assert "must be UTF-8" in message
    assert isinstance(info.value, errors.MethodNameEncodingError)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (b"", errors.EmptyMethodNameError),
        (b"a\0b", errors.MethodNameNulError),
        (b"x" * 256, errors.MethodNameTooLongError),
        # CESU-style encoded surrogate: not valid UTF-8.
        (b"\xed\xa0\x80", errors.MethodNameEncodingError),
    ],
)
def test_spec_values_obey_the_same_rules(value: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        method_name_from_specs([CompileSpec("method_name", value)])


def test_duck_typed_specs_are_read() -> None:
    # ExecuTorch's own CompileSpec is a different class with the same two attributes.
    foreign = SimpleNamespace(key="method_name", value=b"prefill")
    assert method_name_from_specs([foreign]) == "prefill"  # type: ignore[list-item]
    wrong = SimpleNamespace(key="method_name", value="prefill")
    with pytest.raises(errors.MethodNameTypeError, match=r"must be UTF-8 bytes"):
        method_name_from_specs([wrong])  # type: ignore[list-item]


def test_every_error_class_is_a_lowering_format_error() -> None:
    classes = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == errors.__name__
    ]
    assert len(classes) > 20
    for cls in classes:
        assert issubclass(cls, errors.LoweringFormatError), cls
        assert issubclass(cls, ValueError), cls
