"""The view-pass checks give every finding its level: a red (*must*) means a wrong result, never a policy.

Each backend below runs through the chapter's own checks (``conformance/lowering/test_lowering.py``), in
process, and every check's outcome is classified the way the result file does: *must* (a failed rule whose id
``conformance/common/rules.py`` calls must), *should*, coverage, or passed. Per fixed rule, a correct pass
whose verdicts differ from the reference's passes, and a wrong one fails with the rule's id.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import pytest

import conformance.lowering.test_lowering as chapter
from conformance.common.checks import CheckFailure, CoverageGap
from conformance.common.rules import level_of
from conformance.lowering.view_pass_cases import CASES, CASES_BY_ID
from reference_impl import BACKEND as REFERENCE
from tests.broken.basic import (
    IGNORES_SOURCE_MUTATION,
    MAPS_NOTHING,
    REFUSES_EVERYTHING,
    REWRITES_READS_BEFORE_WRITE,
    UPSTREAM_LIKE,
)

BACKENDS = {
    b.name: b for b in (REFERENCE, IGNORES_SOURCE_MUTATION, UPSTREAM_LIKE, MAPS_NOTHING, REFUSES_EVERYTHING)
}
BACKENDS[REWRITES_READS_BEFORE_WRITE.name] = REWRITES_READS_BEFORE_WRITE
KV = "kv-cache"
_RULE = re.compile(r"\[([^\[\]\s]+)\]")

#: check id ("verdicts[<case>]", "behaviour[<case>]", "meta[<case>]", "kv-cache") -> (outcome, rule id)
Outcomes = dict[str, tuple[str, str]]


def _outcome(check: Callable[[], object]) -> tuple[str, str]:
    try:
        check()
    except CheckFailure as exc:
        rule = _RULE.search(str(exc)).group(1)  # type: ignore[union-attr]
        return level_of(rule).value, rule
    except CoverageGap as exc:
        return "coverage", exc.rule
    except pytest.skip.Exception:
        return "skipped", ""
    return "passed", ""


@functools.cache
def outcomes(name: str) -> Outcomes:
    backend = BACKENDS[name]
    found: Outcomes = {}
    for case in CASES:
        found[f"verdicts[{case.id}]"] = _outcome(functools.partial(chapter.check_verdicts, backend, case))
        found[f"behaviour[{case.id}]"] = _outcome(functools.partial(chapter.check_behaviour, backend, case))
    for case in chapter.REWRITING:
        found[f"meta[{case.id}]"] = _outcome(functools.partial(chapter.check_meta, backend, case))
    found[KV] = _outcome(functools.partial(chapter.check_kv_cache, backend))
    return found


def having(name: str, outcome: str) -> dict[str, str]:
    return {check: rule for check, (got, rule) in outcomes(name).items() if got == outcome}


def verdicts(*case_ids: str) -> set[str]:
    return {f"verdicts[{c}]" for c in case_ids}


def both(*case_ids: str) -> set[str]:
    return verdicts(*case_ids) | {f"behaviour[{c}]" for c in case_ids}


REWRITE_CASES = [c.id for c in CASES if c.rewrite]
FREE_CASES = [c.id for c in CASES if c.free]


def test_reference_passes_every_check() -> None:
    assert {got for got, _ in outcomes(REFERENCE.name).values()} == {"passed"}


def test_pass_mapping_nothing_is_coverage_only() -> None:
    """Keeping every copy is never wrong: each safe rewrite it misses is coverage, the rest passes."""
    coverage = having(MAPS_NOTHING.name, "coverage")
    assert set(coverage) == verdicts(*REWRITE_CASES) | {KV}
    assert set(coverage.values()) == {f"lowering/{CASES_BY_ID[c].rule}" for c in REWRITE_CASES} | {
        "lowering/slicing-heavy"
    }
    assert {got for got, _ in outcomes(MAPS_NOTHING.name).values()} == {"passed", "coverage"}


def test_pass_refusing_everything_it_maps_is_should_only() -> None:
    """Mapping an op and refusing it (with a reason) is a missed optimisation: *should*, never *must*."""
    should = having(REFUSES_EVERYTHING.name, "should")
    assert set(should) == verdicts(*REWRITE_CASES) | {KV}
    assert all(rule.endswith("/missed-rewrite") for rule in should.values()), should
    assert {got for got, _ in outcomes(REFUSES_EVERYTHING.name).values()} == {"passed", "should"}


def test_rewriting_copies_read_before_the_write_passes() -> None:
    """source-mutated: a view whose every reader runs before the write to its source is correct; the
    reference refuses it by node order, a pass that rewrites it passes every check (the KV cache too)."""
    assert {got for got, _ in outcomes(REWRITES_READS_BEFORE_WRITE.name).values()} == {"passed"}
    assert FREE_CASES
    for case_id in FREE_CASES:  # it really rewrote them, so the checks above saw a different verdict
        run = chapter._run_case(REWRITES_READS_BEFORE_WRITE, CASES_BY_ID[case_id])
        assert CASES_BY_ID[case_id].free <= set(run.outcome.rewritten), case_id
    kv = chapter._RUNS[(id(REWRITES_READS_BEFORE_WRITE), "kv-cache-attention")]
    assert {"slice_copy", "slice_copy_3", "slice_copy_4"} <= set(kv.outcome.rewritten)


@pytest.mark.proof
def test_pass_ignoring_source_mutation_fails_the_rules_it_ignores() -> None:
    """A users-only pass over every op fails, at *must*, exactly where its views change what a caller
    sees; where they do not (reads before the write, schema-less or opaque readers) it passes or gets a
    *should*."""
    must = having(IGNORES_SOURCE_MUTATION.name, "must")
    hazards = [
        c.id for c in CASES if c.hazard and c.rule in ("source-mutated", "aliases-output", "opaque-container")
    ]
    assert set(must) == both(*hazards)
    assert all(rule == f"lowering/{check.split('[')[1].split('/')[0]}" for check, rule in must.items())
    assert must["verdicts[source-mutated/add_]"] == "lowering/source-mutated"
    assert having(IGNORES_SOURCE_MUTATION.name, "should") == {
        "verdicts[opaque-container/getitem-chain]": "lowering/opaque-container/policy",
        "verdicts[opaque-container/user-without-schema]": "lowering/opaque-container/policy",
        "verdicts[source-mutated/disjoint-write]": "lowering/source-mutated/policy",
    }
    assert not having(IGNORES_SOURCE_MUTATION.name, "coverage")


#: Upstream ExecuTorch 1.5.1's pass: the defects (must), by case. Measured with the real pass too.
UPSTREAM_SOURCE_MUTATED = [
    "source-mutated/add_",
    "source-mutated/alias-add_",
    "source-mutated/copy_",
    "source-mutated/index_put_",
    "source-mutated/slice_scatter+copy_",
    "source-mutated/out=",
    "source-mutated/select_copy",
]
UPSTREAM_ALIASES_OUTPUT = [
    "aliases-output/returned-slice-of-input",
    "aliases-output/returned-slice-of-written-back-input",
    "aliases-output/returned-with-its-base",
]
UPSTREAM_WRITTEN_LISTS = ["opaque-container/in-written-list", "opaque-container/in-written-out-list"]
UPSTREAM_STALE_META = [
    "aliases-output/returned-slice-of-private-value",
    "opaque-container/read-only-lists",
    "every-view-twin/slice_copy",
    "every-view-twin/select_copy",
]


def test_upstream_like_pass_fails_its_defects_and_nothing_else() -> None:
    """Upstream's pass: *must* only where its views are wrong (later writes to the source, writes through
    lists, outputs aliasing inputs) or its metadata lies; the schema-less reader is *should*; the ops it
    does not map are coverage; a view read before the write-back (buffer, KV cache) passes."""
    must = having(UPSTREAM_LIKE.name, "must")
    expected = both(*UPSTREAM_SOURCE_MUTATED, *UPSTREAM_ALIASES_OUTPUT, *UPSTREAM_WRITTEN_LISTS)
    expected |= {f"meta[{c}]" for c in UPSTREAM_STALE_META} | {KV}
    assert set(must) == expected, sorted(set(must) ^ expected)
    assert must[KV] == "lowering/truthful-strides"
    assert {must[f"meta[{c}]"] for c in UPSTREAM_STALE_META} == {"lowering/truthful-strides"}
    assert having(UPSTREAM_LIKE.name, "should") == {
        "verdicts[opaque-container/user-without-schema]": "lowering/opaque-container/policy",
        "verdicts[source-mutated/disjoint-write]": "lowering/source-mutated/policy",
    }
    unmapped = [
        c.id
        for c in CASES
        if c.rule == "every-view-twin" and c.id.split("/")[1][:6] not in ("slice_", "select")
    ]
    assert having(UPSTREAM_LIKE.name, "coverage") == {
        f"verdicts[{c}]": "lowering/every-view-twin" for c in unmapped
    } | {"verdicts[not-viewable/viewable-of-transposed]": "lowering/not-viewable"}
    for case_id in ("source-mutated/buffer-written-back", "source-mutated/read-before-write"):
        assert outcomes(UPSTREAM_LIKE.name)[f"verdicts[{case_id}]"] == ("passed", "")
