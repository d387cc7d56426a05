"""The self-tests are laid out like the product: a folder per package they test, the broken backends in one
place, no test module loose at the top (README "Layout")."""

from __future__ import annotations

from pathlib import Path

from tests.project.import_scan import PACKAGES

TESTS = Path(__file__).resolve().parents[1]
#: Folders of tests/ that are not named after a product package: the whole project (front door, imports,
#: workflow), the meta-tests of the check helpers, and the broken backends.
OTHER_FOLDERS = {"project", "meta", "broken"}


def test_every_test_module_is_in_the_folder_of_its_package() -> None:
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test modules at the top of tests/ (move each into the folder of its package): {loose}"
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    unknown = sorted(folders - set(PACKAGES) - OTHER_FOLDERS)
    assert not unknown, f"tests/ folders named after no product package: {unknown}"
    # Without __init__.py pytest imports tests/conformance/test_x.py as conformance.test_x, a clash.
    assert all((TESTS / name / "__init__.py").exists() for name in folders), folders


def test_broken_backends_live_in_tests_broken() -> None:
    elsewhere = sorted(
        str(p.relative_to(TESTS)) for p in TESTS.rglob("broken_*.py") if p.parent.name != "broken"
    )
    assert not elsewhere, f"broken backends outside tests/broken/: {elsewhere}"
    assert not list((TESTS / "broken").glob("test_*.py")), "tests/broken/ holds backends, not tests"
