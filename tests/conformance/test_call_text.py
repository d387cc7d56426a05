"""A call's text (the contract monitor builds one for every call, the oracle and the crash journal for
theirs) names each argument's kind and shape, and never formats a tensor's values or a module's tree."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conformance.common.oracle import describe_args


@pytest.fixture
def no_value_formatting(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object, *args: object, **kwargs: object) -> str:
        raise AssertionError(f"formatted the values of a {type(self).__name__}")

    monkeypatch.setattr(torch.Tensor, "__repr__", refuse)
    monkeypatch.setattr(torch.Tensor, "__format__", refuse)
    monkeypatch.setattr(nn.Module, "__repr__", refuse)


def test_a_lower_calls_methods_are_described_by_kind_and_shape(no_value_formatting: None) -> None:
    methods = {"forward": (nn.Linear(4, 4), (torch.randn(2, 4),), None)}
    assert describe_args([methods]) == "{'forward': (<Linear>, (float32[2, 4]@cpu), None)}"


def test_layouts_strides_bytes_and_deep_nesting_stay_short(no_value_formatting: None) -> None:
    text = describe_args([torch.randn(3, 3).t(), b"abc", [[[[1, 2]]]], "cpu"])
    assert text == "float32[3, 3]@cpu strides (1, 3), <3 bytes>, [[[<list of 2>]]], 'cpu'"
    assert describe_args(["x" * 100]).endswith("...")
