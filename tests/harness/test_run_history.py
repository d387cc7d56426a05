"""Runs are kept, not overwritten (harness/run_history.py), a run's arguments are checked before anything is
touched (runner/check_args.py), and ``python -m reports.compare`` shows two runs in the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import CaseResult, RunResult, new_run, write_results
from harness.run_history import RUNS_DIR, archive, keep_count, prune, stored_runs
from reports.compare_cli import main as compare

ROOT = Path(__file__).resolve().parents[2]


def case(case_id: str, outcome: str, seconds: float = 0.1, chapter: str = "bad_inputs") -> CaseResult:
    message = "[lowering/lower] lower(add_mul): boom" if outcome == "failed" else ""
    rule = "lowering/lower" if outcome == "failed" else None
    return CaseResult(
        case_id, chapter, {}, outcome, message, f"python -m pytest {case_id}", seconds, None, rule
    )


def run(run_id: str, started: str, cases: list[CaseResult], finished: str | None = None) -> RunResult:
    result = new_run({}, {"backend": {"spec": "x:Y", "name": "mybackend", "version": "0.1"}})
    result.run_id, result.started_at, result.cases = run_id, started, cases
    result.finished_at, result.complete = finished or started.replace(":00+", ":30+"), True
    return result


def write(results: Path, name: str, result: RunResult) -> None:
    write_results(results / f"{name}.json", result)
    (results / f"{name}.junit.xml").write_text("<testsuites/>")


def test_the_previous_run_moves_under_its_run_id_and_the_history_is_bounded(tmp_path: Path) -> None:
    for n in range(4):
        write(
            tmp_path,
            "conformance",
            run(f"2026110{n}T100000Z-aa-conformance", f"2026-11-0{n}T10:00:00+00:00", []),
        )
        write(tmp_path, "bench", run(f"bench-{n}", f"2026-11-0{n}T11:00:00+00:00", []))  # another session
        moved = archive(tmp_path, ["conformance", "conformance-exclusive"], keep=2)
        assert moved == tmp_path / RUNS_DIR / f"2026110{n}T100000Z-aa-conformance"
        assert sorted(p.name for p in moved.iterdir()) == ["conformance.json", "conformance.junit.xml"]
        assert (tmp_path / "bench.json").exists()  # only the session's own files move
    kept = stored_runs(tmp_path)
    assert [r.run_id for r in kept] == ["20261103T100000Z-aa-conformance", "20261102T100000Z-aa-conformance"]
    assert archive(tmp_path, ["conformance"]) is None  # nothing there: nothing to do
    assert prune(tmp_path, 0) == [r.directory for r in kept]


def test_an_interrupted_run_is_kept_from_its_journal(tmp_path: Path) -> None:
    write(tmp_path, "conformance", run("r1", "2026-11-01T10:00:00+00:00", [case("t::a", "passed")]))
    journal = tmp_path / "conformance.json.journal.jsonl"
    (tmp_path / "conformance.json").rename(tmp_path / "elsewhere.json")
    journal.write_text(
        '{"kind": "header", "schema": "aoti-conformance-results", "schema_version": 2, "run_id": "killed-1", '
        '"started_at": "2026-11-02T10:00:00+00:00", "environment": {}, "metadata": {}}\n'
    )
    moved = archive(tmp_path, ["conformance"])
    assert moved is not None
    assert moved.name == "killed-1"
    assert (moved / journal.name).exists()


def test_keep_count_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFORMANCE_KEEP_RUNS", "3")
    assert keep_count() == 3
    monkeypatch.setenv("CONFORMANCE_KEEP_RUNS", "many")
    with pytest.raises(ValueError, match="CONFORMANCE_KEEP_RUNS"):
        keep_count()


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    """results/ as two runs of `nox -s conformance` leave it: the first kept, the second the latest."""
    first = [
        case("t::a", "passed", 1.0),
        case("t::b", "passed"),
        case("t::c", "passed"),
        case("t::d", "failed"),
    ]
    write(tmp_path, "conformance", run("20261101T100000Z-aa-conformance", "2026-11-01T10:00:00+00:00", first))
    archive(tmp_path, ["conformance"])
    second = [
        case("t::a", "failed", 3.0),
        case("t::b", "skipped"),
        case("t::d", "passed"),
        case("t::e", "passed"),
    ]
    write(
        tmp_path, "conformance", run("20261102T100000Z-bb-conformance", "2026-11-02T10:00:00+00:00", second)
    )
    return tmp_path


def test_compare_shows_the_difference_of_the_last_two_runs(
    two_runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare(["--results", str(two_runs)]) == 0
    out = capsys.readouterr().out
    assert "baseline: 20261101T100000Z-aa-conformance  mybackend 0.1" in out
    assert "this run: 20261102T100000Z-bb-conformance" in out
    assert "verdict:  regression — 1 newly failing, 1 newly skipped, 1 lost, 1 fixed, 1 new" in out
    assert "newly failing: 1 (gates)" in out
    assert "  t::a  passed → failed  [lowering/lower] lower(add_mul): boom" in out
    assert "lost: 1 (gates)\n  t::c  passed → absent" in out
    assert "fixed: 1\n  t::d  failed → passed" in out
    assert "bad_inputs (case-seconds)" in out  # 1.3 s → 3.3 s
    assert "3.00×" in out  # t::a, 1 s → 3 s: slowed down most
    assert "wall time" in out
    # The same two runs named explicitly (a part of a run id, and a file); a gate on request.
    latest = str(two_runs / "conformance.json")
    assert compare(["--results", str(two_runs), "aa-conformance", latest, "--fail-on-regression"]) == 1
    assert compare(["--results", str(two_runs), "--narrowed", "--fail-on-regression"]) == 1  # still 1 failing


def test_compare_lists_runs_and_explains_what_it_cannot_find(
    two_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare(["--results", str(two_runs), "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in listed] == [["conformance", "kept"], ["conformance", "latest"]]
    assert compare(["--results", str(two_runs), "nosuchrun"]) == 2
    assert "'nosuchrun' is not a result file or directory, and names 0 run(s)" in capsys.readouterr().err
    assert compare(["--results", str(tmp_path / "empty")]) == 2
    assert "fewer than two runs" in capsys.readouterr().err


def test_python_m_reports_compare_runs_without_third_party_packages(two_runs: Path) -> None:
    """`nox -s compare` runs it with nox's own interpreter: the standard library must be enough."""
    code = "import sys; sys.modules['jinja2'] = sys.modules['matplotlib'] = sys.modules['torch'] = None\n"
    code += f"import runpy; sys.argv = ['x', '--results', {str(two_runs)!r}]\n"
    code += "runpy.run_module('reports.compare', run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "verdict:  regression" in proc.stdout


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (
            ["--backend", "mybackend:BACKEND"],
            4,
            "pass the directory that holds 'mybackend' with --backend-path DIR",
        ),
        (["-k", "no_such_case_anywhere"], 5, "the selection selects no case"),
    ],
    ids=["unknown-backend", "selects-nothing"],
)
@pytest.mark.proof
def test_arguments_are_checked_before_a_run_touches_anything(args: list[str], code: int, words: str) -> None:
    """The front door runs this first: a typo stops the run while results/ is still as it was."""
    cmd = [
        sys.executable,
        "-m",
        "runner.check_args",
        "conformance/program_format/test_program_format.py",
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert words in proc.stdout + proc.stderr


@pytest.mark.proof
def test_good_arguments_say_how_many_cases_they_select() -> None:
    cmd = [
        sys.executable,
        "-m",
        "runner.check_args",
        "conformance/program_format/test_program_format.py",
        "-k",
        "empty_program",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "1 cases selected"
