"""The HTML summary: it renders, escapes whatever the results contain, and the CLI fails cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import CaseResult, RunResult, new_run, write_results
from reports.__main__ import main
from reports.summary import backend_label, render_summary

HOSTILE = "<script>alert(1)</script>"
REPO_ROOT = Path(__file__).resolve().parents[1]


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
        case("conformance/test_mm_out.py::test_a", "passed"),
        *[
            case(f"conformance/test_mm_out.py::test_s[{i}]", "skipped", "no CUDA device is present")
            for i in range(3)
        ],
        case("conformance/test_mm_out.py::test_t", "skipped", "needs two GPUs"),
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
    for fact in ("2.13.0+cu130", "13.0", "NVIDIA H200 (150.0 GiB) GPU-1", "580.65"):
        assert fact in html
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
    run.cases.append(case(f"conformance/test_mm_out.py::test_x[{HOSTILE}]", "failed", f"boom {HOSTILE}"))
    run.cases.append(case("conformance/test_mm_out.py::test_y", "skipped", HOSTILE))
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
