"""One side-by-side page for three runs or more (issue 30): reference vs PyTorch AOTI (default and checked)
vs upstream ExecuTorch, a column each, the disagreements first, and how each backend fares per rule."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.results import CaseResult, RunResult, new_run
from reports.dashboard import main
from reports.inputs import LoadedRun
from reports.page_compare_many import CompareManyPage, compare_many_page
from reports.pages import MAX_COMPARE_NAME, side_by_side_path
from tests.dashboard_samples import HOSTILE, case, environment, write_run

ROOT = Path(__file__).resolve().parents[2]
DTYPE_RULE, SYNC_RULE = "bad_inputs/dtype", "runtime_options/no-host-sync"
KNOWN_REASON = f"the checked mode still lets float16 through {HOSTILE}"

WRONG_DTYPE = case("bad_inputs", "test_wrong_dtype_is_rejected", {"dtype": "float16"}, "passed")
HOSTILE_CASE = case("bad_inputs", "test_hostile", {"dtype": HOSTILE}, "passed")
KV_CACHE = case("multi_method", "test_kv_cache_stays_on_gpu", {"model": "tiny_llm"}, "passed")
VALUES = case("mm_out", "test_values_match_float64_reference", {"dtype": "float32"}, "passed")
TWO_GPUS = case("runtime", "test_two_gpus_share_nothing", {}, "passed")
HOST_SYNC = case("runtime", "test_no_host_sync", {"device": "cuda"}, "passed")
SKIP_REASON, NOT_RUN_REASON = "needs two or more CUDA devices", "the run stopped first: deadline"


def backend_run(run_id: str, name: str, version: str, changed: dict[str, CaseResult | None]) -> RunResult:
    """One small run: every case above passes, but for ``changed`` (by case id; None: not in the run)."""
    run = new_run(environment(), {"backend": {"name": name, "version": version, "spec": f"{name}:BACKEND"}})
    run = dataclasses.replace(run, run_id=run_id, complete=True)
    cases = [WRONG_DTYPE, HOSTILE_CASE, KV_CACHE, VALUES, TWO_GPUS, HOST_SYNC]
    run.cases = [c for c in (changed.get(c.id, c) for c in cases) if c is not None]
    return run


def ended(item: CaseResult, outcome: str, message: str, rule: str | None, **extra: Any) -> CaseResult:
    return dataclasses.replace(item, outcome=outcome, message=message, rule=rule, **extra)


def four_runs() -> list[RunResult]:
    """The reference passes everything; AOTI fails the dtype rule and skips a case; its checked mode has
    that failure declared as known; ExecuTorch lacks the case, stops before one, fails a should rule,
    crashes one and fails the hostile case without naming a rule."""
    ref = backend_run("ref-run", "reference_impl", "0.1.0", {})
    aoti = backend_run(
        "aoti-run",
        "torch-aoti",
        "2.13.0",
        {
            WRONG_DTYPE.id: ended(
                WRONG_DTYPE, "failed", f"[{DTYPE_RULE}] accepted float16", DTYPE_RULE, level="must"
            ),
            TWO_GPUS.id: ended(TWO_GPUS, "skipped", SKIP_REASON, None),
        },
    )
    known = {
        "case": WRONG_DTYPE.id,
        "rule": DTYPE_RULE,
        "reason": KNOWN_REASON,
        "link": "",
        "source": "k.toml",
    }
    checked = backend_run(
        "aoti-checked-run",
        "torch-aoti-checked",
        "2.13.0",
        {
            WRONG_DTYPE.id: ended(
                WRONG_DTYPE, "xfailed", f"[{DTYPE_RULE}] accepted", None, known_failure=known
            )
        },
    )
    et = backend_run(
        "et-run",
        f"executorch {HOSTILE}",
        "1.5.1",
        {
            WRONG_DTYPE.id: None,
            TWO_GPUS.id: ended(TWO_GPUS, "not-run", NOT_RUN_REASON, None),
            HOST_SYNC.id: ended(
                HOST_SYNC, "should-failed", f"[{SYNC_RULE}] waited", SYNC_RULE, level="should"
            ),
            KV_CACHE.id: ended(KV_CACHE, "crashed", "worker 'gw1' crashed (signal 11: SIGSEGV)", None),
            HOSTILE_CASE.id: ended(HOSTILE_CASE, "failed", HOSTILE, None),
        },
    )
    return [ref, aoti, checked, et]


def page_of(runs: list[RunResult]) -> CompareManyPage:
    return compare_many_page(
        [LoadedRun(r, [f"{r.run_id}.json"]) for r in runs], ["../runs/ref-run.html", "", "", ""]
    )


def test_rows_where_the_runs_disagree_come_first_by_rule_then_chapter() -> None:
    page = page_of(four_runs())
    assert page.total == 6
    assert [r.id for r in page.differ] == [
        WRONG_DTYPE.id,  # names bad_inputs/dtype
        HOST_SYNC.id,  # names runtime_options/no-host-sync
        HOSTILE_CASE.id,  # no rule named: by chapter (bad_inputs, multi_method, runtime)
        KV_CACHE.id,
        TWO_GPUS.id,
    ]
    assert [r.rule for r in page.differ] == [DTYPE_RULE, SYNC_RULE, "", "", ""]
    assert [r.id for r in page.same] == [VALUES.id]
    assert page.unnamed_failures == 2  # the crash and the hostile failure name no rule


def test_each_cell_says_the_outcome_and_what_it_names() -> None:
    page = page_of(four_runs())
    rows = {r.id: r for r in page.differ}
    ref, aoti, checked, et = rows[WRONG_DTYPE.id].cells
    assert (ref.outcome, ref.rule) == ("passed", "")
    assert (aoti.outcome, aoti.rule, aoti.note) == ("failed", DTYPE_RULE, "")
    assert (checked.outcome, checked.rule, checked.note) == ("xfailed", DTYPE_RULE, KNOWN_REASON)
    assert et.outcome == ""  # absent
    two_gpus = [(c.outcome, c.note) for c in rows[TWO_GPUS.id].cells]
    assert two_gpus == [("passed", ""), ("skipped", SKIP_REASON), ("passed", ""), ("not-run", NOT_RUN_REASON)]
    assert [c.outcome for c in rows[HOST_SYNC.id].cells] == ["passed", "passed", "passed", "should-failed"]
    assert rows[HOST_SYNC.id].cells[3].rule == SYNC_RULE
    assert [c.outcome for c in page.same[0].cells] == ["passed"] * 4


def test_columns_name_each_backend_and_link_its_run_page() -> None:
    page = page_of(four_runs())
    assert [(r.side, r.name, r.version, r.run_id) for r in page.runs] == [
        ("A", "reference_impl", "0.1.0", "ref-run"),
        ("B", "torch-aoti", "2.13.0", "aoti-run"),
        ("C", "torch-aoti-checked", "2.13.0", "aoti-checked-run"),
        ("D", f"executorch {HOSTILE}", "1.5.1", "et-run"),
    ]
    assert [r.href for r in page.runs] == ["../runs/ref-run.html", "", "", ""]
    assert dict(page.runs[1].counts) == {"passed": 4, "failed": 1, "skipped": 1}
    assert page.runs[3].total == 5


def test_per_rule_table_says_how_each_backend_fares() -> None:
    page = page_of(four_runs())
    table = {row.rule: row for row in page.rules}
    assert list(table) == [DTYPE_RULE, SYNC_RULE]  # named by a failure, a known failure, a should-failure
    dtype = table[DTYPE_RULE]
    assert (dtype.level, dtype.cases) == ("must", 1)
    assert [(s.status, s.count, s.checked) for s in dtype.standings] == [
        ("passes", 1, 1),
        ("fails", 1, 1),
        ("known failure", 1, 1),
        ("not exercised", 0, 0),  # ExecuTorch did not run the case
    ]
    assert dtype.standings[2].note == KNOWN_REASON
    assert [s.css for s in dtype.standings] == ["passed", "failed", "xfailed", "n-a"]
    sync = table[SYNC_RULE]
    assert sync.level == "should"
    assert [s.status for s in sync.standings] == ["passes", "passes", "passes", "should-failed"]


def test_dashboard_writes_one_page_for_a_comma_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [write_run(tmp_path / f"{r.run_id}.json", r) for r in four_runs()]
    site = tmp_path / "site"
    others = ",".join(str(p) for p in paths[1:])
    assert main([str(paths[0]), "--side-by-side", others, "-o", str(site)]) == 0
    name = "ref-run--vs--aoti-run--vs--aoti-checked-run--vs--et-run.html"
    assert [p.name for p in (site / "compare").iterdir()] == [name]  # one page, no pairs
    html = (site / "compare" / name).read_text(encoding="utf-8")
    for backend in ("reference_impl", "torch-aoti", "torch-aoti-checked", "executorch"):
        assert f"· {backend}" in html  # a column header each
    assert HOSTILE not in html  # the hostile case id, backend name and message are escaped
    assert f"::test_hostile[{HOSTILE}]".replace("<", "&lt;").replace(">", "&gt;") in html
    assert 'href="../runs/ref-run.html"' in html
    assert html.index('id="differ"') < html.index('id="same"')
    assert "<details><summary>show 1</summary>" in html  # same everywhere: collapsed
    index = (site / "index.html").read_text(encoding="utf-8")
    assert f'href="compare/{name}"' in index
    assert "<b>D</b>" in index
    assert "A reference_impl 0.1.0" in capsys.readouterr().out


def test_inputs_of_different_backends_get_the_page_without_the_option(tmp_path: Path) -> None:
    paths = [write_run(tmp_path / f"{r.run_id}.json", r) for r in four_runs()[:3]]
    assert main([*map(str, paths), "-o", str(tmp_path / "site")]) == 0
    assert [p.name for p in (tmp_path / "site" / "compare").iterdir()] == [
        "ref-run--vs--aoti-run--vs--aoti-checked-run.html"
    ]


def test_a_long_name_is_cut_to_a_stable_hash() -> None:
    runs = [LoadedRun(dataclasses.replace(r, run_id=r.run_id + "x" * 70), []) for r in four_runs()]
    path = side_by_side_path(*runs)
    assert path == side_by_side_path(*runs)
    assert len(path) <= len("compare/.html") + MAX_COMPARE_NAME
    assert "--vs--3-more-" in path
    assert side_by_side_path(*runs[:2]) != side_by_side_path(runs[1], runs[0])


def test_the_page_renders_without_torch(tmp_path: Path) -> None:
    """`nox -s report` installs no torch: the comparison page must not need it."""
    paths = [str(write_run(tmp_path / f"{r.run_id}.json", r)) for r in four_runs()]
    site = tmp_path / "site"
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "from reports.dashboard import main\n"
        f"sys.exit(main([{paths[0]!r}, '--side-by-side', {','.join(paths[1:])!r}, '-o', {str(site)!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list((site / "compare").glob("*--vs--*--vs--*--vs--*.html"))) == 1
