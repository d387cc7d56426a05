"""The rule coverage page: the table ``python -m tests.rule_coverage --json`` prints, given to the
dashboard as a file (``--coverage FILE``, or ``rule-coverage.json`` among the inputs), never by importing the
suite. The sample is hand-written (``tests.dashboard_samples.RULE_COVERAGE``), not generated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reports.coverage import COVERAGE_FILE, CoverageFileError, load_coverage
from reports.dashboard import main
from reports.page_coverage import coverage_page
from tests.dashboard_samples import HOSTILE, RULE_COVERAGE, sample_run, write_rule_coverage, write_run

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_rows_keep_each_field_and_name_what_the_self_test_fails_on_missing(tmp_path: Path) -> None:
    rules = {r.rule: r for r in load_coverage(write_rule_coverage(tmp_path / "c.json"))}
    assert list(rules) == [row["rule"] for row in RULE_COVERAGE]
    values = rules["mm_out/values"]
    assert (values.level, values.status, values.cases, values.reason) == ("must", "proven", 3, "")
    assert values.broken_backends == (
        "tests.broken.basic:WRONG_VALUES",
        "tests.broken.chapter:TRANSPOSES_THE_SECOND_OPERAND_FOR_COLUMN_MAJOR_LAYOUTS",
    )
    assert rules["bad_inputs/corrupt-program"].status == "gap"
    assert rules["bad_inputs/corrupt-program"].reason.startswith("program_format/* broken loaders")
    assert rules["traffic_meter/calibration"].status == "not-checkable"
    # The table's own NO BROKEN BACKEND / NO CASE are "missing", with the reason spelled out.
    assert (
        rules["runtime_options/no-host-sync"].status,
        rules["runtime_options/no-host-sync"].raw_status,
    ) == (
        "missing",
        "NO BROKEN BACKEND",
    )
    assert rules["runtime_options/no-host-sync"].reason == "no broken backend proves it, and it is not exempt"
    assert rules["lowering/spec-only"].reason == "no case checks this rule"


def test_page_orders_most_urgent_first_and_counts_every_status(tmp_path: Path) -> None:
    page = coverage_page(load_coverage(write_rule_coverage(tmp_path / "c.json")), "c.json")
    assert page.counts == [("missing", 2), ("gap", 1), ("not-checkable", 1), ("proven-gpu", 0), ("proven", 1)]
    assert [(row.status, row.rule) for row in page.rows] == [
        ("missing", "lowering/spec-only"),
        ("missing", "runtime_options/no-host-sync"),
        ("gap", "bad_inputs/corrupt-program"),
        ("not-checkable", "traffic_meter/calibration"),
        ("proven", "mm_out/values"),
    ]
    assert [row.anchor for row in page.rows] == [
        "status-missing",
        "",
        "status-gap",
        "status-not-checkable",
        "status-proven",
    ]
    assert page.rows[0].status_title == "NO CASE"


def test_coverage_option_writes_the_page_and_the_index_sums_it_up(tmp_path: Path, capsys) -> None:
    coverage = write_rule_coverage(tmp_path / "cov.json")
    result = write_run(tmp_path / "r.json", sample_run(hostile=False))
    site = tmp_path / "site"
    assert main([str(result), "-o", str(site), "--coverage", str(coverage)]) == 0
    assert "coverage.html: 5 rule(s)" in capsys.readouterr().out
    html = (site / "coverage.html").read_text(encoding="utf-8")
    table = html[html.index('id="rules"') :]
    assert (
        '<td class="rule" title="chapter(s): mm_out">mm_out/<wbr>values</td>\n        <td>must</td>\n'
        '        <td><span class="badge proven">proven</span></td>\n        <td class="num">3</td>\n'
        '        <td class="backends"><div>tests.broken.basic:<wbr>WRONG_VALUES</div>'
        "<div>tests.broken.chapter:<wbr>TRANSPOSES_THE_SECOND_OPERAND_FOR_COLUMN_MAJOR_LAYOUTS</div></td>"
    ) in table
    assert '<span class="badge missing" title="NO CASE">missing</span>' in table
    assert "the meter&#39;s own self-check: no backend is involved" in table
    assert HOSTILE not in html  # the reason's hostile string is escaped
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'id="rule-coverage"' in index
    assert '<span class="badge missing">2 missing</span>' in index
    assert '<a href="coverage.html">Rule coverage</a>' in index  # in the navigation bar of every page
    run_page = next((site / "runs").glob("*.html")).read_text(encoding="utf-8")
    assert '<a href="../coverage.html">Rule coverage</a>' in run_page


def test_a_rule_coverage_json_in_the_results_directory_is_picked_up_not_read_as_a_run(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    write_run(results / "conformance.json", sample_run(hostile=False))
    write_rule_coverage(results / COVERAGE_FILE)
    site = tmp_path / "site"
    assert main([str(results), "-o", str(site)]) == 0  # not an unreadable result file
    assert (site / "coverage.html").exists()
    assert len(list((site / "runs").glob("*.html"))) == 1


def test_without_a_coverage_file_there_is_no_page_and_no_link(tmp_path: Path) -> None:
    site = tmp_path / "site"
    assert main([str(write_run(tmp_path / "r.json", sample_run(hostile=False))), "-o", str(site)]) == 0
    assert not (site / "coverage.html").exists()
    assert "coverage.html" not in (site / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "text",
    [
        "{",  # not JSON
        json.dumps({"rules": []}),  # not a list
        json.dumps([{"level": "must"}]),  # a row without a rule id
        json.dumps([{"rule": "a/b", "cases": "all of them"}]),  # cases not a list
    ],
)
def test_an_unreadable_coverage_file_is_named_and_exits_2_but_the_runs_still_render(
    tmp_path: Path, text: str, capsys
) -> None:
    bad = tmp_path / "cov.json"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(CoverageFileError, match=r"cov\.json"):
        load_coverage(bad)
    site = tmp_path / "site"
    result = write_run(tmp_path / "r.json", sample_run(hostile=False))
    assert main([str(result), "-o", str(site), "--coverage", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(bad) in err
    assert not (site / "coverage.html").exists()
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'id="load-errors"' in index


def test_the_page_is_built_from_the_file_without_importing_the_suite(tmp_path: Path) -> None:
    coverage = write_rule_coverage(tmp_path / "cov.json")
    result = write_run(tmp_path / "r.json", sample_run(hostile=False))
    code = (
        "import sys\n"
        "from reports.dashboard import main\n"
        "assert main([sys.argv[1], '-o', sys.argv[2], '--coverage', sys.argv[3]]) == 0\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('conformance', 'reference_impl', 'torch')]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(result), str(tmp_path / "site"), str(coverage)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "coverage.html").exists()
