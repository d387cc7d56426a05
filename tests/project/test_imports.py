"""Every module of the project imports: a module left pointing at a moved or deleted one fails here, not
in the middle of a GPU run."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from tests.project.import_scan import PACKAGES


def _modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names += [info.name for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")]
    return sorted(names)


@pytest.mark.parametrize("module", _modules())
def test_module_imports(module: str) -> None:
    importlib.import_module(module)
