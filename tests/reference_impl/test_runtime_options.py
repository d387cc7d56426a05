"""Runtime options: parsing, limits, unknown keys, all-or-nothing updates and thread safety."""

from __future__ import annotations

import threading

import pytest

from reference_impl.runtime import options as opts
from reference_impl.runtime.options import (
    MAX_KEY_CHARS,
    MAX_VALUE_CHARS,
    OptionError,
    OptionStore,
    parse_method_list,
)
from reference_impl.runtime.options import (
    SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP,
)


@pytest.fixture
def store() -> OptionStore:
    return OptionStore()


@pytest.fixture(autouse=True)
def _restore_global_options():
    yield
    opts.reset_options()


def test_default_is_empty_and_nothing_is_skipped(store: OptionStore) -> None:
    assert store.get_option(SKIP) == ""
    assert store.skip_copy_methods() == frozenset()
    assert not store.should_skip_copy("forward")


def test_single_method_name(store: OptionStore) -> None:
    store.set_option(SKIP, "decoder")
    assert store.get_option(SKIP) == "decoder"
    assert store.should_skip_copy("decoder")
    assert not store.should_skip_copy("encoder")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a,b", {"a", "b"}),
        ("  a , b  ", {"a", "b"}),
        ("a,,b,", {"a", "b"}),
        (",,, ,", set()),
        ("", set()),
        ("\tprefill ,\ndecode", {"prefill", "decode"}),
        ("a b,c", {"a b", "c"}),  # inner whitespace is part of the token
    ],
)
def test_list_parsing_trims_tokens_and_ignores_empties(store: OptionStore, value: str, expected: set) -> None:
    assert parse_method_list(value) == frozenset(expected)
    store.set_option(SKIP, value)
    assert store.skip_copy_methods() == frozenset(expected)
    assert store.get_option(SKIP) == value  # stored as given


def test_matching_is_exact_and_case_sensitive(store: OptionStore) -> None:
    store.set_option(SKIP, "Decoder, prefill")
    assert store.should_skip_copy("Decoder")
    assert not store.should_skip_copy("decoder")
    assert not store.should_skip_copy("DECODER")
    assert not store.should_skip_copy("prefil")  # no prefix match
    assert not store.should_skip_copy("prefill2")
    assert not store.should_skip_copy(" prefill")


@pytest.mark.parametrize("method", [None, ""])
def test_handle_without_method_name_never_matches(store: OptionStore, method) -> None:
    store.set_option(SKIP, "a, ,b,")
    assert not store.should_skip_copy(method)


@pytest.mark.parametrize("value", [None, 1, 1.5, True, b"decoder", ["decoder"], {"decoder"}])
def test_non_string_value_is_rejected_and_changes_nothing(store: OptionStore, value) -> None:
    store.set_option(SKIP, "before")
    with pytest.raises(OptionError, match=SKIP) as info:
        store.set_option(SKIP, value)
    assert "must be a str" in str(info.value)
    assert isinstance(info.value, ValueError)
    assert store.get_option(SKIP) == "before"


def test_value_length_limit_is_enforced_not_truncated(store: OptionStore) -> None:
    ok = "m" * MAX_VALUE_CHARS
    store.set_option(SKIP, ok)
    assert store.get_option(SKIP) == ok
    with pytest.raises(OptionError, match=rf"{MAX_VALUE_CHARS} characters") as info:
        store.set_option(SKIP, "m" * (MAX_VALUE_CHARS + 1))
    assert SKIP in str(info.value)
    assert store.get_option(SKIP) == ok  # unchanged, and certainly not a truncated copy


def test_key_length_limit_is_enforced(store: OptionStore) -> None:
    long_key = "k" * (MAX_KEY_CHARS + 1)
    with pytest.raises(OptionError, match=rf"limited to {MAX_KEY_CHARS} characters"):
        store.set_option(long_key, "x")
    with pytest.raises(OptionError, match=rf"limited to {MAX_KEY_CHARS} characters"):
        store.get_option(long_key)


def test_key_at_the_limit_is_judged_by_name(store: OptionStore) -> None:
    # A 63-character key passes the length rule and is then rejected only because it is unknown.
    with pytest.raises(OptionError, match="unknown option key"):
        store.set_option("k" * MAX_KEY_CHARS, "x")


@pytest.mark.parametrize(
    "key", ["skip_copy_output_to_cpu_for_methods", "SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD", ""]
)
def test_unknown_keys_are_rejected_listing_the_known_ones(store: OptionStore, key: str) -> None:
    with pytest.raises(OptionError, match="unknown option key") as info:
        store.set_option(key, "decoder")
    assert SKIP in str(info.value)  # the message lists the known keys
    with pytest.raises(OptionError, match="unknown option key"):
        store.get_option(key)
    assert store.get_option(SKIP) == ""


@pytest.mark.parametrize("key", [None, 3, b"skip"])
def test_non_string_key_is_rejected(store: OptionStore, key) -> None:
    with pytest.raises(OptionError, match="key must be a str"):
        store.set_option(key, "x")


def test_nul_characters_are_rejected(store: OptionStore) -> None:
    with pytest.raises(OptionError, match="NUL"):
        store.set_option(SKIP, "dec\0oder")
    assert store.get_option(SKIP) == ""


def test_set_options_is_all_or_nothing_when_the_last_pair_is_bad(store: OptionStore) -> None:
    store.set_option(SKIP, "before")
    with pytest.raises(OptionError, match="must be a str"):
        store.set_options([(SKIP, "first"), (SKIP, 42)])
    assert store.get_option(SKIP) == "before"
    with pytest.raises(OptionError, match="unknown option key"):
        store.set_options([(SKIP, "first"), ("typo_key", "x")])
    assert store.get_option(SKIP) == "before"
    with pytest.raises(OptionError, match=f"{MAX_VALUE_CHARS} characters"):
        store.set_options({SKIP: "x" * 300})
    assert store.get_option(SKIP) == "before"


def test_set_options_applies_every_pair(store: OptionStore) -> None:
    store.set_options({SKIP: "a,b"})
    assert store.skip_copy_methods() == {"a", "b"}
    store.set_options([(SKIP, "c"), (SKIP, "d")])  # later pairs win, as in a sequence of set_option calls
    assert store.get_option(SKIP) == "d"
    store.set_options({})
    assert store.get_option(SKIP) == "d"


@pytest.mark.parametrize("bad", [None, 5, "skip=x", [("only-one",)]])
def test_set_options_rejects_malformed_arguments(store: OptionStore, bad) -> None:
    with pytest.raises(OptionError):
        store.set_options(bad)
    assert store.get_option(SKIP) == ""


def test_skip_copy_for_adds_temporarily_and_restores(store: OptionStore) -> None:
    store.set_option(SKIP, "encoder")
    with store.skip_copy_for(["prefill", "decode"]):
        assert store.skip_copy_methods() == {"encoder", "prefill", "decode"}
    assert store.get_option(SKIP) == "encoder"
    with pytest.raises(OptionError), store.skip_copy_for(["a,b"]):
        pass
    assert store.get_option(SKIP) == "encoder"


def test_module_level_functions_use_the_global_store() -> None:
    opts.set_option(SKIP, "x")
    assert opts.get_option(SKIP) == "x"
    assert opts.should_skip_copy("x")
    opts.set_options({SKIP: "y"})
    assert opts.skip_copy_methods() == {"y"}
    opts.reset_options()
    assert opts.get_option(SKIP) == ""


def test_readers_never_see_a_half_applied_update(store: OptionStore) -> None:
    # Two writers flip between two complete values; readers must only ever see one of them, parsed to match.
    values = {"alpha, beta": frozenset({"alpha", "beta"}), "gamma": frozenset({"gamma"})}
    store.set_option(SKIP, "gamma")
    stop = threading.Event()
    errors: list[str] = []

    def writer(value: str) -> None:
        while not stop.is_set():
            store.set_options({SKIP: value})

    def reader() -> None:
        for _ in range(5000):
            raw = store.get_option(SKIP)
            if raw not in values:
                errors.append(f"unexpected raw value {raw!r}")
            state = store._state  # one snapshot: raw and parsed must agree
            if values.get(state.values[SKIP]) != state.skip_copy:
                errors.append(f"snapshot mismatch {state!r}")
            hits = store.should_skip_copy("alpha") + store.should_skip_copy("gamma")
            if hits not in (0, 1, 2):
                errors.append("impossible")

    writers = [threading.Thread(target=writer, args=(v,)) for v in values]
    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in writers + readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    for t in writers:
        t.join()
    assert not errors, errors[:5]
    assert store.get_option(SKIP) in values
