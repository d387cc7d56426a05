"""Assertion helpers: every failed check reads ``[rule-id] call: what was expected, what happened``.

Modelled on data-apis/array-api-tests: one message format for the whole suite, naming the function, the
argument and the rule, so a failure in CI reads like the line of the spec it enforces.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from conformance.common.tolerances import MODEL_TOLERANCES, TOLERANCES

#: Words of which an error for a corrupt program file must contain one: it says what is wrong with it ...
CORRUPT_PROGRAM_WORDS = (
    "corrupt", "tamper", "truncat", "magic", "checksum", "sha-256", "sha256", "hash", "malformed",
    "version", "shorter", "empty", "trailing", "invalid", "not valid",
)  # fmt: skip
#: ... and one of these: it blames the program.
PROGRAM_WORDS = ("program", "file", "manifest", "blob", "artifact", "header")
#: An unknown method name at init.
UNKNOWN_METHOD_WORDS = ("no method", "unknown", "not found", "no such", "available")


class CheckFailure(AssertionError):
    """A conformance rule was broken; the message names the rule."""


class CoverageGap(Exception):
    """The backend does not cover something (an op it does not map): reported as coverage, never a failure."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def fail(rule: str, call: str, message: str) -> None:
    raise CheckFailure(f"[{rule}] {call}: {message}")


def coverage_gap(rule: str, call: str, message: str) -> None:
    """Report that the backend does not cover what ``call`` exercises (e.g. an op it leaves unmapped)."""
    raise CoverageGap(rule, f"[{rule}] {call}: {message}")


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A bit-exact copy (NaN payloads included) to prove later that a tensor was left untouched."""
    return t.detach().clone()


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s raw bits, to compare: NaN != NaN numerically, and -0.0 == 0.0 would hide a write. Every dtype
    and layout a caller can pass (a sparse tensor: its dense values; ``meta``: no bits at all)."""
    t = t.detach()
    if t.device.type == "meta":
        return torch.empty(0, dtype=torch.uint8)
    if t.layout != torch.strided:
        t = t.to_dense()
    int_type = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    if int_type is None or t.dtype == torch.bool:  # complex128 (16 bytes), bool: as bytes
        return t.contiguous().reshape(-1).view(torch.uint8)
    return t.contiguous().view(int_type)


def assert_untouched(rule: str, call: str, name: str, before: torch.Tensor, after: torch.Tensor) -> None:
    if before.shape != after.shape or not torch.equal(bits(before), bits(after)):
        fail(rule, call, f"argument {name!r} must be left untouched on error, but its contents changed")


def assert_raises_invalid_argument(
    rule: str,
    call: str,
    fn: Callable[[], Any],
    *,
    argument: str,
    keywords: tuple[str, ...],
    exception: type[BaseException] | tuple[type[BaseException], ...] = ValueError,
) -> BaseException:
    """``fn()`` must raise an invalid-argument error whose message names ``argument`` and the rule.

    ``argument`` must appear as a name of its own ("'out'", "out.dtype"), not inside a longer word ("layout"
    does not name ``out``); ``""`` asks for no particular argument. ``keywords``: words of which the message
    must contain at least one (case-insensitive), so that the rule is named in words, not only the argument.
    """
    try:
        fn()
    except exception as exc:
        text = str(exc)
        if argument and not names_argument(text, argument):
            fail(rule, call, f"the error must name the argument {argument!r}; it said: {text!r}")
        if not names_rule(text, keywords):
            fail(rule, call, f"the error must name the rule (one of {list(keywords)}); it said: {text!r}")
        return exc
    except Exception as exc:  # any other exception type is itself the rule break
        expected = getattr(exception, "__name__", str(exception))
        fail(rule, call, f"expected an invalid-argument error ({expected}), got {type(exc).__name__}: {exc}")
    fail(rule, call, "expected an invalid-argument error naming the broken rule, but the call succeeded")
    raise AssertionError("unreachable")


def names_rule(text: str, keywords: tuple[str, ...]) -> bool:
    """Whether ``text`` contains one of ``keywords`` (case-insensitive, a keyword may be a word's start:
    "truncat") in its words, not as a function called in quoted code: PyTorch's "run_func_(…,
    input_handles.size(), …) API call failed" says nothing about a size."""
    return any(
        re.search(rf"{re.escape(k)}(?!\w*\()", text, flags=re.IGNORECASE) is not None for k in keywords
    )


def names_argument(text: str, argument: str) -> bool:
    """Whether ``text`` names ``argument`` as a word of its own: not preceded or followed by a letter,
    digit or underscore (a plain substring test would let "layout" name ``out``)."""
    return re.search(rf"(?<!\w){re.escape(argument)}(?!\w)", text) is not None


def assert_exact(rule: str, call: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bitwise equality in value (not NaN-equal: NaN anywhere is a failure)."""
    if got.shape != expected.shape:
        fail(rule, call, f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}")
    nan = torch.isnan(got.float())
    if bool(nan.any()):
        fail(rule, call, f"{int(nan.sum())} of {got.numel()} elements are NaN: output not written")
    # Compare in the promoted dtype, not float64: int64 values above 2**53 would compare equal as doubles.
    diff = torch.ne(got, expected)
    if bool(diff.any()):
        idx = tuple(int(i) for i in diff.nonzero()[0])
        fail(
            rule,
            call,
            f"{int(diff.sum())} of {got.numel()} elements differ from the exact result; first at {idx}: "
            f"got {got[idx].item()!r}, exact {expected[idx].item()!r}",
        )


def assert_matmul_close(rule: str, call: str, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``got`` ≈ a @ b against a float64 reference, with the dtype's tolerance from ``tolerances.py``."""
    tol = TOLERANCES[got.dtype]
    a64, b64 = a.double(), b.double()
    ref = a64 @ b64
    magnitude = a64.abs() @ b64.abs()
    g = got.double()
    if g.shape != ref.shape:
        fail(rule, call, f"shape {tuple(g.shape)} != expected {tuple(ref.shape)}")
    nan = torch.isnan(g)
    if bool(nan.any()):
        fail(rule, call, f"{int(nan.sum())} of {g.numel()} elements are NaN: output not (fully) written")
    bound = tol.output_roundoff * ref.abs() + tol.accumulation(a.shape[1]) * magnitude + tol.atol
    err = (g - ref).abs()
    bad = err > bound
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        worst = float((err / bound).max())
        fail(
            rule,
            call,
            f"{int(bad.sum())} of {g.numel()} elements outside the {got.dtype} tolerance "
            f"(worst at {worst:.3g}× the bound); first at {idx}: got {g[idx].item()!r}, "
            f"float64 reference {ref[idx].item()!r}, bound {bound[idx].item():.3g}",
        )


def assert_model_output_close(rule: str, call: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    """A lowered model's output ≈ eager float64, norm-wise, within ``MODEL_TOLERANCES`` of ``got``'s dtype."""
    if tuple(got.shape) != tuple(ref.shape):
        fail(rule, call, f"shape {tuple(got.shape)} != eager {tuple(ref.shape)}")
    if got.dtype != ref.dtype and not (got.is_floating_point() and ref.dtype == torch.float64):
        fail(rule, call, f"dtype {got.dtype} != eager {ref.dtype}")
    if not got.is_floating_point():
        if not torch.equal(got.cpu(), ref.cpu()):
            fail(rule, call, "integer output differs from eager")
        return
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    if not bool(torch.isfinite(g).all()):
        fail(rule, call, f"{int((~torch.isfinite(g)).sum())} of {g.numel()} elements are not finite")
    if got.dtype not in MODEL_TOLERANCES:  # e.g. float64 from a float32 model: a finding, not a KeyError
        fail(rule, call, f"no model tolerance for output dtype {got.dtype} (eager gives {ref.dtype})")
    bound = MODEL_TOLERANCES[got.dtype]
    error = float(torch.linalg.vector_norm(g - r) / max(float(torch.linalg.vector_norm(r)), 1e-30))
    if error > bound:
        fail(
            rule, call, f"relative L2 error {error:.3g} against eager float64 exceeds {bound:g} ({got.dtype})"
        )
