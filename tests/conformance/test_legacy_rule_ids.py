"""The ids older releases wrote (``conformance/catalogue/legacy.py``): each maps onto exactly one rule of
today, both ways, and an old id or glob names what it named then and nothing else; a known-failures entry
written so still declares the failure under today's id."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from conformance.catalogue import (
    LEGACY_FAMILIES,
    LEGACY_IDS,
    RULES_BY_ID,
    canonical_rule_id,
    legacy_rule_id,
    pattern_names_rule,
)
from conformance.catalogue.legacy import MERGED_LEAVES
from conformance.suite.known_failures import first_match, load_file, parse_entries

#: Today's ids with the spelling older releases gave them.
OLD = {rule: old for rule in RULES_BY_ID if (old := legacy_rule_id(rule))}


def test_every_old_id_is_one_rule_of_today_and_back() -> None:
    assert OLD, "no id has an older spelling"
    assert all(canonical_rule_id(old) == rule for rule, old in OLD.items())
    assert len(set(OLD.values())) == len(OLD), "two rules of today claim one old id"
    # An old spelling is never an id of today: read as today's, it would name another rule.
    assert not set(OLD.values()) & set(RULES_BY_ID)
    # Every old family and renamed id still has rules of today, and every family it names is today's.
    assert {old.partition("/")[0] for old in OLD.values()} == {*LEGACY_FAMILIES, "runtime"}
    assert {legacy_rule_id(new) for new in LEGACY_IDS.values()} == set(LEGACY_IDS)
    assert all(new in RULES_BY_ID for new in LEGACY_IDS.values())


def test_the_merged_leaves_are_rules_of_today() -> None:
    """A leaf listed for a merged family that the table lost would leave an old glob matching less."""
    for family, leaves in MERGED_LEAVES.items():
        today = LEGACY_FAMILIES.get(family, family)
        assert all(f"{today}/{leaf}" in RULES_BY_ID for leaf in leaves), family


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("placement/pcie", "device_placement/pcie"),
        ("skip-copy/pcie", "device_placement/skip-copy-pcie"),
        ("skip-copy/values", "runtime_options/values"),
        ("options/round-trip", "runtime_options/round-trip"),
        ("copies/pinned-host-memory", "runtime_options/pinned-host-memory"),
        ("runtime/lower", "lowering/lower"),
        ("view-pass/source-mutated/policy", "lowering/source-mutated/policy"),
        ("bad-inputs/wrong-dtype-int64", "bad_inputs/wrong-dtype-int64"),
        ("format/flipped-byte", "program_format/flipped-byte"),
        ("multi-method/tokens", "multi_method/tokens"),
        ("streams/threads", "streams_threads/threads"),
        ("traffic/wrap", "traffic_meter/wrap"),
    ],
)
def test_an_old_id_is_canonical_as_today(old: str, new: str) -> None:
    assert canonical_rule_id(old) == new
    assert legacy_rule_id(new) == old
    assert pattern_names_rule(old, new)


def test_what_is_not_old_is_left_alone() -> None:
    for rule in ("mm_out/values", "lowering/zoo", "contract/error-class", "never/heard-of", "placement", ""):
        assert canonical_rule_id(rule) == rule
    assert legacy_rule_id("lowering/zoo") is None  # the lowering chapter's own: written so then
    assert legacy_rule_id("mm_out/values") is None


@pytest.mark.parametrize(
    "pattern",
    ["placement/*", "skip-copy/*", "options/*", "copies/*", "view-pass/*", "runtime/*", "bad-inputs/wrong-*"],
)
def test_an_old_glob_matches_what_it_matched_then_and_nothing_else(pattern: str) -> None:
    """Over the whole table: exactly the rules whose old id the glob matches (``skip-copy/*`` never the
    option API's ``runtime_options/round-trip``, ``placement/*`` never
    ``device_placement/skip-copy-pcie``)."""
    named = {rule for rule in RULES_BY_ID if pattern_names_rule(pattern, rule)}
    assert named == {rule for rule, old in OLD.items() if fnmatch.fnmatchcase(old, pattern)}
    assert named


def test_the_old_globs_split_the_merged_families() -> None:
    assert pattern_names_rule("skip-copy/*", "runtime_options/values")
    assert not pattern_names_rule("skip-copy/*", "runtime_options/round-trip")
    assert not pattern_names_rule("skip-copy/*", "runtime_options/pinned-host-memory")
    assert pattern_names_rule("skip-copy/*", "device_placement/skip-copy-pcie")
    assert pattern_names_rule("options/*", "runtime_options/round-trip")
    assert not pattern_names_rule("options/*", "runtime_options/values")
    assert pattern_names_rule("placement/*", "device_placement/pcie")
    assert not pattern_names_rule("placement/*", "device_placement/skip-copy-pcie")
    assert pattern_names_rule("view-pass/*", "lowering/outcome")
    assert not pattern_names_rule("view-pass/*", "lowering/zoo")
    assert not pattern_names_rule("view-pass/*", "lowering/lower")
    assert pattern_names_rule("runtime/*", "lowering/lower")


def test_todays_spelling_and_a_globbed_family() -> None:
    assert pattern_names_rule("runtime_options/*", "runtime_options/values")
    assert not pattern_names_rule("runtime_options/*", "device_placement/skip-copy-pcie")
    assert pattern_names_rule("*/values", "runtime_options/values")
    assert pattern_names_rule("*/pcie", "device_placement/skip-copy-pcie")  # skip-copy/pcie, as then
    assert pattern_names_rule("*", "mm_out/values")
    assert not pattern_names_rule("mm_out/*", "differential/values")


def test_an_entry_written_with_an_old_rule_id_declares_the_failure_under_the_new_one(tmp_path: Path) -> None:
    """Known-failures files written before each chapter's rules became one family named after it keep
    working: an old id or glob matches the failure under today's id (``conformance/catalogue/legacy.py``),
    and never a rule it did not name then."""
    (tmp_path / "old.toml").write_text(
        "\n".join(
            f'[[known_failures]]\ncase = "a::*"\nrule = "{rule}"\nreason = "r"\n'
            for rule in ("placement/pcie", "bad-inputs/wrong-dtype-*", "skip-copy/*", "runtime/lower")
        ),
        encoding="utf-8",
    )
    pcie, dtype, skip_copy, lower = load_file(tmp_path / "old.toml")
    assert pcie.rule == "placement/pcie"  # as written: the message names the entry as its file does
    assert pcie.matches_rule("device_placement/pcie")
    assert not pcie.matches_rule("device_placement/skip-copy-pcie")
    assert not pcie.matches_rule("placement/pcie")  # no failure names an old id: nothing to match
    assert dtype.matches_rule("bad_inputs/wrong-dtype-int64")
    assert not dtype.matches_rule("bad_inputs/wrong-rank-3d")
    assert skip_copy.matches_rule("runtime_options/values")
    assert not skip_copy.matches_rule("runtime_options/round-trip")  # options/round-trip, then
    assert lower.matches_rule("lowering/lower")
    assert not lower.matches_rule("lowering/zoo")
    entries = [pcie, dtype, skip_copy, lower]
    assert first_match(entries, "a::b", "bad_inputs/wrong-dtype-float16") is dtype
    assert first_match(entries, "a::b", "bad_inputs/wrong-size") is None
    (new,) = parse_entries([{"case": "a::*", "rule": "bad_inputs/wrong-dtype-*", "reason": "r"}], "src")
    assert new.matches_rule("bad_inputs/wrong-dtype-int64")
