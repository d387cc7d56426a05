"""The house's sizes (issue 28): no module of the repository over 600 lines, outside the data tables named
below, and no function or method over 80 lines. A long module is split by what its parts do, a long
function into well-named helpers. Every ``.py`` file git tracks is read (``git ls-files``), the self-tests
too; nothing is imported."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: Modules that are data tables, not code, exempt from the module limit (never from the function limit).
DATA_TABLES = {
    # The rule catalogue: one entry per rule (id, chapter, text, how it is checked), read by the chapters,
    # the report and the coverage table; splitting it would scatter the rules, not simplify code.
    "conformance/catalogue/entries.py",
}


def tracked_python_files(root: Path = ROOT) -> list[str]:
    """Repository-relative paths of the tracked ``.py`` files (deleted ones in the work tree left out)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "*.py"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): nothing to list")
    return sorted(name for name in listed.split("\0") if name and (root / name).is_file())


def long_modules(root: Path, names: list[str], exempt: set[str] = DATA_TABLES) -> list[str]:
    """One line per module over the limit: the file and its line count."""
    found = []
    for name in names:
        lines = len((root / name).read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES and name not in exempt:
            found.append(f"{name}: {lines} lines (limit {MAX_MODULE_LINES})")
    return found


def long_functions(root: Path, names: list[str]) -> list[str]:
    """One line per function or method over the limit: the file, the line, the qualified name, the count."""
    found = []
    for name in names:
        tree = ast.parse((root / name).read_text(encoding="utf-8"), name)
        for qualname, node in _functions(tree):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {qualname}: {lines} lines (limit {MAX_FUNCTION_LINES})")
    return found


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, nested ones too, with a dotted name (``Class.method``, ``f.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((prefix + node.name, node))
            found += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
        else:
            found += _functions(node, prefix)
    return found


def test_no_module_over_the_limit() -> None:
    found = long_modules(ROOT, tracked_python_files())
    assert not found, (
        f"modules over {MAX_MODULE_LINES} lines (split each by what its parts do):\n" + "\n".join(found)
    )


def test_no_function_over_the_limit() -> None:
    found = long_functions(ROOT, tracked_python_files())
    assert not found, (
        f"functions over {MAX_FUNCTION_LINES} lines (extract well-named helpers):\n" + "\n".join(found)
    )


def test_the_data_tables_are_tracked_and_still_long() -> None:
    """An exemption for a file that is gone, or that fits the limit now, is stale: drop it."""
    tracked = set(tracked_python_files())
    assert tracked >= DATA_TABLES, sorted(DATA_TABLES - tracked)
    stale = [name for name in DATA_TABLES if not long_modules(ROOT, [name], exempt=set())]
    assert not stale, f"data tables within {MAX_MODULE_LINES} lines now (drop the exemption): {stale}"


def test_the_guard_sees_long_modules_and_functions(tmp_path: Path) -> None:
    """Guard the guard: a planted long module, a long method and a long nested function are named with their
    counts; an exempt table and a function of exactly the limit are not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "table.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 5))
    nested = body.replace("    ", "        ") + "\n        y = 0"
    (tmp_path / "code.py").write_text(
        f"def fits():\n{body}\n\n"
        f"class C:\n    def method(self):\n{nested}\n\n"
        f"def outer():\n    def inner():\n{nested}\n    return inner\n"
    )
    names = ["big.py", "code.py", "table.py"]
    assert long_modules(tmp_path, names, exempt={"table.py"}) == [
        f"big.py: {MAX_MODULE_LINES + 1} lines (limit {MAX_MODULE_LINES})"
    ]
    found = long_functions(tmp_path, names)
    assert [line.split(" ", 1)[1] for line in found] == [
        f"C.method: {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})",
        f"outer: {MAX_FUNCTION_LINES + 3} lines (limit {MAX_FUNCTION_LINES})",
        f"outer.inner: {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})",
    ]
    assert found[0].startswith("code.py:")
