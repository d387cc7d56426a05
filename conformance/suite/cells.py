"""The matrix cells (chapter × dtype) that select cases, read from the chapters' source without importing it.

``nox -s conformance_cell(...)`` offers one session per cell so CI can fan out; a cell that selects no case
would only ever fail (pytest's "no tests ran"). A chapter has the dtype cells when one of its tests is
parametrised over ``dtype`` (``conformance/conftest.py`` selects a cell by that parameter), and the
``independent`` cell when one of its tests is not. Pure ``ast``: the nox file uses it without torch.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

DTYPE_CELLS = ("float32", "float16", "bfloat16")
INDEPENDENT = "independent"


def _parametrized_names(decorator: ast.expr) -> set[str]:
    """The argument names of a ``@pytest.mark.parametrize("a, b" | ("a", "b"), ...)`` decorator."""
    if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "parametrize"):
        return set()
    if not decorator.args:
        return set()
    first = decorator.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return {name.strip() for name in first.value.split(",")}
    if isinstance(first, (ast.Tuple, ast.List)):
        return {e.value for e in first.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def chapter_cells(path: Path) -> list[str]:
    """The cells of one chapter module, in matrix order."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    with_dtype = without_dtype = False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            names = set().union(*(_parametrized_names(d) for d in node.decorator_list))
            if "dtype" in names:
                with_dtype = True
            else:
                without_dtype = True
    return [*(DTYPE_CELLS if with_dtype else ()), *((INDEPENDENT,) if without_dtype else ())]


def matrix_cells(chapters: Mapping[str, Path] | None = None) -> list[tuple[str, str]]:
    """Every (chapter, cell) that selects at least one case; ``chapters`` (name -> test module) defaults to
    the catalogue's ``CHAPTERS``: the nox file, which loads this file by path, passes them in."""
    if chapters is None:
        from conformance.catalogue.chapters import CHAPTERS as chapters
    return [(name, cell) for name, path in sorted(chapters.items()) for cell in chapter_cells(path)]
