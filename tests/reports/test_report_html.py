"""The HTML summary: it renders, escapes whatever the results contain, shows the same environment as the
dashboard (one view model per run), and the CLI fails cleanly."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.results import CaseResult, RunResult, new_run, write_results
from reports.__main__ import main
from reports.dashboard import main as dashboard_main
from reports.page_common import backend_label
from reports.page_run import environment_facts
from reports.summary import render_summary

HOSTILE = "<script>alert(1)</script>"
REPO_ROOT = Path(__file__).resolve().parents[2]


def case(id: str, outcome: str, message: str = "", chapter: str = "mm_out") -> CaseResult:
    return CaseResult(
        id=id,
        chapter=chapter,
        params={"dtype": "float16"},
        outcome=outcome,
        message=message,
        repro=f"python -m pytest '{id}'",
        duration_s=0.1,
        worker="gw0",
    )


def sample_run(complete: bool = True) -> RunResult:
    run = new_run(
        {
            "hostname": "box",
            "torch": "2.13.0+cu130",
            "torch_cuda": "13.0",
            "cuda_available": True,
            "gpus": [{"index": 0, "name": "NVIDIA H200", "total_memory_bytes": 150 * 2**30, "uuid": "GPU-1"}],
            "driver_version": "580.65",
            "env": {"CUDA_VISIBLE_DEVICES": "0", "CXX": None},
        },
        {"backend": {"name": "reference", "version": "0.1", "spec": "reference_impl:BACKEND"}},
    )
    run.cases = [
        case("conformance/mm_out/test_mm_out.py::test_a", "passed"),
        *[
            case(f"conformance/mm_out/test_mm_out.py::test_s[{i}]", "skipped", "no CUDA device is present")
            for i in range(3)
        ],
        case("conformance/mm_out/test_mm_out.py::test_t", "skipped", "needs two GPUs"),
        case("conformance/test_runtime.py::test_f", "failed", "AssertionError: 1 != 2", chapter="runtime"),
        case("conformance/test_runtime.py::test_c", "crashed", "worker 'gw0' crashed", chapter="runtime"),
    ]
    run.complete = complete
    run.finished_at = "2025-01-01T00:00:09+00:00" if complete else None
    return run


def test_renders_header_counts_chapters_and_failures() -> None:
    html = render_summary(sample_run())
    assert html.startswith("<!DOCTYPE html>")
    assert "reference 0.1 (reference_impl:BACKEND)" in html
    for fact in ("2.13.0+cu130", "13.0", "580.65", "<dt>CUDA available</dt><dd>yes</dd>"):
        assert fact in html
    assert '<td>NVIDIA H200</td><td>150.0 GiB</td><td></td><td class="mono">GPU-1</td>' in html
    assert "mm_out: 3 skipped — no CUDA device is present" in html
    assert "mm_out: 1 skipped — needs two GPUs" in html
    assert "<pre>AssertionError: 1 != 2</pre>" in html
    assert "python -m pytest &#39;conformance/test_runtime.py::test_c&#39;" in html
    assert "Incomplete run" not in html
    # Self-contained: no external stylesheets, scripts or images.
    assert "<script" not in html
    assert "<link" not in html
    assert "http" not in html


def test_hostile_strings_are_escaped() -> None:
    run = sample_run()
    run.cases.append(
        case(f"conformance/mm_out/test_mm_out.py::test_x[{HOSTILE}]", "failed", f"boom {HOSTILE}")
    )
    run.cases.append(case("conformance/mm_out/test_mm_out.py::test_y", "skipped", HOSTILE))
    run.metadata["backend"] = {"name": HOSTILE, "version": "1"}
    run.environment["hostname"] = HOSTILE
    html = render_summary(run)
    assert HOSTILE not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_incomplete_run_says_so() -> None:
    run = sample_run(complete=False)
    run.metadata["incomplete_reason"] = "3 of 10 collected tests have no result"
    html = render_summary(run)
    assert "Incomplete run." in html
    assert "3 of 10 collected tests have no result" in html


def test_empty_run_renders() -> None:
    html = render_summary(new_run({}, {}))
    assert "No cases were recorded." in html
    assert "not recorded" in html  # no backend metadata


@pytest.mark.parametrize(
    ("backend", "label"),
    [
        ({"name": "ref", "version": "2", "spec": "m:a"}, "ref 2 (m:a)"),
        ({"spec": "m:a"}, "m:a"),
        ("ref", "ref"),
        (None, "not recorded"),
    ],
)
def test_backend_label(backend: object, label: str) -> None:
    assert backend_label(backend) == label


def test_cli_merges_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = sample_run(), sample_run()
    second.environment["hostname"] = "other-box"
    write_results(tmp_path / "a.json", first)
    write_results(tmp_path / "b.json", second)
    out = tmp_path / "site" / "index.html"
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(out)]) == 0
    html = out.read_text()
    assert "Shards (2)" in html
    assert "other-box" in html
    assert "14 cases" in html
    assert str(out) in capsys.readouterr().out


def test_cli_bad_file_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "aoti-conformance-results", "schema_ver')
    proc = subprocess.run(
        [sys.executable, "-m", "reports", str(bad), "-o", str(tmp_path / "index.html")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: ")
    assert "not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "index.html").exists()


def test_cli_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.json"), "-o", str(tmp_path / "i.html")]) == 2
    assert "no such result file" in capsys.readouterr().err


class EnvironmentTable(HTMLParser):
    """The label/value pairs of the ``environment-facts`` list, and the cells of the GPU table."""

    def __init__(self) -> None:
        super().__init__()
        self.facts: list[str] = []
        self.gpu_cells: list[str] = []
        self._where = ""
        self._depth = 0

    @classmethod
    def of(cls, html: str) -> EnvironmentTable:
        parser = cls()
        parser.feed(html)
        return parser

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if ("id", "environment-facts") in attrs:
            self._where = "facts"
        elif tag == "table" and ("class", "gpus") in attrs:
            self._where = "gpus"
        elif self._where and tag in ("dt", "dd", "td"):
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if (self._where, tag) in (("facts", "dl"), ("gpus", "table")):
            self._where = ""
        elif self._where and tag in ("dt", "dd", "td"):
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth and self._where == "facts":
            self.facts.append(data)
        elif self._depth and self._where == "gpus":
            self.gpu_cells.append(data)


def test_summary_and_dashboard_show_the_same_environment(tmp_path: Path) -> None:
    """One view model per run: ``python -m reports`` and the dashboard's run page list the same facts."""
    run = sample_run()
    run.environment.update({"python": "3.12.3", "python_implementation": "CPython", "cpu": "x86_64"})
    run.environment["cpu_count"] = 16
    write_results(tmp_path / "run.json", run)
    assert main([str(tmp_path / "run.json"), "-o", str(tmp_path / "summary.html")]) == 0
    assert dashboard_main([str(tmp_path / "run.json"), "-o", str(tmp_path / "site")]) == 0
    summary = EnvironmentTable.of((tmp_path / "summary.html").read_text(encoding="utf-8"))
    dashboard = EnvironmentTable.of(
        next((tmp_path / "site" / "runs").glob("*.html")).read_text(encoding="utf-8")
    )
    expected = [text for pair in environment_facts(run) for text in pair]
    assert summary.facts == dashboard.facts == expected
    assert {"CUDA available", "$CUDA_VISIBLE_DEVICES", "x86_64 (16 cores)", "3.12.3 CPython"} <= set(expected)
    assert "Cores the run may use" not in expected  # all of them: nothing to say
    assert summary.gpu_cells == dashboard.gpu_cells
    assert "150.0 GiB" in summary.gpu_cells


def test_the_environment_says_when_the_run_could_use_fewer_cores_than_the_host_has() -> None:
    run = sample_run()
    bound = "the cgroup's CPU quota of 8 CPUs; the machine has 128"
    run.environment.update({"cpu": "x86_64", "cpu_count": 128, "usable_cores": 8, "cores_bound_by": bound})
    facts = dict(environment_facts(run))
    assert facts["CPU"] == "x86_64 (128 cores)"
    assert facts["Cores the run may use"] == f"8 ({bound})"


def test_summary_renders_odd_but_schema_valid_content() -> None:
    """The summary reads a run through the dashboard's defensive view model, odd nested values included."""
    run = dataclasses.replace(
        sample_run(),
        environment={"gpus": "lots", "env": ["x"], "hostname": 5, "cpu_count": "many", "shards": "x"},
        metadata={"backend": 7, "shards": {"a": 1}, "incomplete_reason": ["?"], "warnings": "w"},
    )
    html = render_summary(run)
    assert "<dt>Host</dt><dd>5</dd>" in html
    assert "lots" not in html  # a string is not a list of GPUs
