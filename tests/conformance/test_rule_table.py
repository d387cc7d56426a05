"""The rule table (``conformance/catalogue/rule_table.py``) is the one owner of rule ids and levels: a chapter
names a rule through it and an id it lacks stops the chapter on import, naming the id and the file; levels
come from it; ``python -m conformance.common.rules`` lists it. That every rule a case checks is a row of it,
with the right chapters: ``tests/conformance/test_rule_coverage.py``."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conformance.catalogue import CHAPTERS, ID, RULE_TABLE, RULES_BY_ID, SUITE_WIDE, Level, Rule, rule_index
from conformance.catalogue.chapters import chapter_module
from conformance.catalogue.rule import chapter, must, should
from conformance.common import rules
from conformance.common.rules import UnknownRule, family_ids, level_of, rule_id

ROOT = Path(__file__).resolve().parents[2]


def test_a_known_id_is_itself_and_an_unknown_one_names_itself_and_where() -> None:
    assert rule_id("mm_out/values") == "mm_out/values"
    with pytest.raises(UnknownRule) as caught:
        rule_id("mm_out/valuez")
    text = str(caught.value)
    assert "'mm_out/valuez'" in text
    assert re.search(r"named in tests/conformance/test_rule_table\.py:\d+", text)
    assert "conformance/catalogue/rule_table.py" in text


def test_a_chapter_naming_an_unknown_id_fails_on_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any case runs: importing the module (which collecting it does) raises, naming id and file."""
    chapter = tmp_path / "test_typo_chapter.py"
    chapter.write_text(
        textwrap.dedent(
            """
            from conformance.common.rules import rule_id

            VALUES = rule_id("mm_out/values")
            TYPO = rule_id("mm_out/exact-one")
            """
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnknownRule, match=r"'mm_out/exact-one' named in .*test_typo_chapter\.py:5"):
        importlib.import_module("test_typo_chapter")


def test_a_family_gives_the_ids_of_its_values_and_refuses_others() -> None:
    ids = family_ids("mm_out/{bad_input}", ["none-out", "cpu-self"])
    assert ids == {"none-out": "mm_out/none-out", "cpu-self": "mm_out/cpu-self"}
    with pytest.raises(
        UnknownRule, match=r"'mm_out/none-outt' named in tests/conformance/test_rule_table.py:\d+"
    ):
        family_ids("mm_out/{bad_input}", ["none-outt"])
    with pytest.raises(UnknownRule, match="not a one-field family"):
        family_ids("mm_out/values", ["x"])


def test_every_chapter_imports_with_its_rules() -> None:
    """Every chapter and helper that names rules imports: each id it names is in the table."""
    for name in rules.CHAPTERS:
        importlib.import_module(chapter_module(name))


def test_levels_come_from_the_table() -> None:
    for rule, row in RULES_BY_ID.items():
        assert level_of(rule) is row.level
    should_ids = {rule for rule, row in RULES_BY_ID.items() if row.level is Level.SHOULD}
    assert {"mm_out/no-host-sync", "lowering/source-mutated/policy", "traffic_meter/direction"} <= should_ids
    assert "mm_out/values" not in should_ids
    assert level_of("never/heard-of") is Level.MUST  # a failure naming no rule of the table fails the run


def test_one_grammar_and_one_owner() -> None:
    """Every id fits the one grammar; a family's pattern names its fields; no two rows make one id."""
    assert all(ID.fullmatch(rule) for rule in RULES_BY_ID)
    assert [i for i in RULES_BY_ID if "{" in i or "*" in i] == []
    family = should("x/{kind}/policy", "a clause", kind=("a", "b"))
    assert family.ids == ("x/a/policy", "x/b/policy")
    assert chapter("lowering", family)[0].chapters == ("lowering",)
    with pytest.raises(ValueError, match="has fields"):
        must("x/{kind}", "a clause")
    with pytest.raises(ValueError, match="outside the grammar"):
        must("X/Y", "a clause")
    with pytest.raises(ValueError, match="chapters that do not exist"):
        must("x/y", "a clause", also=("nowhere",))
    with pytest.raises(ValueError, match="says nothing"):
        must("x/y", " ")
    with pytest.raises(ValueError, match="is made by"):
        rule_index((*RULE_TABLE, must("mm_out/values", "again")))
    assert all(isinstance(row, Rule) and row.clause for row in RULE_TABLE)


#: Rows whose family's chapter does not check them: the lowering chapter's rule for a model a runtime
#: chapter's case lowers (conformance/common/programs.py), checked by those chapters' cases.
CHECKED_ELSEWHERE = {"lowering/lower": ("runtime_options", "device_placement", "multi_method")}


def test_one_family_per_chapter_named_after_it() -> None:
    """A rule id's family (before its first ``/``) is the name of the chapter that owns it (the chapter it is
    listed under, whose cases check it; others may check it too), or one of the families that are no
    chapter (``contract``: the monitor; ``suite``; ``known-failures``). Ids older releases wrote in other
    families: ``conformance/catalogue/legacy.py``."""
    families = {rule.partition("/")[0] for rule in RULES_BY_ID}
    assert families == {*CHAPTERS, *SUITE_WIDE}
    for row in RULE_TABLE:
        family = row.pattern.partition("/")[0]
        if family in SUITE_WIDE:
            continue
        if row.pattern in CHECKED_ELSEWHERE:
            assert row.chapters == CHECKED_ELSEWHERE[row.pattern]
            continue
        assert row.chapters[0] == family, f"{row.pattern} is listed under {row.chapters[0]}"
    assert {rule.partition("/")[0] for rule in RULES_BY_ID if RULES_BY_ID[rule].chapters == ()} <= set(
        SUITE_WIDE
    )


def test_the_listing_is_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    """Every row, by its pattern; no source text read as a rule (the old scanner listed ``x/{y}``)."""
    assert rules.main([]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{row.pattern} " in out for row in RULE_TABLE)
    assert "x/{y}" not in out
    assert f"{len(RULES_BY_ID)} rule ids" in out
    assert rules.main(["--ids"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(RULES_BY_ID)


def test_the_rules_need_no_torch() -> None:
    code = "import sys, conformance.common.rules as m; m.main(['--ids']); assert 'torch' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
