"""Chapter compile specs & program format — one file, every method; a bad file is a clear error (SPEC §1a).

Everything here goes through the protocol (``lower``, ``init``, ``execute``): the file format is the
backend's own business, so the checks hold any format to the rules of SPEC §1a:

* **multi-method**: a program lowered from several methods holds each one, initialised by its name.
* **method names** are UTF-8 and matched exactly: a non-ASCII name round-trips from ``lower`` to ``init``;
  a name differing in case, or only in its accents, is not the method.
* **integrity**: ``init`` of an empty, truncated, byte-flipped, over-long or non-bytes program raises an
  invalid-argument error (``ValueError``) that blames the program and names what is wrong — never a crash,
  never another exception type, never a successful load of a tampered file. This runs in-process on
  purpose: a backend that crashes on a bad file fails this chapter loudly, which is the honest result.
  After every rejected file the intact program still initialises and runs.
* **target**: a program lowered for "cpu" on a CUDA machine runs on the CPU. The reference's rule: ``init``
  places a CPU program on the CPU whatever GPUs exist; ``execute`` takes CPU inputs and returns CPU outputs,
  and the skip-copy option changes nothing for it (nothing was on a GPU). Any backend: that correct result,
  or a clear error naming the device or target.

Where the flips land, without knowing the format: the first bytes (any format's magic, version and
lengths), the first occurrence of each method's UTF-8 name (its manifest entry in any format that names
methods before their artifacts), the middle of the i-th of n equal parts of the file (inside method i's
artifact when the n artifacts are of similar size and make up most of the file, as AOTInductor packages
do), the odd sixteenths of the file (1/16, 3/16, ..., 15/16), and the last byte.

Rules read ``program_format/<rule>``. Programs: ``{"mul_add": x*y+z, "plus": x+y}`` and ``{"décodeur": x*y+z,
"解码器": x+y}`` (the zoo's ``add_mul`` and ``add``, float32) per target; a backend that caches compiled
artifacts by content compiles two methods per target for all of them.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from conformance.common.checks import (
    CORRUPT_PROGRAM_WORDS,
    PROGRAM_WORDS,
    UNKNOWN_METHOD_WORDS,
    assert_exact,
    assert_raises_invalid_argument,
    fail,
)
from conformance.common.parts import LoweringRuntimeBackend, require_part
from conformance.common.programs import SKIP_COPY_OPTION, lowered, option
from conformance.common.rules import rule_id
from conformance.models import get_model
from conformance.protocol import LoweringBackend, RuntimeBackend

DTYPE = torch.float32

# The rules of this chapter (conformance/catalogue/rule_table.py).
MULTI_METHOD = rule_id("program_format/multi-method")
NON_ASCII_NAME = rule_id("program_format/non-ascii-name")
METHOD_NAME_CASE = rule_id("program_format/method-name-case")
EMPTY = rule_id("program_format/empty")
NOT_BYTES = rule_id("program_format/not-bytes")
TRUNCATED = rule_id("program_format/truncated")
TRAILING_DATA = rule_id("program_format/trailing-data")
FLIPPED_BYTE = rule_id("program_format/flipped-byte")
CPU_TARGET = rule_id("program_format/cpu-target")

MULTI_METHODS = {"mul_add": "add_mul", "plus": "add"}
"""Method name → zoo model, for the multi-method program."""
NON_ASCII_METHODS = {"décodeur": "add_mul", "解码器": "add"}
"""Non-ASCII method names (2- and 3-byte UTF-8 characters) → zoo model."""

TARGETS = [
    pytest.param("cpu", id="cpu-program"),
    pytest.param("cuda", id="cuda-program", marks=pytest.mark.gpu),
]


# ------------------------------------------------------------------------------------------------ programs


@dataclass(frozen=True)
class Program:
    data: bytes
    eager: dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]
    """Method name → (eager module, example inputs)."""


@functools.cache
def _program(backend: LoweringBackend, methods: tuple[tuple[str, str], ...], device: str) -> Program:
    eager = {name: get_model(model).build(DTYPE, torch.device(device))["forward"] for name, model in methods}
    return Program(backend.lower(eager, device=device), eager)


def program(backend: LoweringBackend, methods: dict[str, str], device: str) -> Program:
    """``methods`` (name → zoo model) lowered into one program for ``device``, once per process."""
    return _program(backend, tuple(methods.items()), device)


def exact_inputs(prog: Program, method: str, seed: int = 0) -> list[torch.Tensor]:
    """Small integers in the method's input shapes and dtypes, on the CPU: the zoo's ``x * y + z`` and
    ``x + y`` are exact on them."""
    _, example = prog.eager[method]
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-8, 9, tuple(t.shape), generator=gen).to(dtype=t.dtype) for t in example]


def eager_outputs(prog: Program, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    module, _ = prog.eager[method]
    reference = copy.deepcopy(module).to(device="cpu", dtype=torch.float64)
    with torch.no_grad():
        result = reference(*(t.detach().cpu().double() for t in inputs))
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    return [o.to(DTYPE) for o in outs]


def check_runs(
    runtime: RuntimeBackend, rule: str, data: bytes, prog: Program, method: str, what: str
) -> None:
    """``init(data, method)`` succeeds and its handle computes the exact result (outputs moved to the CPU)."""
    call = f"init(<{what}>, {method!r}) then execute"
    try:
        handle = runtime.init(data, method)
    except Exception as exc:  # reported as the rule break it is
        fail(rule, call, f"init must succeed, but raised {type(exc).__name__}: {exc}")
    try:
        inputs = exact_inputs(prog, method)
        outs = runtime.execute(handle, inputs)
        expected = eager_outputs(prog, method, inputs)
        if len(outs) != len(expected):
            fail(rule, call, f"returned {len(outs)} outputs, expected {len(expected)}")
        for got, want in zip(outs, expected, strict=True):
            assert_exact(rule, call, got.cpu(), want)
    finally:
        runtime.destroy(handle)


def assert_program_rejected(
    rule: str, call: str, fn: Callable[[], object], keywords: tuple[str, ...] = CORRUPT_PROGRAM_WORDS
) -> None:
    """``fn()`` (an ``init``) raises an invalid-argument error that blames the program and says why."""
    exc = assert_raises_invalid_argument(rule, call, fn, argument="", keywords=keywords)
    if not any(word in str(exc).lower() for word in PROGRAM_WORDS):
        fail(rule, call, f"the error must say the program is at fault (one of {list(PROGRAM_WORDS)}): {exc}")


def reject_everywhere(
    runtime: RuntimeBackend,
    rule: str,
    bad: bytes,
    what: str,
    prog: Program,
    keywords: tuple[str, ...] = CORRUPT_PROGRAM_WORDS,
) -> None:
    """``init(bad, m)`` is rejected for every method ``m``; then the intact program still loads and runs."""
    for method in prog.eager:
        assert_program_rejected(
            rule,
            f"init(<{what}>, {method!r})",
            lambda method=method: runtime.init(bad, method),
            keywords,
        )
    check_runs(
        runtime, rule, prog.data, prog, next(iter(prog.eager)), "the intact program, after the rejection"
    )


# ------------------------------------------------------------------------------------------ multi-method


@pytest.mark.rules(MULTI_METHOD)
@pytest.mark.parametrize("target", TARGETS)
def test_every_method_of_a_multi_method_program(runtime: LoweringRuntimeBackend, target: str) -> None:
    """program_format/multi-method: ``lower`` of two methods returns one program from which each method
    initialises by its name and computes its own function (not the other's)."""
    prog = program(runtime, MULTI_METHODS, target)
    if not isinstance(prog.data, bytes):
        fail(MULTI_METHOD, "lower(...)", f"must return bytes, got {type(prog.data).__name__}")
    with option(runtime, SKIP_COPY_OPTION, ""):
        for method in prog.eager:
            check_runs(runtime, MULTI_METHOD, prog.data, prog, method, f"{target} program")


@pytest.mark.rules(NON_ASCII_NAME)
@pytest.mark.parametrize("target", TARGETS)
def test_non_ascii_method_names_round_trip(runtime: LoweringRuntimeBackend, target: str) -> None:
    """program_format/non-ascii-name: methods named "décodeur" and "解码器" initialise by those names and
    compute their own functions; the ASCII look-alike "decodeur" is not a method of the program."""
    prog = program(runtime, NON_ASCII_METHODS, target)
    with option(runtime, SKIP_COPY_OPTION, ""):
        for method in prog.eager:
            check_runs(runtime, NON_ASCII_NAME, prog.data, prog, method, f"{target} program")
    assert_raises_invalid_argument(
        NON_ASCII_NAME,
        "init(<program of 'décodeur', '解码器'>, 'decodeur')",
        lambda: runtime.init(prog.data, "decodeur"),
        argument="method",
        keywords=UNKNOWN_METHOD_WORDS,
    )


@pytest.mark.rules(METHOD_NAME_CASE)
@pytest.mark.parametrize(
    "name", ["MUL_ADD", "Mul_Add", "Plus", "mul_ad"], ids=["upper", "title", "capital", "prefix"]
)
def test_method_names_match_exactly(runtime: LoweringRuntimeBackend, name: str) -> None:
    """program_format/method-name-case: a method name differing in case (or a prefix of one) is not the
    method: init raises an invalid-argument error naming ``method``."""
    prog = program(runtime, MULTI_METHODS, "cpu")
    assert_raises_invalid_argument(
        METHOD_NAME_CASE,
        f"init(<program of {list(prog.eager)}>, {name!r})",
        lambda: runtime.init(prog.data, name),
        argument="method",
        keywords=UNKNOWN_METHOD_WORDS,
    )


# -------------------------------------------------------------------------------------------- integrity


@pytest.mark.rules(EMPTY)
def test_empty_program(runtime: LoweringRuntimeBackend) -> None:
    """program_format/empty: init of ``b""`` is an invalid-argument error blaming the program, for every
    method."""
    prog = program(runtime, MULTI_METHODS, "cpu")
    reject_everywhere(runtime, EMPTY, b"", "empty bytes", prog)


@pytest.mark.rules(NOT_BYTES)
@pytest.mark.parametrize(
    "not_bytes",
    [None, "a str", 0, [65, 79, 84, 73]],
    ids=["None", "str", "int", "list-of-ints"],
)
def test_program_that_is_not_bytes(runtime: LoweringRuntimeBackend, not_bytes: Any) -> None:
    """program_format/not-bytes: a program argument that is not bytes is an invalid-argument error naming
    ``program`` and the type it must have."""
    prog = program(runtime, MULTI_METHODS, "cpu")
    for method in prog.eager:
        assert_raises_invalid_argument(
            NOT_BYTES,
            f"init({not_bytes!r}, {method!r})",
            lambda method=method: runtime.init(not_bytes, method),
            argument="program",
            keywords=("bytes", "type"),
        )


# truncation → length kept, from the file's length n
TRUNCATIONS: dict[str, Callable[[int], int]] = {
    "first-byte-only": lambda n: 1,
    "8-bytes": lambda n: 8,
    "mid-header-16-bytes": lambda n: 16,
    "mid-header-64-bytes": lambda n: 64,
    "quarter": lambda n: n // 4,
    "half": lambda n: n // 2,
    "three-quarters": lambda n: 3 * n // 4,
    "last-byte-missing": lambda n: n - 1,
}


@pytest.mark.rules(TRUNCATED)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("cut", list(TRUNCATIONS))
def test_truncated_program(runtime: LoweringRuntimeBackend, target: str, cut: str) -> None:
    """program_format/truncated: a program cut short (inside the header, inside an artifact, one byte short)
    is an invalid-argument error blaming the program, for every method; the intact program still runs."""
    prog = program(runtime, MULTI_METHODS, target)
    n = len(prog.data)
    keep = TRUNCATIONS[cut](n)
    what = f"the first {keep} of {n} bytes ({cut})"
    reject_everywhere(runtime, TRUNCATED, prog.data[:keep], what, prog)


@pytest.mark.rules(TRAILING_DATA)
def test_trailing_bytes(runtime: LoweringRuntimeBackend) -> None:
    """program_format/trailing-data: bytes after the program's declared end are tampering, not padding: an
    invalid-argument error blaming the program, for every method."""
    prog = program(runtime, MULTI_METHODS, "cpu")
    bad = prog.data + b"\0"
    keywords = (*CORRUPT_PROGRAM_WORDS, "follow", "must end", "extra", "after the end")
    reject_everywhere(runtime, TRAILING_DATA, bad, "program + one zero byte", prog, keywords)


def _name_position(data: bytes, names: Sequence[str], index: int) -> int:
    encoded = names[index].encode("utf-8")
    position = data.find(encoded)
    if position < 0:
        fail(FLIPPED_BYTE, "locating the method name", f"{names[index]!r} does not occur in the file")
    return position


# position name → byte offset, from (file, method names)
FLIPS: dict[str, Callable[[bytes, Sequence[str]], int]] = {
    "first-byte": lambda d, m: 0,
    "byte-4": lambda d, m: 4,
    "byte-8": lambda d, m: 8,
    "byte-9": lambda d, m: 9,
    "byte-12": lambda d, m: 12,
    "byte-16": lambda d, m: 16,
    "byte-32": lambda d, m: 32,
    "byte-64": lambda d, m: 64,
    "name-of-method-0": lambda d, m: _name_position(d, m, 0),
    "name-of-method-1": lambda d, m: _name_position(d, m, 1),
    "artifact-of-method-0": lambda d, m: len(d) * 1 // (2 * len(m)),
    "artifact-of-method-1": lambda d, m: len(d) * 3 // (2 * len(m)),
    **{f"sixteenth-{k}": (lambda d, m, k=k: len(d) * k // 16) for k in range(1, 16, 2)},
    "last-byte": lambda d, m: len(d) - 1,
}


@pytest.mark.rules(FLIPPED_BYTE)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("where", list(FLIPS))
def test_flipped_byte(runtime: LoweringRuntimeBackend, target: str, where: str) -> None:
    """program_format/flipped-byte: one byte inverted (XOR 0xFF) anywhere — header, manifest, a method name,
    each method's artifact, the end — is an invalid-argument error blaming the program, for every method (a
    tampered file is refused as a whole); the intact program still runs."""
    prog = program(runtime, MULTI_METHODS, target)
    position = FLIPS[where](prog.data, list(prog.eager))
    bad = bytearray(prog.data)
    bad[position] ^= 0xFF
    what = (
        f"byte {position} of {len(bad)} flipped ({where}: {prog.data[position]:#04x} → {bad[position]:#04x})"
    )
    reject_everywhere(runtime, FLIPPED_BYTE, bytes(bad), what, prog)


# ------------------------------------------------------------------------------------------------- target


@pytest.mark.rules(CPU_TARGET)
@pytest.mark.gpu
@pytest.mark.parametrize("skip_copy", ["unset", "names-the-method"])
def test_cpu_program_on_a_cuda_machine(runtime: LoweringRuntimeBackend, skip_copy: str) -> None:
    """program_format/cpu-target: a program lowered for "cpu", initialised where CUDA is present, runs on the
    CPU: CPU inputs give the exact result as CPU tensors, whether or not the skip-copy option names the method
    (the reference's rule). A clear refusal (a ValueError naming the device or target) also conforms;
    anything else — a wrong result, outputs on a GPU, another exception type — does not."""
    rule = CPU_TARGET
    if skip_copy == "names-the-method":
        require_part(runtime, "runtime_options")
    lm = lowered(runtime, "add_mul", DTYPE, "cpu")
    prog = Program(lm.program, lm.eager)
    inputs = exact_inputs(prog, "forward")
    expected = eager_outputs(prog, "forward", inputs)
    call = f"init(<cpu program>, 'forward') then execute with skip-copy {skip_copy} on a CUDA machine"
    refusal_words = ("cpu", "cuda", "device", "target")
    with option(runtime, SKIP_COPY_OPTION, "forward" if skip_copy == "names-the-method" else ""):
        try:
            handle = runtime.init(lm.program, "forward")
        except ValueError as exc:
            if not any(word in str(exc).lower() for word in refusal_words):
                fail(rule, call, f"a refusal must name the device or target ({refusal_words}): {exc}")
            return
        except Exception as exc:  # reported as the rule break it is
            fail(
                rule,
                call,
                f"expected the program to run or a clear ValueError, got {type(exc).__name__}: {exc}",
            )
        try:
            try:
                outs = runtime.execute(handle, inputs)
            except ValueError as exc:
                if not any(word in str(exc).lower() for word in refusal_words):
                    fail(rule, call, f"a refusal must name the device or target ({refusal_words}): {exc}")
                return
            if len(outs) != len(expected):
                fail(rule, call, f"returned {len(outs)} outputs, expected {len(expected)}")
            for index, (got, want) in enumerate(zip(outs, expected, strict=True)):
                if got.device.type != "cpu":
                    fail(
                        rule,
                        call,
                        f"outputs[{index}] is on {got.device}; a CPU program's outputs are CPU tensors",
                    )
                assert_exact(rule, call, got, want)
        finally:
            runtime.destroy(handle)
