"""Chapter runtime_options — runtime options and skip-copy (SPEC §1b; parts ``runtime_options``, ``runtime``).

Two sections, every check naming its rule:

* **options API** (``runtime_options/<rule>``): ``set_option`` / ``get_option`` before and after ``init``,
  effective on the next execute and never retroactively; non-string values, over-long keys (> 63 characters)
  and values (> 255 characters), values or keys containing NUL (a C consumer would cut them there) and unknown
  keys are invalid-argument errors that name the key and change nothing (all or nothing, no truncation);
  other control characters are kept exactly or rejected, never silently altered. Unknown keys are
  rejected — the suite's documented decision, because a misspelt ``skip_copy_output_to_cpu_for_methods``
  that were silently accepted would quietly keep copying every output to the host. List values: tokens
  trimmed, empties ignored, exact case-sensitive match.
* **skip-copy matrix** (``runtime_options/<rule>``): option unset / each method / both / a list with spaces /
  an unknown method / the empty string × dtypes × the two multi-method models (``asr``: encoder → decoder,
  ``llm``: prefill → decode). Every method runs once, chained as in real use (the decoder gets the
  encoder's output, decode gets prefill's caches), and is held to: where its outputs live, their values
  against eager PyTorch in float64 (``MODEL_TOLERANCES``), ``execute_stats`` byte counters, and — with the
  torch profiler — that a skipped method makes no device→host copy at all while a copied one does.

Programs lowered (each once per process; the reference backend also caches them on disk): CPU runs need
``asr`` and ``llm`` in float32 for the CPU (2 programs); CUDA runs add ``asr`` and ``llm`` × float32,
float16, bfloat16 for CUDA (6 programs). ``test_multi_method.py`` uses the very same ones.
The CPU target runs the matrix in float32 only: its outputs are always host tensors and its counters 0,
whatever the option says; the device-specific checks are marked ``gpu``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conformance.common.checks import assert_raises_invalid_argument, fail, snapshot
from conformance.common.method_runs import (
    MODEL_METHODS,
    PINNED_HOST_MEMORY,
    SKIP_COPY,
    check_cpu_target,
    check_output_copies,
    check_pinned_copies,
    check_values,
    check_where_data_went,
    cuda_device,
    devices,
    profiled_copies,
    relative_error,
    run_methods,
)
from conformance.common.parts import OptionsRuntimeBackend, part_fixture
from conformance.common.programs import LOWER, SKIP_COPY_OPTION, handles, lower_or_fail, option_restored
from conformance.common.rules import rule_id
from conformance.common.tolerances import DTYPES_BY_NAME, MODEL_TOLERANCES
from conformance.models import HF_MODELS, HF_UNAVAILABLE
from conformance.protocol import RuntimeOptionsBackend

SKIP = SKIP_COPY_OPTION
DTYPES = list(DTYPES_BY_NAME)
#: The CPU target runs float32 only: it keeps the CPU part to two programs (half precision is a GPU matter).
CPU_DTYPES = ["float32"]
#: Upstream's C buffers: 64-byte keys and 256-byte values, NUL included.
MAX_KEY_CHARS, MAX_VALUE_CHARS = 63, 255

# The rules of this chapter (conformance/catalogue/rule_table.py); runtime_options/<check> of a run:
# SKIP_COPY.
ROUND_TRIP = rule_id("runtime_options/round-trip")
ALL_OR_NOTHING = rule_id("runtime_options/all-or-nothing")
BEFORE_INIT = rule_id("runtime_options/before-init")
LIST_VALUES_RULE = rule_id("runtime_options/list-values")
NON_STRING_VALUE = rule_id("runtime_options/non-string-value")
NON_STRING_KEY = rule_id("runtime_options/non-string-key")
KEY_LENGTH = rule_id("runtime_options/key-length")
VALUE_LENGTH = rule_id("runtime_options/value-length")
UNKNOWN_KEY = rule_id("runtime_options/unknown-key")
NUL_CHARACTER = rule_id("runtime_options/nul-character")
CONTROL_CHARACTERS = rule_id("runtime_options/control-characters")
AFTER_INIT = rule_id("runtime_options/after-init")
NEXT_EXECUTE = rule_id("runtime_options/next-execute")
NOT_RETROACTIVE = rule_id("runtime_options/not-retroactive")
LIST_PARSING = rule_id("runtime_options/list-parsing")
DEFAULT_OPTION = rule_id("runtime_options/default")
SKIP_COPY_ACCEPTED = rule_id("runtime_options/option")


# ================================================================================================ helpers


# Cases annotate them ``RuntimeOptionsBackend`` and ``OptionsRuntimeBackend``.
rt = part_fixture(
    "runtime_options",
    hold=option_restored,
    doc="A backend with runtime options; the case may set the option directly, and it is restored after.",
)
rt_runtime = part_fixture(
    "runtime_options",
    "lowering",
    "runtime",
    hold=option_restored,
    doc="The option on programs it runs: parts ``runtime_options``, ``lowering`` and ``runtime``.",
)


def methods_named(value: object) -> set[str]:
    """The method names an option value selects, by the spec's rule (trim tokens, drop empties)."""
    return {t.strip() for t in value.split(",") if t.strip()} if isinstance(value, str) else set()


def get_skip(backend: RuntimeOptionsBackend, rule: str) -> object:
    try:
        return backend.get_option(SKIP)
    except Exception as exc:
        fail(rule, f"get_option({SKIP!r})", f"a known key must be readable, but it raised {exc!r}")
    raise AssertionError("unreachable")


def set_skip(backend: RuntimeOptionsBackend, value: str, rule: str) -> None:
    try:
        backend.set_option(SKIP, value)
    except Exception as exc:
        fail(rule, f"set_option({SKIP!r}, {value!r})", f"a valid value was rejected: {exc!r}")


def check_round_trip(backend: RuntimeOptionsBackend, value: str, rule: str = ROUND_TRIP) -> None:
    got = get_skip(backend, rule)
    if not isinstance(got, str) or methods_named(got) != methods_named(value):
        fail(rule, f"get_option({SKIP!r})", f"after set_option(..., {value!r}) it returned {got!r}")


def check_unchanged(backend: RuntimeOptionsBackend, before: object, call: str) -> None:
    after = get_skip(backend, ALL_OR_NOTHING)
    if after != before:
        fail(ALL_OR_NOTHING, call, f"failed, yet changed the option from {before!r} to {after!r}")


# ============================================================================================ options API

KEY_64 = SKIP + "_" * (MAX_KEY_CHARS + 1 - len(SKIP))
KEY_63 = SKIP + "_" * (MAX_KEY_CHARS - len(SKIP))
#: 255 characters naming decoder and encoder, and the same list one comma longer (256): truncating that one
#: to 255 characters would keep a valid-looking list ending in "encode", so truncation cannot hide.
VALUE_255 = "decoder" + "," * (MAX_VALUE_CHARS - 14) + "encoder"
VALUE_256 = "decoder" + "," * (MAX_VALUE_CHARS + 1 - 14) + "encoder"
#: Values of the wrong type, passed on purpose (hence ``Any``).
WRONG_TYPES: dict[str, Any] = {"int": 1, "None": None, "bytes": b"decoder", "list": ["decoder"]}
UNKNOWN_KEYS = {
    "plural-typo": SKIP + "s",
    "case": SKIP.upper(),
    "trailing-space": SKIP + " ",
    "63-chars": KEY_63,
}
#: value → the methods it selects. The spec: tokens trimmed, empties ignored, exact case-sensitive match.
LIST_VALUES: dict[str, tuple[str, set[str]]] = {
    "both-spaced": ("encoder, decoder", {"encoder", "decoder"}),
    "padded": (" decoder ,", {"decoder"}),
    "empties": (",,decoder,,", {"decoder"}),
    "tabs-newlines": ("\tencoder\n", {"encoder"}),
    "wrong-case": ("Decoder", set()),
    "prefix-only": ("decode", set()),
    "inner-space": ("encoder decoder", set()),
    "empty-string": ("", set()),
    "only-commas": (" , ,", set()),
    "255-chars": (VALUE_255, {"decoder", "encoder"}),
}


@pytest.mark.rules(BEFORE_INIT, ROUND_TRIP)
def test_options_before_init(rt: RuntimeOptionsBackend) -> None:
    """runtime_options/round-trip: the option can be set and read with no handle in existence
    (backend-wide)."""
    for value in ("decoder", "encoder,decoder", ""):
        set_skip(rt, value, BEFORE_INIT)
        check_round_trip(rt, value)


@pytest.mark.rules(LIST_VALUES_RULE, ROUND_TRIP)
@pytest.mark.parametrize("label", list(LIST_VALUES))
def test_list_values_are_accepted_and_read_back(rt: RuntimeOptionsBackend, label: str) -> None:
    """runtime_options/round-trip: every well-formed list (255 characters included) is accepted, and
    ``get_option`` returns a string naming the same methods."""
    value, _ = LIST_VALUES[label]
    set_skip(rt, value, LIST_VALUES_RULE)
    check_round_trip(rt, value)


@pytest.mark.rules(NON_STRING_VALUE, ALL_OR_NOTHING)
@pytest.mark.parametrize("label", list(WRONG_TYPES))
def test_non_string_value_changes_nothing(rt: RuntimeOptionsBackend, label: str) -> None:
    """runtime_options/non-string-value: a value that is not a str is an invalid-argument error naming the
    key, and the option keeps its previous value (runtime_options/all-or-nothing)."""
    value = WRONG_TYPES[label]
    set_skip(rt, "encoder", NON_STRING_VALUE)
    call = f"set_option({SKIP!r}, {value!r})"
    assert_raises_invalid_argument(
        NON_STRING_VALUE,
        call,
        lambda: rt.set_option(SKIP, value),
        argument=SKIP,
        keywords=("str", "string", "type"),
    )
    check_unchanged(rt, "encoder", call)


@pytest.mark.rules(NON_STRING_KEY, ALL_OR_NOTHING)
@pytest.mark.parametrize("key", [None, 42], ids=["None", "int"])
def test_non_string_key_is_rejected(rt: RuntimeOptionsBackend, key: Any) -> None:
    """runtime_options/non-string-key: a key that is not a str is an invalid-argument error; nothing
    changes."""
    set_skip(rt, "decoder", NON_STRING_KEY)
    call = f"set_option({key!r}, 'encoder')"
    assert_raises_invalid_argument(
        NON_STRING_KEY,
        call,
        lambda: rt.set_option(key, "encoder"),
        argument="key",
        keywords=("str", "string", "type"),
    )
    check_unchanged(rt, "decoder", call)


@pytest.mark.rules(KEY_LENGTH, ALL_OR_NOTHING)
def test_key_over_63_characters_is_rejected(rt: RuntimeOptionsBackend) -> None:
    """runtime_options/key-length: a 64-character key is an error naming the limit, never truncated to 63."""
    set_skip(rt, "decoder", KEY_LENGTH)
    call = f"set_option({KEY_64!r}, 'encoder')"
    assert_raises_invalid_argument(
        KEY_LENGTH,
        call,
        lambda: rt.set_option(KEY_64, "encoder"),
        argument="key",
        keywords=(str(MAX_KEY_CHARS), "too long", "limit"),
    )
    check_unchanged(rt, "decoder", call)


@pytest.mark.rules(VALUE_LENGTH, ALL_OR_NOTHING, ROUND_TRIP)
def test_value_over_255_characters_is_rejected_not_truncated(rt: RuntimeOptionsBackend) -> None:
    """runtime_options/value-length: a 256-character value is an error naming the key; the option keeps its
    old value (not the first 255 characters); exactly 255 characters are accepted."""
    set_skip(rt, "decoder", VALUE_LENGTH)
    call = f"set_option({SKIP!r}, <{len(VALUE_256)} characters>)"
    assert_raises_invalid_argument(
        VALUE_LENGTH,
        call,
        lambda: rt.set_option(SKIP, VALUE_256),
        argument=SKIP,
        keywords=(str(MAX_VALUE_CHARS), "too long", "limit"),
    )
    check_unchanged(rt, "decoder", call)
    set_skip(rt, VALUE_255, VALUE_LENGTH)
    check_round_trip(rt, VALUE_255, VALUE_LENGTH)


@pytest.mark.rules(UNKNOWN_KEY, ALL_OR_NOTHING)
@pytest.mark.parametrize("label", list(UNKNOWN_KEYS))
def test_unknown_key_is_rejected(rt: RuntimeOptionsBackend, label: str) -> None:
    """runtime_options/unknown-key: ``set_option`` and ``get_option`` reject an unknown key (a 63-character
    one too: within the length limit, but unknown) with an error naming it; nothing changes."""
    key = UNKNOWN_KEYS[label]
    set_skip(rt, "decoder", UNKNOWN_KEY)
    keywords = ("unknown", "not known", "unsupported", "not a valid", "invalid")
    call = f"set_option({key!r}, 'encoder')"
    assert_raises_invalid_argument(
        UNKNOWN_KEY,
        call,
        lambda: rt.set_option(key, "encoder"),
        argument=key,
        keywords=keywords,
    )
    check_unchanged(rt, "decoder", call)
    assert_raises_invalid_argument(
        UNKNOWN_KEY,
        f"get_option({key!r})",
        lambda: rt.get_option(key),
        argument=key,
        keywords=keywords,
    )


#: Values a C consumer (upstream copies them into ``char[256]``) would silently cut at the NUL: the first
#: two would then name ``decoder`` alone, the third would name nothing: never what the caller wrote.
NUL_VALUES = {"inside": "decoder\0encoder", "trailing": "decoder\0", "only": "\0"}
NUL_KEYS = {"after-known-key": SKIP + "\0", "inside-known-key": "skip_copy\0output_to_cpu_for_method"}


@pytest.mark.rules(NUL_CHARACTER, ALL_OR_NOTHING)
@pytest.mark.parametrize("label", list(NUL_VALUES))
def test_nul_in_a_value_is_rejected(rt: RuntimeOptionsBackend, label: str) -> None:
    """runtime_options/nul-character: a value containing NUL is an invalid-argument error naming the key, and
    the option keeps its value. Accepting it would be the silent truncation the spec forbids (SPEC §1b): a C
    runtime reads the string only up to the NUL."""
    value = NUL_VALUES[label]
    set_skip(rt, "encoder", NUL_CHARACTER)
    call = f"set_option({SKIP!r}, {value!r})"
    assert_raises_invalid_argument(
        NUL_CHARACTER,
        call,
        lambda: rt.set_option(SKIP, value),
        argument=SKIP,
        keywords=("nul", "\\x00", "\\0", "null"),
    )
    check_unchanged(rt, "encoder", call)


@pytest.mark.rules(NUL_CHARACTER, ALL_OR_NOTHING)
@pytest.mark.parametrize("label", list(NUL_KEYS))
def test_nul_in_a_key_is_rejected(rt: RuntimeOptionsBackend, label: str) -> None:
    """runtime_options/nul-character: a key containing NUL is an invalid-argument error, never the key before
    the NUL (which here is the known key, or a prefix of it); nothing changes."""
    key = NUL_KEYS[label]
    set_skip(rt, "decoder", NUL_CHARACTER)
    call = f"set_option({key!r}, 'encoder')"
    assert_raises_invalid_argument(
        NUL_CHARACTER,
        call,
        lambda: rt.set_option(key, "encoder"),
        argument="key",
        keywords=("nul", "\\x00", "\\0", "null", "unknown"),
    )
    check_unchanged(rt, "decoder", call)


#: Control characters that are not whitespace (so not trimmed by the list rule): part of the token they
#: are in, so each of these names no method of the program.
CONTROL_VALUES = {
    "bell": "decoder\x07",
    "escape": "\x1bencoder",
    "start-of-heading": "\x01decoder",
    "delete": "decoder\x7f",
}


@pytest.mark.rules(CONTROL_CHARACTERS, ALL_OR_NOTHING)
@pytest.mark.parametrize("label", list(CONTROL_VALUES))
def test_control_characters_are_kept_or_rejected(rt: RuntimeOptionsBackend, label: str) -> None:
    """runtime_options/control-characters: the spec gives control characters no meaning, so a backend may
    reject a value containing one (an invalid-argument error naming the key; nothing changes) or keep it
    exactly. What it must not do is alter it silently: strip ``\\x07`` from ``"decoder\\x07"`` and the option
    names ``decoder``, a method the caller did not name (exact match)."""
    rule = CONTROL_CHARACTERS
    value = CONTROL_VALUES[label]
    set_skip(rt, "encoder", rule)
    call = f"set_option({SKIP!r}, {value!r})"
    try:
        rt.set_option(SKIP, value)
    except ValueError as exc:
        if SKIP not in str(exc):
            fail(rule, call, f"a rejection must name the key {SKIP!r}; it said: {exc}")
        check_unchanged(rt, "encoder", call)
        return
    except Exception as exc:  # any other exception type is itself the rule break
        fail(rule, call, f"expected success or an invalid-argument error, got {type(exc).__name__}: {exc}")
    got = get_skip(rt, rule)
    if got != value:
        fail(rule, call, f"accepted, but get_option returns {got!r}: the value was altered, not kept")


@pytest.mark.rules(AFTER_INIT, ROUND_TRIP, LOWER, SKIP_COPY.output_device)
@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu-target", "cuda-target"]
)
def test_options_with_live_handles(rt_runtime: OptionsRuntimeBackend, device: str) -> None:
    """runtime_options/after-init: with handles alive the option is set and read back, and executes keep
    working and stay correct (float32 ``llm``). On a CPU target outputs stay host tensors whatever the option
    says."""
    rt = rt_runtime
    lm = lower_or_fail(rt, "llm", "float32", device)
    with handles(rt, lm.program, *lm.methods) as made:
        for value in ("prefill", "prefill, decode", "decode", ""):
            set_skip(rt, value, AFTER_INIT)
            check_round_trip(rt, value)
            runs = run_methods(rt, lm, made)
            for method, run in runs.items():
                call = f"execute({method}) with {SKIP}={value!r}"
                check_values(AFTER_INIT, call, lm, run)
                skipped = device == "cuda" and method in methods_named(value)
                want = str(cuda_device()) if skipped else "cpu"
                if any(d != want for d in devices(run.outputs)):
                    fail(SKIP_COPY.output_device, call, f"outputs on {devices(run.outputs)}, want {want}")


@pytest.mark.rules(NEXT_EXECUTE, NOT_RETROACTIVE, LOWER)
@pytest.mark.gpu
def test_option_change_applies_to_next_execute_only(rt_runtime: OptionsRuntimeBackend) -> None:
    """runtime_options/next-execute: a change takes effect on the next execute;
    runtime_options/not-retroactive: outputs already returned stay where they are, with the same contents."""
    rt = rt_runtime
    lm = lower_or_fail(rt, "llm", "float32", "cuda")
    inputs = [t.detach().cpu() for t in lm.eager["prefill"][1]]
    call = "execute(prefill)"
    set_skip(rt, "", NEXT_EXECUTE)
    with handles(rt, lm.program, "prefill") as (prefill,):
        host = rt.execute(prefill, inputs)
        host_before = [snapshot(t) for t in host]
        set_skip(rt, "prefill", NEXT_EXECUTE)
        if devices(host) != ["cpu"] * len(host) or not all(
            torch.equal(a, b) for a, b in zip(host, host_before, strict=True)
        ):
            fail(NOT_RETROACTIVE, call, "outputs returned before set_option moved or changed")
        kept = rt.execute(prefill, inputs)
        if any(d != str(cuda_device()) for d in devices(kept)):
            fail(NEXT_EXECUTE, call, f"after naming prefill, outputs are on {devices(kept)}")
        kept_before = [snapshot(t) for t in kept]
        set_skip(rt, "", NEXT_EXECUTE)
        if any(d != str(cuda_device()) for d in devices(kept)) or not all(
            torch.equal(a, b) for a, b in zip(kept, kept_before, strict=True)
        ):
            fail(NOT_RETROACTIVE, call, "device outputs moved or changed when the option changed")
        again = rt.execute(prefill, inputs)
        if devices(again) != ["cpu"] * len(again):
            fail(NEXT_EXECUTE, call, f"after clearing the option, outputs are on {devices(again)}")
        for index, (got, ref) in enumerate(zip(again, kept, strict=True)):
            err = relative_error(got, ref)
            if not err <= MODEL_TOLERANCES[torch.float32]:
                fail(
                    NEXT_EXECUTE,
                    call,
                    f"output {index}: copied and kept results differ ({err:.3g})",
                )


@pytest.mark.rules(LIST_PARSING, LOWER)
@pytest.mark.gpu
@pytest.mark.parametrize("label", list(LIST_VALUES))
def test_list_parsing_selects_methods(rt_runtime: OptionsRuntimeBackend, label: str) -> None:
    """runtime_options/list-parsing: set before ``init``, a list keeps exactly the methods it names on the GPU
    (tokens trimmed, empties ignored, case-sensitive, whole-name match); the others are copied out."""
    rt = rt_runtime
    value, expected = LIST_VALUES[label]
    lm = lower_or_fail(rt, "asr", "float32", "cuda")
    set_skip(rt, value, LIST_PARSING)
    with handles(rt, lm.program, *lm.methods) as made:
        runs = run_methods(rt, lm, made)
    for method, run in runs.items():
        want = str(cuda_device()) if method in expected else "cpu"
        if any(d != want for d in devices(run.outputs)):
            fail(
                LIST_PARSING,
                f"execute({method}) with {SKIP}={value!r}",
                f"outputs on {devices(run.outputs)}; {method!r} is {'' if method in expected else 'not '}"
                f"named, so they belong on {want}",
            )


# ========================================================================================= skip-copy matrix


def _skip_cases() -> list:
    cases = []
    for model, (first, second) in MODEL_METHODS.items():
        rows = [
            ("unset", None, set()),
            (first, first, {first}),
            (second, second, {second}),
            ("both", f"{first},{second}", {first, second}),
            ("both-spaced", f" {first} , {second} ", {first, second}),
            ("unknown-method", "forward", set()),
            ("empty", "", set()),
        ]
        cases += [pytest.param(model, v, s, id=f"{model}-{label}") for label, v, s in rows]
    if HF_UNAVAILABLE is not None:
        # Their method names live in the absent entries: one skipped case per model says why, so the
        # matrix reports them as skipped instead of silently shrinking.
        skip = pytest.mark.skip(reason=HF_UNAVAILABLE)
        cases += [pytest.param(name, None, set(), id=f"{name}-all", marks=skip) for name in HF_MODELS]
    return cases


SKIP_CASES = _skip_cases()


def _apply_skip(rt: RuntimeOptionsBackend, model: str, value: str | None) -> None:
    """Set the option (after ``init``: handles exist), or for ``unset`` check the default names nothing."""
    if value is not None:
        set_skip(rt, value, SKIP_COPY_ACCEPTED)
        return
    default = get_skip(rt, DEFAULT_OPTION)
    named = methods_named(default) & set(MODEL_METHODS[model])
    if named:
        fail(DEFAULT_OPTION, f"get_option({SKIP!r})", f"never set, yet it names {sorted(named)}")


@pytest.mark.rules(LOWER, DEFAULT_OPTION, SKIP_COPY_ACCEPTED, PINNED_HOST_MEMORY, *SKIP_COPY.on_cuda)
@pytest.mark.gpu
@pytest.mark.parametrize(("model", "value", "skipped"), SKIP_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_skip_copy_matrix(
    rt_runtime: OptionsRuntimeBackend, dtype: str, model: str, value: str | None, skipped: set[str]
) -> None:
    """The skip-copy matrix (``runtime_options/output-device``, ``values``, ``d2h-bytes``, ...): a method
    named in the option returns CUDA tensors on the handle's device and moves no byte device→host (counter and
    profiler); any other returns host tensors and counts their bytes; inputs already on the device are not
    copied; values match float64 eager either way."""
    rt = rt_runtime
    lm = lower_or_fail(rt, model, dtype, "cuda")
    with handles(rt, lm.program, *lm.methods) as made:
        _apply_skip(rt, model, value)
        runs = run_methods(rt, lm, made)
        for method, run in runs.items():
            call = f"execute({model}.{method}, {dtype}) with {SKIP}={value!r}"
            check_where_data_went(SKIP_COPY, call, lm, run, keep=method in skipped)
        # Each execute again, under the profiler: what actually crosses PCIe device→host.
        for method, run in runs.items():
            call = f"execute({model}.{method}, {dtype}) with {SKIP}={value!r}"
            copies = profiled_copies(rt, run, outputs_copied=method not in skipped)
            check_output_copies(SKIP_COPY, call, copies, keep=method in skipped)
            check_pinned_copies(call, copies)


@pytest.mark.rules(LOWER, DEFAULT_OPTION, SKIP_COPY_ACCEPTED, *SKIP_COPY.on_cpu)
@pytest.mark.parametrize(("model", "value", "skipped"), SKIP_CASES)
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_skip_copy_matrix_cpu_target(
    rt_runtime: OptionsRuntimeBackend, dtype: str, model: str, value: str | None, skipped: set[str]
) -> None:
    """runtime_options/cpu-target: on a program lowered for the CPU the option changes nothing: every output
    is a host tensor, both byte counters are 0, and values match float64 eager."""
    rt = rt_runtime
    lm = lower_or_fail(rt, model, dtype, "cpu")
    with handles(rt, lm.program, *lm.methods) as made:
        _apply_skip(rt, model, value)
        runs = run_methods(rt, lm, made)
    for method, run in runs.items():
        call = f"execute({model}.{method}, {dtype}, cpu target) with {SKIP}={value!r}"
        check_cpu_target(SKIP_COPY, call, lm, run)
