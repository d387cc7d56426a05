"""The chapters, read from the folders: a chapter is a folder ``conformance/<name>/`` holding its test module
``test_<name>.py`` and the helpers only it imports. Its name is the folder's, and this is the one place that
reads it: the rule table's rows (``rule.py``), the coverage table, the matrix cells (``conformance/suite/
cells.py``) and the nox file's cell sessions all take the chapters from :data:`CHAPTERS`. A new folder with
its test module is a new chapter; nothing else lists them (README "Adding a chapter").

Standard library only, and no import of ours: the nox file loads it by path, without torch.
"""

from __future__ import annotations

from pathlib import Path

#: ``conformance/``, the folder whose subfolders are the chapters.
CONFORMANCE = Path(__file__).resolve().parents[1]


def chapter_files(conformance: Path = CONFORMANCE) -> dict[str, Path]:
    """Chapter name -> its test module, by name: every ``<name>/test_<name>.py`` under ``conformance``."""
    found = sorted(conformance.glob("*/test_*.py"))
    return {path.parent.name: path for path in found if path.stem == f"test_{path.parent.name}"}


#: The chapters: name -> test module (``conformance/<name>/test_<name>.py``), sorted by name.
CHAPTERS: dict[str, Path] = chapter_files()


def chapter_module(name: str) -> str:
    """The dotted module of chapter ``name``'s test module: ``conformance.<name>.test_<name>``."""
    return f"conformance.{name}.test_{name}"
