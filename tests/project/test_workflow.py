"""The GitHub Actions workflow is code too: it validates against GitHub's schema, every nox session and
script it runs exists, and its fan-out matrix is exactly the cells that select cases (``nox -l -t matrix``).
The worked examples under ``examples/ci/`` are held to the same checks; the sharded one's listing step is
run for real, and its jobs are checked to share one run id, cache by ``runner.cache_key`` and merge every
cell's files into the report.

actionlint's pip wrapper downloads a binary at install time, so the schema check is check-jsonschema's
built-in copy of the workflow schema (offline); the rest reads the workflow and the noxfile directly.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.suite.cells import matrix_cells

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "ci").glob("*.yml"))
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml")) + EXAMPLES
SHARDED = ROOT / "examples" / "ci" / "github-actions-sharded.yml"
NOX_SESSION = re.compile(r"nox\b[^\n|;&]*?\s-s\s+(\"[^\"]+\"|'[^']+'|\S+)")
LOCAL_SCRIPT = re.compile(r"(?:^|\s)(?:bash\s+)?(\.ci/[\w./-]+)")


def _load(path: Path) -> dict[str, Any]:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml reads the workflow (the test extra has it)")
    return yaml.YAML(typ="safe").load(path.read_text())


def _nox_sessions() -> set[str]:
    """Session names the noxfile defines (``@nox.session`` functions, or their ``name=``), read statically:
    the self-test venv has no nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    names = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            target = call.func if call else deco
            if ast.unparse(target) == "nox.session":
                given = [k.value for k in (call.keywords if call else []) if k.arg == "name"]
                names.add(given[0].value if given and isinstance(given[0], ast.Constant) else node.name)
    return names


def _run_commands(workflow: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (job_name, step["run"])
        for job_name, job in workflow["jobs"].items()
        for step in job.get("steps", [])
        if "run" in step
    ]


def _schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema against its built-in copy of GitHub's workflow schema (offline)."""
    pytest.importorskip(
        "check_jsonschema", reason="check-jsonschema is not installed (the test extra has it)"
    )
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_matches_githubs_schema(path: Path) -> None:
    proc = _schema_check(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    """Guard the guard: a misspelt ``runs-on`` is refused, so a passing check means something."""
    broken = tmp_path / "broken.yml"
    broken.write_text(SHARDED.read_text().replace("    runs-on: ubuntu-latest", "    runs_on: ubuntu-latest"))
    assert "runs_on" in broken.read_text()
    proc = _schema_check(broken)
    assert proc.returncode != 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_every_nox_session_and_script_the_workflow_runs_exists(path: Path) -> None:
    sessions = _nox_sessions()
    assert {"tests", "conformance", "bench", "report", "browser"} <= sessions  # the parser still works
    missing = []
    for job, command in _run_commands(_load(path)):
        for match in NOX_SESSION.finditer(command):
            session = match.group(1).strip("\"'").split("(")[0]
            if session not in sessions:
                missing.append(f"{job}: nox session {session!r}")
        missing += [f"{job}: {s}" for s in LOCAL_SCRIPT.findall(command) if not (ROOT / s).exists()]
    assert not missing, f"the workflow runs what does not exist: {missing}"


def test_fan_out_matrix_is_exactly_the_cells_that_select_cases() -> None:
    workflow = _load(ROOT / ".github" / "workflows" / "gpu-conformance.yml")
    include = workflow["jobs"]["cells"]["strategy"]["matrix"]["include"]
    listed = [(entry["chapter"], entry["dtype"]) for entry in include]
    expected = matrix_cells()
    extra, missing = sorted(set(listed) - set(expected)), sorted(set(expected) - set(listed))
    assert not extra, f"workflow cells that select no case (not in `nox -l -t matrix`): {extra}"
    assert not missing, f"cells of `nox -l -t matrix` missing from the workflow: {missing}"
    assert len(listed) == len(set(listed)), "a cell is listed twice"


def readme_commands() -> list[str]:
    """The README's commands: the lines of the first code block under "## The three commands" (the suite;
    the self-tests in their two tiers)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The three commands", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_ci_entry_point_runs_the_readmes_test_commands() -> None:
    """CI runs the README's self-test commands (both tiers) exactly as a user types them (comments and
    all), the fast tier first."""
    commands = readme_commands()
    assert len(commands) == 3, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    positions = []
    for session in ("tests", "proofs"):
        (command,) = [c for c in commands if c.split("#")[0].rstrip().endswith(f"-s {session}")]
        assert command in ci, f"{command!r} is not a line of .ci/run"
        positions.append(ci.index(command))
    assert positions == sorted(positions), "CI runs the fast tier first"


def test_the_readmes_commands_need_no_pip_install_outside_a_venv() -> None:
    """Debian's and Ubuntu's python3 refuse `pip install` outside a venv (externally managed): the two
    commands must put nox in a venv of their own before anything is installed."""
    for command in readme_commands():
        first = command.split("&&")[0].strip()
        assert first.startswith("python3 -m venv "), command
        assert "python3 -m pip install" not in command, command


def _step(job: dict[str, Any], uses: str = "", runs: str = "") -> dict[str, Any]:
    """The job's one step that uses action ``uses`` (``owner/name@``) or whose script contains ``runs``."""
    found = [
        step
        for step in job["steps"]
        if (uses and str(step.get("uses", "")).startswith(uses)) or (runs and runs in step.get("run", ""))
    ]
    assert len(found) == 1, (uses or runs, found)
    return found[0]


@pytest.mark.skipif(not shutil.which("bash"), reason="the step is a bash script")
def test_the_sharded_examples_listing_step_gives_every_cell_and_one_run_id(tmp_path: Path) -> None:
    """The ``cells`` job's script, run as the runner would (``bash -e``, ``nox`` and ``python`` on PATH):
    its outputs are every cell of the matrix and one run id for all of them."""
    pytest.importorskip("nox", reason="nox is not installed (the test extra has it)")
    step = _step(_load(SHARDED)["jobs"]["cells"], runs="nox -l --json")
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, command in {"nox": f"-m nox -f {ROOT / 'noxfile.py'}", "python": ""}.items():
        (shims / name).write_text(f'#!/bin/sh\nexec {sys.executable} {command} "$@"\n')
        (shims / name).chmod(0o755)
    outputs = tmp_path / "github_output"
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "GITHUB_OUTPUT": str(outputs)}
    env["GITHUB_RUN_ID"] = "4242"
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    proc = subprocess.run(["bash", "-e", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert json.loads(written["cells"]) == [{"chapter": c, "dtype": d} for c, d in matrix_cells()]
    assert re.fullmatch(r"\d{8}T\d{6}Z-gh4242", written["run_id"]), written["run_id"]


def test_the_sharded_example_shares_one_run_id_caches_by_the_key_and_merges_every_cell() -> None:
    jobs = _load(SHARDED)["jobs"]
    cells, cell, report = jobs["cells"], jobs["cell"], jobs["report"]
    list_step = _step(cells, runs="nox -l --json")
    assert cells["outputs"]["cells"] == f"${{{{ steps.{list_step['id']}.outputs.cells }}}}"
    assert cell["strategy"]["matrix"]["cell"] == "${{ fromJSON(needs.cells.outputs.cells) }}"
    assert cell["strategy"]["fail-fast"] is False  # one failing cell must not cancel the others
    # One run id for every cell, picked once by the listing job.
    assert cell["env"]["CONFORMANCE_RUN_ID"] == "${{ needs.cells.outputs.run_id }}"
    assert (
        "conformance_cell(chapter='$CHAPTER', dtype='$DTYPE')" in _step(cell, runs="conformance_cell(")["run"]
    )
    assert cell["env"]["CHAPTER"] == "${{ matrix.cell.chapter }}"
    assert cell["env"]["DTYPE"] == "${{ matrix.cell.dtype }}"
    # The artifact directory is cached under runner.cache_key's key, per cell, and the run uses it.
    key_step = _step(cell, runs="python3 -m runner.cache_key")
    assert "CONFORMANCE_CACHE_DIR=" in key_step["run"]
    assert '>> "$GITHUB_ENV"' in key_step["run"]
    restore = _step(cell, uses="actions/cache/restore@")
    save = _step(cell, uses="actions/cache/save@")
    for cache in (restore["with"], save["with"]):
        assert cache["path"] == f"${{{{ steps.{key_step['id']}.outputs.path }}}}"
        for part in (f"steps.{key_step['id']}.outputs.key", "matrix.cell.chapter", "matrix.cell.dtype"):
            assert part in cache["key"], cache["key"]
    # Saved from the default branch only, under a key not saved yet, pruned first (issue 50 item 1).
    prune = _step(cell, runs="harness.caches --prune-unused-runs")
    for step in (prune, save):
        assert "github.ref_name == github.event.repository.default_branch" in step["if"]
        assert f"steps.{restore['id']}.outputs.cache-hit != 'true'" in step["if"]
    steps = cell["steps"]
    run = _step(cell, runs="conformance_cell(")
    assert steps.index(restore) < steps.index(run) < steps.index(prune) < steps.index(save)
    # Every cell's files go up under one prefix and come down into one folder, which the report renders.
    upload = _step(cell, uses="actions/upload-artifact@")
    assert upload["if"] == "${{ !cancelled() }}"
    assert "results/*.json" in upload["with"]["path"].split()
    prefix = upload["with"]["name"].split("${{")[0]
    download = _step(report, uses="actions/download-artifact@")["with"]
    assert download == {"pattern": f"{prefix}*", "merge-multiple": True, "path": "results"}
    assert "cell" in report["needs"]
    assert report["if"] == "${{ !cancelled() }}"  # also after failed cells: the page explains them
    assert _step(report, runs="nox -s report")["run"].startswith("nox -s report -- results")
