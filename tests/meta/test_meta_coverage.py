"""The meta-tests cover every public definition of ``conformance.common.checks``,
``conformance.common.tolerances`` and ``conformance.common.view_pass_checks``:
adding a helper or a tolerance table without a meta-test (or a reasoned exemption) fails here."""

from __future__ import annotations

from tests.meta import (  # noqa: F401 - importing registers coverage
    test_checks_meta,
    test_pcie_checks_meta,
    test_tolerances_meta,
    test_view_pass_checks_meta,
)
from tests.meta.registry import COVERED, MODULES, public_definitions

# Public names that are not assertions or bounds, each with why no boundary test applies.
EXEMPT = {
    # Vocabularies passed as ``keywords=`` by the chapters: the rule "one keyword must appear,
    # case-insensitively" is the helper's and is meta-tested through assert_raises_invalid_argument.
    "checks.CORRUPT_PROGRAM_WORDS": "keyword vocabulary, not a check",
    "checks.PROGRAM_WORDS": "keyword vocabulary, not a check",
    "checks.UNKNOWN_METHOD_WORDS": "keyword vocabulary, not a check",
    "pcie_checks.NVML_MAX_RUNS": "a cap on window size, exercised through choose_runs",
}


def public_names() -> set[str]:
    return {
        f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
        for module in MODULES
        for name in public_definitions(module)
    }


def test_every_public_check_and_tolerance_has_a_meta_test() -> None:
    missing = public_names() - COVERED - set(EXEMPT)
    assert not missing, (
        f"public names without a meta-test (add one, or an exemption with a reason): {sorted(missing)}"
    )


def test_exemptions_are_not_stale() -> None:
    assert set(EXEMPT) <= public_names(), (
        f"exempt names that no longer exist: {sorted(set(EXEMPT) - public_names())}"
    )
    assert not set(EXEMPT) & COVERED, "a name is both covered and exempt: drop the exemption"


def test_the_enumeration_sees_what_it_must() -> None:
    """Guard the guard: the AST walk finds functions, classes and tables, and not imported names."""
    names = public_names()
    assert {
        "checks.assert_exact",
        "checks.CheckFailure",
        "tolerances.TOLERANCES",
        "tolerances.Tolerance",
        "view_pass_checks.observe",
        "view_pass_checks.Observation",
    } <= names
    assert "checks.TOLERANCES" not in names  # imported from tolerances, owned there
    assert "checks.torch" not in names
