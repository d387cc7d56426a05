"""Every assertion helper in ``conformance.common.checks``: passes just inside its rule, fails just past it,
and the failure reads ``[rule] call: ...`` naming what broke (the format the module promises)."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch

from conformance.common import checks
from conformance.common.checks import CheckFailure, CoverageGap
from conformance.common.tolerances import MODEL_TOLERANCES
from tests.meta.boundary import neighbour
from tests.meta.registry import covers

RULE, CALL = "meta/rule", "f(x, y)"
PREFIX = re.escape(f"[{RULE}] {CALL}: ")


def failure(pattern: str) -> AbstractContextManager[Any]:
    """The check must fail with the ``[rule] call:`` prefix and then ``pattern``."""
    return pytest.raises(CheckFailure, match=PREFIX + pattern)


# ---------------------------------------------------------------------------------------------- fail, gap


@covers(checks.fail, checks.CheckFailure)
def test_fail_raises_an_assertion_naming_rule_and_call() -> None:
    with pytest.raises(CheckFailure) as info:
        checks.fail(RULE, CALL, "what happened")
    assert str(info.value) == f"[{RULE}] {CALL}: what happened"
    assert isinstance(info.value, AssertionError)  # pytest reports it as a failure, not an error


@covers(checks.coverage_gap, checks.CoverageGap)
def test_coverage_gap_is_reported_apart_from_failures() -> None:
    with pytest.raises(CoverageGap) as info:
        checks.coverage_gap(RULE, CALL, "aten.foo is not mapped")
    assert info.value.rule == RULE
    assert str(info.value) == f"[{RULE}] {CALL}: aten.foo is not mapped"
    assert not isinstance(info.value, AssertionError)  # never counted as a failure


# ---------------------------------------------------------------------------------------------- untouched


def nan_with_payload(payload: int) -> torch.Tensor:
    return torch.tensor(0x7FC00000 | payload, dtype=torch.int32).view(torch.float32)


@covers(checks.snapshot, checks.bits)
def test_snapshot_and_bits_keep_what_value_equality_loses() -> None:
    t = torch.stack([torch.tensor(0.0), torch.tensor(-0.0), nan_with_payload(1)])
    copy = checks.snapshot(t)
    t.zero_()
    assert torch.equal(
        checks.bits(copy),
        checks.bits(torch.stack([torch.tensor(0.0), torch.tensor(-0.0), nan_with_payload(1)])),
    )
    assert not torch.equal(checks.bits(torch.tensor(0.0)), checks.bits(torch.tensor(-0.0)))
    assert not torch.equal(checks.bits(nan_with_payload(1)), checks.bits(nan_with_payload(2)))
    for dtype in (torch.bool, torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert (
            checks.bits(torch.ones(3, dtype=dtype)).element_size()
            == torch.ones(1, dtype=dtype).element_size()
        )


@covers(checks.assert_untouched)
def test_assert_untouched_passes_on_identical_bits_nan_included() -> None:
    before = torch.stack([torch.tensor(-0.0), nan_with_payload(5), torch.tensor(1.5)])
    checks.assert_untouched(RULE, CALL, "out", before, checks.snapshot(before))


@covers(checks.assert_untouched)
@pytest.mark.parametrize(
    ("changed", "label"),
    [
        (torch.stack([torch.tensor(0.0), nan_with_payload(5), torch.tensor(1.5)]), "-0.0 became 0.0"),
        (torch.stack([torch.tensor(-0.0), nan_with_payload(6), torch.tensor(1.5)]), "NaN payload"),
        (torch.stack([torch.tensor(-0.0), nan_with_payload(5), neighbour(torch.tensor(1.5), 1)]), "one ulp"),
        (torch.stack([torch.tensor(-0.0), nan_with_payload(5)]), "shape"),
    ],
)
def test_assert_untouched_fails_on_any_changed_bit(changed: torch.Tensor, label: str) -> None:
    before = torch.stack([torch.tensor(-0.0), nan_with_payload(5), torch.tensor(1.5)])
    with failure("argument 'out' must be left untouched on error"):
        checks.assert_untouched(RULE, CALL, "out", before, changed)


# ---------------------------------------------------------------------------------------------- raises


def raising(exc: BaseException) -> Callable[[], None]:
    def fn() -> None:
        raise exc

    return fn


@covers(checks.assert_raises_invalid_argument)
def test_assert_raises_passes_when_argument_and_rule_are_named() -> None:
    error = ValueError("mm_out: argument 'out' breaks rule 'out-shape': SHAPE (6, 3) != (6, 8)")
    got = checks.assert_raises_invalid_argument(
        RULE, CALL, raising(error), argument="out", keywords=("shape",)
    )
    assert got is error
    # A tuple of exception types; "" asks for no particular argument.
    missing = raising(TypeError("missing 1 required argument"))
    exception = (TypeError, ValueError)
    checks.assert_raises_invalid_argument(
        RULE, CALL, missing, argument="", keywords=("required",), exception=exception
    )


@covers(checks.assert_raises_invalid_argument)
@pytest.mark.parametrize(
    ("exc", "pattern"),
    [
        # Just past "names the argument": 'out' only inside other words.
        (ValueError("bad layout of the output"), "the error must name the argument 'out'"),
        (ValueError("argument 'out' is wrong"), re.escape("the error must name the rule (one of ['shape'])")),
        (
            RuntimeError("argument 'out': shape"),
            re.escape("expected an invalid-argument error (ValueError), got RuntimeError"),
        ),
        (None, "expected an invalid-argument error naming the broken rule, but the call succeeded"),
    ],
)
def test_assert_raises_fails_past_each_rule(exc: BaseException | None, pattern: str) -> None:
    fn = (lambda: None) if exc is None else raising(exc)
    with failure(pattern):
        checks.assert_raises_invalid_argument(RULE, CALL, fn, argument="out", keywords=("shape",))


@covers(checks.names_rule)
@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("unmatched dim value at 0", True),
        ("SHAPE (6, 3) != (6, 8)", True),  # any case; a space before the parenthesis: prose
        ("the program is truncated", True),  # a keyword may start a word
        ("run_func_( container_handle_, input_handles.size(), output_handles.size()) API call failed", False),
        ("input.dim() returned 3", False),  # a call in quoted code names no rule
        ("bad layout", False),
    ],
)
def test_names_rule_wants_a_keyword_in_words_not_a_call(text: str, named: bool) -> None:
    assert checks.names_rule(text, ("size", "dim", "shape", "truncat")) is named


@covers(checks.names_argument)
@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("argument 'out' breaks", True),
        ("out.dtype is float16", True),
        ("out: wrong shape", True),
        ("mat2's rank is 1", False),  # asked for "out" below
        ("bad layout", False),
        ("output too small", False),
        ("out_buffer", False),
    ],
)
def test_names_argument_wants_the_name_as_a_word(text: str, named: bool) -> None:
    assert checks.names_argument(text, "out") is named
    assert checks.names_argument("options['a.b'] must be bool", "options['a.b']")  # no regex meaning


# ---------------------------------------------------------------------------------------------- exact


@covers(checks.assert_exact)
def test_assert_exact_passes_on_equal_values() -> None:
    got = torch.tensor([[1.0, -0.0], [2048.0, 0.5]], dtype=torch.float16)
    checks.assert_exact(RULE, CALL, got, got.double().abs() * got.double().sign())  # -0.0 == 0.0 in value
    checks.assert_exact(RULE, CALL, torch.tensor([2**53 + 1]), torch.tensor([2**53 + 1]))


@covers(checks.assert_exact)
def test_assert_exact_fails_one_ulp_off_and_says_where() -> None:
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    got = expected.clone()
    got[1, 0] = neighbour(got[1, 0], 1)
    with failure(
        re.escape("1 of 4 elements differ from the exact result; first at (1, 0): got 3.015625, exact 3.0")
    ):
        checks.assert_exact(RULE, CALL, got, expected)


@covers(checks.assert_exact)
def test_assert_exact_compares_int64_beyond_float64_precision() -> None:
    # 2**53 + 1 and 2**53 are one apart but the same float64.
    with failure("1 of 1 elements differ"):
        checks.assert_exact(RULE, CALL, torch.tensor([2**53 + 1]), torch.tensor([2**53]))


@covers(checks.assert_exact)
@pytest.mark.parametrize(
    ("got", "pattern"),
    [
        (torch.tensor([1.0, float("nan")]), "1 of 2 elements are NaN: output not written"),
        (torch.tensor([1.0]), re.escape("shape (1,) != expected (2,)")),
    ],
)
def test_assert_exact_fails_on_nan_or_shape(got: torch.Tensor, pattern: str) -> None:
    with failure(pattern):
        checks.assert_exact(RULE, CALL, got, torch.tensor([1.0, 2.0]))


# ---------------------------------------------------------------------------------------------- matmul
# The per-dtype boundaries of assert_matmul_close are in test_tolerances_meta.py; here its messages.


@covers(checks.assert_matmul_close)
def test_assert_matmul_close_names_dtype_count_and_first_element() -> None:
    a = torch.eye(2, dtype=torch.float32)
    b = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    got = b.clone()
    got[1, 0] = 3.5
    with failure(
        re.escape("1 of 4 elements outside the torch.float32 tolerance")
        + ".*first at \\(1, 0\\): got 3.5, float64 reference 3.0"
    ):
        checks.assert_matmul_close(RULE, CALL, got, a, b)
    checks.assert_matmul_close(RULE, CALL, b.clone(), a, b)


@covers(checks.assert_matmul_close)
@pytest.mark.parametrize(
    ("got", "pattern"),
    [
        (torch.full((2, 2), float("nan")), "4 of 4 elements are NaN: output not \\(fully\\) written"),
        (torch.zeros(2, 3), re.escape("shape (2, 3) != expected (2, 2)")),
    ],
)
def test_assert_matmul_close_fails_on_nan_or_shape(got: torch.Tensor, pattern: str) -> None:
    with failure(pattern):
        checks.assert_matmul_close(RULE, CALL, got, torch.eye(2), torch.eye(2))


# ---------------------------------------------------------------------------------------------- model
# The per-dtype boundaries of assert_model_output_close are in test_tolerances_meta.py.


F64 = torch.float64


@covers(checks.assert_model_output_close)
@pytest.mark.parametrize(
    ("got", "ref", "pattern"),
    [
        (torch.zeros(3), torch.zeros(2, dtype=F64), re.escape("shape (3,) != eager (2,)")),
        (torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), "dtype torch.int32 != eager"),
        (torch.tensor([1, 2]), torch.tensor([1, 3]), "integer output differs from eager"),
        (torch.tensor([1.0, float("inf")]), torch.ones(2, dtype=F64), "1 of 2 elements are not finite"),
        (
            torch.ones(2, dtype=F64),
            torch.ones(2, dtype=F64),
            "no model tolerance for output dtype torch.float64",
        ),
    ],
)
def test_assert_model_output_close_fails_on_shape_dtype_ints_and_non_finite(
    got: torch.Tensor, ref: torch.Tensor, pattern: str
) -> None:
    with failure(pattern):
        checks.assert_model_output_close(RULE, CALL, got, ref)


@covers(checks.assert_model_output_close)
def test_assert_model_output_close_passes_equal_ints_and_zeros() -> None:
    checks.assert_model_output_close(RULE, CALL, torch.tensor([1, 2]), torch.tensor([1, 2]))
    for dtype in MODEL_TOLERANCES:
        checks.assert_model_output_close(
            RULE, CALL, torch.zeros(4, dtype=dtype), torch.zeros(4, dtype=torch.float64)
        )
