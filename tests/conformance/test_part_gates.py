"""The protocol's typed parts and the gate fixtures made from them (``conformance/protocol.py``,
``conformance/common/parts.py``).

The typed protocols must say what ``PARTS`` says (a chapter annotated with a protocol calls exactly what its
gate checked), the reference backend must fit them call by call, and a gate made by ``part_fixture`` must
give the case the backend or skip it with the reason the optional-parts proof matches.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

import pytest
from typing_extensions import get_protocol_members

from conformance.common.parts import part_fixture
from conformance.protocol import LOWER_OPTION_PARTS, PART_PROTOCOLS, PARTS, Backend, implements
from harness.backend_loader import DEFAULT_BACKEND, load_backend

pytest_plugins = ["pytester"]

IDENTITY = get_protocol_members(Backend)


def _own_members(part: str) -> set[str]:
    return set(get_protocol_members(PART_PROTOCOLS[part])) - set(IDENTITY)


def test_every_part_has_a_typed_protocol() -> None:
    assert set(PART_PROTOCOLS) == set(PARTS) | set(LOWER_OPTION_PARTS)


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_parts_protocol_has_exactly_the_parts_attributes(part: str) -> None:
    assert _own_members(part) == set(PARTS[part])


@pytest.mark.parametrize("part", sorted(LOWER_OPTION_PARTS))
def test_a_lower_option_parts_protocol_is_lowering_with_its_options(part: str) -> None:
    assert _own_members(part) == {*PARTS["lowering"], "lower_options"}


def _arguments(method: Any) -> tuple[list[object], dict[str, object]]:
    """Placeholders for what the suite passes to ``method`` of a protocol: positional-only parameters by
    position, keyword-only ones (optional too: the suite passes ``options``) by name."""
    parameters = list(inspect.signature(method).parameters.values())[1:]  # without self
    positional = [object() for p in parameters if p.kind is p.POSITIONAL_ONLY]
    keywords = {p.name: object() for p in parameters if p.kind is p.KEYWORD_ONLY}
    return positional, keywords


@pytest.mark.parametrize("part", sorted(PART_PROTOCOLS))
def test_the_reference_backend_takes_every_call_of_its_protocols(part: str) -> None:
    backend = load_backend(DEFAULT_BACKEND)
    assert implements(backend, part)
    protocol = PART_PROTOCOLS[part]
    assert isinstance(backend, protocol)
    for name in sorted(_own_members(part)):
        declared = getattr(protocol, name)
        if isinstance(declared, property):
            continue
        positional, keywords = _arguments(declared)
        inspect.signature(getattr(backend, name)).bind(*positional, **keywords)  # TypeError: a misfit


def test_part_fixture_refuses_an_unknown_part() -> None:
    with pytest.raises(ValueError, match="protocol parts"):
        part_fixture("runtime", "no_such_part", doc="")
    with pytest.raises(ValueError, match="protocol parts"):
        part_fixture(doc="")


GATED = textwrap.dedent(
    """
    import contextlib

    import pytest

    from conformance.common.parts import part_fixture

    EVENTS = []


    class Toy:
        name, version = "toy", "0"

        def set_option(self, key, value): ...

        def get_option(self, key): ...


    @pytest.fixture
    def backend():
        return Toy()


    @pytest.fixture
    def announced():
        EVENTS.append("first")


    @contextlib.contextmanager
    def held(backend):
        EVENTS.append("enter")
        yield
        EVENTS.append("exit")


    options = part_fixture("runtime_options", first=("announced",), hold=held, doc="options")
    runner = part_fixture("runtime_options", "lowering", "runtime", first=("announced",), doc="runner")


    def test_gets_the_backend(options):
        assert options.name == "toy" and EVENTS == ["first", "enter"]


    def test_skips_without_the_part(runner):
        raise AssertionError("never runs")


    def test_after():
        assert EVENTS == ["first", "enter", "exit", "first"]
    """
)


def test_a_gate_gives_the_backend_or_skips_with_the_parts_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_gated=GATED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    assert (
        "backend 'toy' does not implement protocol part 'lowering' (lacks ['lower'])" in result.stdout.str()
    )
