"""The result file: round trip, atomic writes, every way a file can be unreadable, journal recovery, merge."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from harness.results import (
    SCHEMA,
    SCHEMA_VERSION,
    CaseResult,
    ResultFileError,
    ResultJournal,
    RunResult,
    journal_path,
    load_results,
    merge_runs,
    new_run,
    write_results,
)


def make_case(
    id: str = "conformance/mm_out/test_mm_out.py::test_a[float16]", outcome: str = "passed", **kw: Any
) -> CaseResult:
    fields: dict[str, Any] = {
        "chapter": "mm_out",
        "params": {"dtype": "float16"},
        "message": "",
        "repro": f"python -m pytest '{id}'",
        "duration_s": 0.25,
        "worker": "gw0",
    }
    fields.update(kw)
    return CaseResult(id=id, outcome=outcome, **fields)


def make_run(**kw: Any) -> RunResult:
    run = new_run({"hostname": "box", "torch": "2.13.0"}, {"backend": {"name": "ref", "version": "1"}})
    run.cases = [
        make_case(),
        make_case(
            "conformance/mm_out/test_mm_out.py::test_b", "skipped", message="no CUDA device is present"
        ),
        make_case("conformance/test_runtime.py::test_c", "crashed", chapter="runtime", worker=None),
    ]
    run.benchmarks = [{"name": "mm", "median_s": 0.001}]
    run.complete = True
    run.finished_at = "2025-01-01T00:00:01+00:00"
    for key, value in kw.items():
        setattr(run, key, value)
    return run


def valid_dict() -> dict[str, Any]:
    return asdict(make_run())


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_round_trip(tmp_path: Path) -> None:
    run = make_run()
    write_results(tmp_path / "r.json", run)
    assert load_results(tmp_path / "r.json") == run


def test_file_is_sorted_and_indented(tmp_path: Path) -> None:
    write_results(tmp_path / "r.json", make_run())
    text = (tmp_path / "r.json").read_text()
    assert text.startswith('{\n "benchmarks": [')
    assert json.loads(text)["schema"] == SCHEMA


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    write_results(tmp_path / "r.json", make_run())
    write_results(tmp_path / "r.json", make_run(run_id="second"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert load_results(tmp_path / "r.json").run_id == "second"


def test_failed_write_keeps_old_file_and_cleans_up(tmp_path: Path) -> None:
    write_results(tmp_path / "r.json", make_run(run_id="old"))
    bad = make_run(metadata={"x": object()})  # not JSON-serialisable: fails mid-write
    with pytest.raises(TypeError):
        write_results(tmp_path / "r.json", bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert load_results(tmp_path / "r.json").run_id == "old"


def test_summary_counts() -> None:
    summary = make_run().summary()
    assert summary["total"] == 3
    assert summary["outcomes"]["passed"] == 1
    assert summary["outcomes"]["crashed"] == 1
    assert summary["outcomes"]["failed"] == 0
    assert summary["chapters"]["mm_out"]["skipped"] == 1
    assert summary["chapters"]["runtime"]["crashed"] == 1


_DELETE = object()


def mutate(data: dict[str, Any], dotted: str, value: object) -> dict[str, Any]:
    """Set (or delete) the field at a dotted path like ``cases.0.outcome``."""
    target: Any = data
    *parents, last = dotted.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    key: Any = int(last) if last.isdigit() else last
    if value is _DELETE:
        del target[key]
    else:
        target[key] = value
    return data


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("schema", "junit-xml", "not a conformance result file"),
        (
            "schema_version",
            SCHEMA_VERSION + 1,
            f"unsupported schema_version {SCHEMA_VERSION + 1}; this tool reads version(s) 1,",
        ),
        ("schema_version", "1", "unsupported schema_version '1'"),
        ("schema_version", True, "unsupported schema_version True"),
        ("run_id", _DELETE, "missing field(s): run_id"),
        ("complete", "yes", "field 'complete' must be boolean, found string"),
        ("finished_at", 5, "field 'finished_at' must be string or null, found integer"),
        ("cases", {}, "field 'cases' must be array, found object"),
        ("cases.0", "a case", "cases[0] must be a JSON object, found string"),
        ("cases.0.outcome", "exploded", "outcome 'exploded' is not one of"),
        ("cases.1.duration_s", "slow", "cases[1]: field 'duration_s' must be integer or number"),
        ("cases.2.repro", _DELETE, "cases[2]: missing field(s): repro"),
        ("cases.0.params", {"dtype": 16}, "params['dtype'] must be string, found integer"),
        ("benchmarks", [1], "benchmarks[0] must be a JSON object, found integer"),
    ],
)
def test_invalid_fields_are_named(tmp_path: Path, field: str, value: object, expected: str) -> None:
    path = write_json(tmp_path / "r.json", mutate(valid_dict(), field, value))
    with pytest.raises(ResultFileError) as info:
        load_results(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)


def test_truncated_json(tmp_path: Path) -> None:
    write_results(tmp_path / "r.json", make_run())
    text = (tmp_path / "r.json").read_text()
    (tmp_path / "r.json").write_text(text[: len(text) // 2])
    with pytest.raises(ResultFileError, match="not valid JSON"):
        load_results(tmp_path / "r.json")


@pytest.mark.parametrize("data", [[1, 2], "text", None, 3])
def test_not_an_object(tmp_path: Path, data: object) -> None:
    with pytest.raises(ResultFileError, match="top level must be a JSON object"):
        load_results(write_json(tmp_path / "r.json", data))


def test_foreign_json_object(tmp_path: Path) -> None:
    with pytest.raises(ResultFileError, match="schema is None"):
        load_results(write_json(tmp_path / "r.json", {"tests": []}))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ResultFileError, match="no such result file"):
        load_results(tmp_path / "absent.json")


def test_result_file_error_is_a_value_error() -> None:
    assert issubclass(ResultFileError, ValueError)


# ---------------------------------------------------------------------------------------------- journal


def write_journal(path: Path, run: RunResult) -> ResultJournal:
    journal = ResultJournal(path)
    journal.start(run)
    for case in run.cases:
        journal.add_case(case)
    return journal


def test_journal_recovery(tmp_path: Path) -> None:
    run = make_run(complete=False, finished_at=None)
    journal = write_journal(tmp_path / "r.json", run)
    journal.add_metadata("late", [1, 2])
    journal.add_traffic({"bytes": 5})
    journal.close()
    assert not (tmp_path / "r.json").exists()
    loaded = load_results(tmp_path / "r.json")
    assert loaded.complete is False
    assert loaded.finished_at is None
    assert loaded.cases == run.cases
    assert loaded.metadata == {**run.metadata, "late": [1, 2]}
    assert loaded.traffic == [{"bytes": 5}]


def test_journal_truncated_last_line_is_dropped(tmp_path: Path) -> None:
    run = make_run()
    write_journal(tmp_path / "r.json", run).close()
    jpath = journal_path(tmp_path / "r.json")
    text = jpath.read_text()
    jpath.write_text(text[: len(text) - 20])  # the run died while writing its last case
    loaded = load_results(tmp_path / "r.json")
    assert loaded.cases == run.cases[:-1]
    assert loaded.complete is False


def test_journal_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    write_journal(tmp_path / "r.json", make_run()).close()
    jpath = journal_path(tmp_path / "r.json")
    lines = jpath.read_text().splitlines()
    lines[1] = lines[1][:10]
    jpath.write_text("\n".join(lines) + "\n")
    with pytest.raises(ResultFileError, match=r"r\.json\.journal\.jsonl:2: journal line is not valid JSON"):
        load_results(tmp_path / "r.json")


@pytest.mark.parametrize("text", ["", '{"kind": "case"}\n', '{"kind": "hea'])
def test_journal_without_header(tmp_path: Path, text: str) -> None:
    journal_path(tmp_path / "r.json").write_text(text)
    with pytest.raises(ResultFileError, match="no header"):
        load_results(tmp_path / "r.json")


def test_journal_future_version(tmp_path: Path) -> None:
    header = {"kind": "header", "schema": SCHEMA, "schema_version": 99}
    journal_path(tmp_path / "r.json").write_text(json.dumps(header) + "\n")
    with pytest.raises(ResultFileError, match="unsupported schema_version 99"):
        load_results(tmp_path / "r.json")


def test_final_file_wins_over_journal(tmp_path: Path) -> None:
    write_journal(tmp_path / "r.json", make_run(run_id="journal")).close()
    write_results(tmp_path / "r.json", make_run(run_id="final"))
    assert load_results(tmp_path / "r.json").run_id == "final"


def test_journal_discard(tmp_path: Path) -> None:
    journal = write_journal(tmp_path / "r.json", make_run())
    journal.discard()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- merge


def test_merge_keeps_every_shard() -> None:
    a = make_run(run_id="a", environment={"torch": "2.13", "hostname": "h1"})
    b = make_run(
        run_id="b",
        environment={"torch": "2.13", "hostname": "h2"},
        cases=[make_case("conformance/test_streams.py::test_x", chapter="streams")],
        complete=False,
        finished_at=None,
    )
    merged = merge_runs([a, b])
    assert [c.id for c in merged.cases] == [c.id for c in a.cases + b.cases]
    assert merged.environment["shards"] == [a.environment, b.environment]
    assert merged.environment["torch"] == "2.13"  # agreed by every shard
    assert "hostname" not in merged.environment
    assert merged.complete is False
    assert merged.finished_at is None
    assert merged.benchmarks == a.benchmarks + b.benchmarks
    assert [s["run_id"] for s in merged.metadata["shards"]] == ["a", "b"]
    assert merged.metadata["backend"] == a.metadata["backend"]


def test_merge_of_one_is_identity_and_of_none_is_an_error() -> None:
    run = make_run()
    assert merge_runs([run]) is run
    with pytest.raises(ValueError, match="at least one"):
        merge_runs([])


def test_journal_lists_collected_cases_without_a_result_as_not_run(tmp_path: Path) -> None:
    """A run killed mid-way: every case it collected is in the rebuilt run, the unfinished ones not-run."""
    run = make_run(complete=False, finished_at=None)
    journal = write_journal(tmp_path / "r.json", run)
    journal.add_collected(
        [case.id for case in run.cases] + ["conformance/mm_out/test_mm_out.py::test_later[x]"]
    )
    journal.close()
    loaded = load_results(tmp_path / "r.json")
    later = loaded.cases[-1]
    assert (later.id, later.chapter, later.outcome) == (
        "conformance/mm_out/test_mm_out.py::test_later[x]",
        "mm_out",
        "not-run",
    )
    assert "ended before this case ended" in later.message
    assert loaded.cases[:-1] == run.cases


def test_evidence_round_trips_and_older_files_read_without_it(tmp_path: Path) -> None:
    run = make_run()
    run.cases[0].outcome, run.cases[0].evidence = (
        "timeout",
        "Thread 0x1 (most recent call first):\n  File ...",
    )
    write_results(tmp_path / "r.json", run)
    assert load_results(tmp_path / "r.json").cases[0].evidence == run.cases[0].evidence
    old = valid_dict()
    old["schema_version"] = 2
    for case in old["cases"]:
        case.pop("evidence", None)
    assert load_results(write_json(tmp_path / "v2.json", old)).cases[0].evidence is None
