"""Which public names of ``conformance.common.checks``, ``conformance.common.tolerances``,
``conformance.common.view_pass_checks`` and ``conformance.common.pcie_checks`` a meta-test exercises.

A meta-test declares its targets with ``@covers(checks.assert_exact)``: objects, not strings, so a renamed
helper breaks the import here instead of leaving a stale name. ``test_meta_coverage`` compares the set
with every public name these modules define, so a new helper without a meta-test fails the self-tests.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

from conformance.common import checks, pcie_checks, tolerances, view_pass_checks

MODULES: tuple[ModuleType, ...] = (checks, tolerances, view_pass_checks, pcie_checks)
COVERED: set[str] = set()

F = TypeVar("F", bound=Callable[..., object])


def public_definitions(module: ModuleType) -> list[str]:
    """Public top-level names the module's own source defines (classes, functions, assignments): what it
    imports, e.g. ``checks`` importing ``TOLERANCES``, belongs to the module that defines it."""
    names: list[str] = []
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if not name.startswith("_")]


def qualified_name(target: object) -> str:
    """``checks.assert_exact`` for the object itself, found by identity (tables have no ``__name__``)."""
    for module in MODULES:
        for name in public_definitions(module):
            if getattr(module, name) is target:
                return f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
    raise LookupError(f"{target!r} is not a public definition of {[m.__name__ for m in MODULES]}")


def covers(*targets: object) -> Callable[[F], F]:
    """Record that the decorated meta-test exercises ``targets``."""
    names = [qualified_name(target) for target in targets]

    def mark(test: F) -> F:
        COVERED.update(names)
        return test

    return mark
