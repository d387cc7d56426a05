"""Loading the backend under test: --backend / environment / default, and clear errors."""

from __future__ import annotations

import pytest

from conformance.protocol import MmOutBackend, missing_attributes
from harness.backend_loader import (
    BACKEND_ENV_VAR,
    DEFAULT_BACKEND,
    BackendLoadError,
    backend_spec,
    load_backend,
)


def test_default_backend_is_the_reference_and_implements_mm_out() -> None:
    backend = load_backend(DEFAULT_BACKEND)
    assert backend.name == "reference_impl"
    assert isinstance(backend, MmOutBackend)
    assert missing_attributes(backend, "mm_out") == []


def test_command_line_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV_VAR, "env_module:attr")
    assert backend_spec("cli_module:attr") == "cli_module:attr"
    assert backend_spec(None) == "env_module:attr"
    monkeypatch.delenv(BACKEND_ENV_VAR)
    assert backend_spec(None) == DEFAULT_BACKEND


def test_dotted_attribute_path() -> None:
    backend = load_backend("tests.broken_backends:ACCEPTS_CPU_TENSORS")
    assert backend.name == "accepts-cpu-tensors"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("no_colon_here", "must have the form 'module:attr'"),
        (":attr", "must have the form"),
        ("module:", "must have the form"),
        ("no_such_module_xyz:BACKEND", "cannot import module 'no_such_module_xyz'"),
        ("reference_impl:NO_SUCH_ATTR", "has no attribute 'NO_SUCH_ATTR'"),
        ("tests.broken_backends:_Wrapped", "lacks the protocol identity"),
    ],
)
def test_bad_specs_give_clear_errors(spec: str, words: str) -> None:
    with pytest.raises(BackendLoadError, match=None) as info:
        load_backend(spec)
    assert words in str(info.value)
    assert repr(spec) in str(info.value)


def test_backend_without_a_part_reports_what_it_lacks() -> None:
    assert missing_attributes(load_backend("tests.broken_backends:NO_PARTS"), "mm_out") == ["mm_out"]
