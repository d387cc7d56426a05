"""The call journal and the crash search's parts (``conformance/common/crash_journal.py``,
``crash_replay.py``), without a crash: what a journal holds at each step, what a watched backend notes, how
the search shrinks, which rule a crashing call names, the repro script's source and ``crash = true`` entries
with a rule."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.common import crash_journal
from conformance.common.crash_journal import Calling, CallJournal, Watched, journaled, read
from conformance.common.protocol_plans import InputsPlan, LowerPlan, OutputsPlan
from conformance.suite import crash_replay
from conformance.suite.known_failures import first_match, parse_entries

CASE = "conformance/differential/test_differential.py::test_x[cpu]"


class Steps:
    """A machine-like object whose steps are journaled; ``outer`` makes a step inside another."""

    def __init__(self, journal: CallJournal) -> None:
        self.journal = journal

    @journaled
    def inner(self, index: int, plan: object = None) -> None:
        pass

    @journaled
    def outer(self, plan: object) -> None:
        self.inner(1, plan=plan)


def test_the_file_holds_the_top_level_steps_of_the_current_example(tmp_path: Path) -> None:
    path = tmp_path / "gw0.steps"
    journal = CallJournal(path, CASE, {"device": "cpu"})
    machine = Steps(journal)
    machine.inner(0)
    mark = journal.mark()
    machine.outer(LowerPlan("add_mul"))
    state = read(path, CASE)
    assert state is not None
    assert state.steps == [("inner", {"index": 0}), ("outer", {"plan": LowerPlan("add_mul")})]
    journal.truncate(mark)  # a focused case's next example keeps the set-up steps
    machine.inner(2, plan="p")
    assert read(path, CASE).steps == [("inner", {"index": 0}), ("inner", {"index": 2, "plan": "p"})]  # type: ignore[union-attr]
    assert read(path, "another case") is None  # a journal left by another case is not this one's
    journal.close()
    assert not path.exists()  # the case ended in its own process: nothing to replay


def test_a_torn_or_missing_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "torn.steps").write_bytes(b"\x80\x05garbage")
    assert read(tmp_path / "torn.steps", CASE) is None
    assert read(tmp_path / "absent.steps", CASE) is None


class Side:
    def execute(self, handle: object, inputs: Any) -> str:
        if not inputs:
            raise ValueError("inputs: empty")
        return "ran"

    name = "side"


def test_a_watched_backend_notes_each_call_with_the_oracles_answer(tmp_path: Path) -> None:
    journal = CallJournal(tmp_path / "j.steps", CASE, {})
    backend, oracle = Watched(Side(), journal, False), Watched(Side(), journal, True)
    assert backend.name == "side"  # what is not a protocol call passes through
    with journal.step("execute", {}), pytest.raises(ValueError, match="inputs"):
        oracle.execute(None, [])
    backend.execute(None, [1])
    assert journal.state.calling == Calling("execute", "execute(None, [1])", "invalid-argument")
    with journal.step("execute", {}):  # a new step forgets the oracle's answers
        backend.execute(None, [1])
    assert journal.state.calling is not None
    assert journal.state.calling.oracle is None


@pytest.mark.parametrize(
    ("oracle", "rule"),
    [
        ("invalid-argument", "differential/missing-error"),
        ("type-error", "differential/missing-error"),
        ("ok", "differential/spurious-error"),
        (None, "differential/spurious-error"),
        ("library", "differential/error-class"),
    ],
)
def test_the_crashing_calls_rule_comes_from_the_oracles_answer(oracle: str | None, rule: str) -> None:
    assert crash_replay.rule_for(Calling("execute", "execute(...)", oracle)) == rule
    assert crash_replay.rule_for(None) is None


class FakeReplayer:
    """Crashes whenever the steps hold every step named in ``needed`` (and the last one)."""

    def __init__(self, needed: set[str]) -> None:
        self.needed = needed
        self.replays = 0

    def crashes(self, steps: list[crash_replay.Step]) -> tuple[int | None, Calling | None]:
        self.replays += 1
        names = {name for name, _ in steps}
        return (11, Calling("execute", "x", "ok")) if self.needed <= names else (None, None)


def test_shrinking_keeps_exactly_the_steps_the_crash_needs() -> None:
    steps = [(f"s{i}", {}) for i in range(12)] + [("crash", {})]
    replayer = FakeReplayer({"s3", "s8", "crash"})
    found, died, calling, cut = crash_replay._shrink(
        replayer,  # type: ignore[arg-type]
        steps,
        (11, None),
        deadline=float("inf"),
    )
    assert [name for name, _ in found] == ["s3", "s8", "crash"]
    assert (died, cut) == (11, "")
    assert calling == Calling("execute", "x", "ok")


def test_shrinking_stops_at_its_budget_and_says_so() -> None:
    steps = [(f"s{i}", {}) for i in range(12)] + [("crash", {})]
    _, _, _, cut = crash_replay._shrink(FakeReplayer({"crash"}), steps, (11, None), deadline=0.0)  # type: ignore[arg-type]
    assert cut == f"{crash_replay.BUDGET_ENV} seconds"


class Opaque:
    """A value whose repr is no source (an option value a strategy drew, say)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque)

    __hash__ = object.__hash__


def test_the_repro_script_carries_the_steps_as_source(tmp_path: Path) -> None:
    step = ("execute", {"index": 0, "broken": (InputsPlan(bad="empty-size"), OutputsPlan())})
    odd = ("set_option", {"key_value": ("k", Opaque())})  # no source form: pickled
    finding = crash_replay.Finding(
        CASE, {"backend": "m:B", "device": "cpu"}, [odd, step], Calling("execute", "x", "ok"), True
    )
    path = crash_replay.write_script(finding, tmp_path)
    text = path.read_text(encoding="utf-8")
    assert "bad='empty-size'" in text
    assert "unpickled(" in text
    namespace: dict[str, Any] = {}
    exec(compile(text.replace('if __name__ == "__main__":', "if False:"), str(path), "exec"), namespace)
    assert namespace["STEPS"] == [odd, step]
    assert namespace["MACHINE"] == {"backend": "m:B", "device": "cpu"}


def test_a_crash_entry_with_a_rule_declares_only_that_rules_crash() -> None:
    entries = parse_entries(
        [{"case": "c::*", "crash": True, "rule": "differential/missing-*", "reason": "segfault"}], "src"
    )
    assert first_match(entries, "c::t", "differential/missing-error", crash=True) is entries[0]
    assert first_match(entries, "c::t", "differential/values", crash=True) is None
    assert first_match(entries, "c::t", None, crash=True) is None  # a crash nothing found again
    assert first_match(entries, "c::t", "differential/missing-error") is None  # a failure, not a crash


def test_a_journal_outside_a_recorded_run_is_kept_in_memory() -> None:
    journal = crash_journal.for_case(SimpleNamespace(pluginmanager=pytest.PytestPluginManager()), CASE, {})
    assert journal.path is None
    journal.close()


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_a_bad_search_budget_is_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(crash_replay.BUDGET_ENV, value)
    with pytest.raises(ValueError, match=rf"\${crash_replay.BUDGET_ENV} must be a number of seconds"):
        crash_replay.budget_s()


@pytest.mark.parametrize(
    ("value", "seconds"), [("", crash_replay.DEFAULT_BUDGET_S), (" 0 ", 0.0), ("42.5", 42.5)]
)
def test_the_search_budget_reads_seconds(monkeypatch: pytest.MonkeyPatch, value: str, seconds: float) -> None:
    monkeypatch.setenv(crash_replay.BUDGET_ENV, value)
    assert crash_replay.budget_s() == seconds
