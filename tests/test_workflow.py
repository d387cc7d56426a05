"""The GitHub Actions workflow is code too: it validates against GitHub's schema, every nox session and
script it runs exists, and its fan-out matrix is exactly the cells that select cases (``nox -l -t matrix``).

actionlint's pip wrapper downloads a binary at install time, so the schema check is check-jsonschema's
built-in copy of the workflow schema (offline); the rest reads the workflow and the noxfile directly.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.cells import matrix_cells

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
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


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_matches_githubs_schema(path: Path) -> None:
    pytest.importorskip(
        "check_jsonschema", reason="check-jsonschema is not installed (the test extra has it)"
    )
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


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
    expected = matrix_cells(ROOT / "conformance")
    extra, missing = sorted(set(listed) - set(expected)), sorted(set(expected) - set(listed))
    assert not extra, f"workflow cells that select no case (not in `nox -l -t matrix`): {extra}"
    assert not missing, f"cells of `nox -l -t matrix` missing from the workflow: {missing}"
    assert len(listed) == len(set(listed)), "a cell is listed twice"


def readme_commands() -> list[str]:
    """The README's two commands: the lines of the first code block under "## The two commands"."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_ci_entry_point_runs_the_readmes_test_command() -> None:
    """CI runs the README's self-test command exactly as a user types it (comment and all)."""
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert [c for c in commands if c.split("#")[0].rstrip().endswith("-s tests")], commands
    tests = next(c for c in commands if c.split("#")[0].rstrip().endswith("-s tests"))
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readmes_commands_need_no_pip_install_outside_a_venv() -> None:
    """Debian's and Ubuntu's python3 refuse `pip install` outside a venv (externally managed): the two
    commands must put nox in a venv of their own before anything is installed."""
    for command in readme_commands():
        first = command.split("&&")[0].strip()
        assert first.startswith("python3 -m venv "), command
        assert "python3 -m pip install" not in command, command
