"""Guard the guard: the import scanner (tests/project/import_scan.py) and the rules of test_import_graph.py
on synthetic packages written to a temporary folder, and the project's own scan seeing what it must."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.project.import_scan import (
    PACKAGES,
    ROOT,
    Edge,
    describe_cycles,
    import_edges,
    imports_of,
    modules,
)
from tests.project.test_import_graph import BACKEND_LAYERS, EDGES, Layers, layering_violations

# ============================================================================================ the guard


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_scanner_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Guard the guard: absolute, relative, package and submodule targets; lazy and nested imports; and
    what is no edge (TYPE_CHECKING blocks, strings for importlib, imports of other projects)."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "import os\nfrom . import b\nA = 1\n",
            "pkg/b.py": """
                from typing import TYPE_CHECKING
                import importlib
                if TYPE_CHECKING:
                    from pkg import c
                def f():
                    from .sub.d import D
                    importlib.import_module("pkg.c")
                class K:
                    def g(self):
                        import pkg.c
            """,
            "pkg/c.py": "from pkg import A\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/d.py": "from ..a import A\nD = A\n",
        },
    )
    found = {(e.source, e.target, e.function) for e in import_edges(tmp_path, ("pkg",))}
    assert found == {
        ("pkg", "pkg.a", None),
        ("pkg.a", "pkg.b", None),
        ("pkg.b", "pkg.sub.d", "f"),
        ("pkg.b", "pkg.c", "g"),
        ("pkg.c", "pkg", None),
        ("pkg.sub.d", "pkg.a", None),
    }


def test_cycles_are_found_and_printed_with_their_kind(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/x.py": "from p import y\n",
            "p/y.py": "def f():\n    from p import x\n",
            "p/z.py": "from p import x\n",
        },
    )
    edges = import_edges(tmp_path, ("p",))
    assert describe_cycles([e for e in edges if not e.lazy]) == []
    assert describe_cycles(edges) == [
        "p.x -> p.y -> p.x",
        "    p.x -> p.y  (p/x.py:1, module level)",
        "    p.y -> p.x  (p/y.py:2, inside f())",
    ]


def test_layering_catches_a_forbidden_import() -> None:
    edge = Edge("reports.page", "conformance.common.checks", "reports/page.py", 3, None)
    assert layering_violations([edge]) == [
        f"{edge}: reports renders result files; it never runs or imports the suite"
    ]
    assert layering_violations([Edge("conformance.x", "harness.results", "conformance/x.py", 1, None)]) == []


def test_backend_layers_catch_planted_back_arrows(tmp_path: Path) -> None:
    """Guard the guard: a synthetic backend with one floor, three wings and a top, and four planted arrows
    (floor → wing, lazy; wing → wing not in the table; wing → top; and an allowed wing arrow, not flagged)."""
    _write(
        tmp_path,
        {
            "be/__init__.py": "from be.backend import B\n",
            "be/backend.py": "from be.low import lower\nfrom be.run import run\nB = (lower, run)\n",
            "be/fmt/__init__.py": "",
            "be/fmt/blob.py": "import json\ndef pack():\n    from be.low import lower\n",
            "be/low/__init__.py": "from be.fmt.blob import pack\nfrom be.sh import mm\ndef lower(): ...\n",
            "be/run/__init__.py": "from be.fmt import blob\nfrom be.low import lower\ndef run(): ...\n",
            "be/sh/__init__.py": "def mm(): ...\n",
            "be/sh/route.py": "import be\n",
        },
    )
    layers = Layers(
        floors=("be.fmt",),
        wings=("be.low", "be.run", "be.sh"),
        top=("be", "be.backend"),
        wing_arrows={("be.low", "be.sh"): "lowering routes to the shim"},
    )
    edges = import_edges(tmp_path, ("be",))
    assert [v.split(": ", 1)[1] for v in layers.violations(edges)] == [
        "back up: floor be.fmt imports wing be.low (a floor imports floors only)",
        "between wings: be.run imports be.low, an arrow the table does not allow "
        "(move what both need down to a floor)",
        "back up: wing be.sh imports the top be, which assembles the wings",
    ]
    assert layers.violations(edges)[0].startswith("be.fmt.blob -> be.low  (be/fmt/blob.py:3, inside pack())")
    allowed_too = Layers(
        layers.floors, layers.wings, layers.top, {**layers.wing_arrows, ("be.run", "be.low"): "x"}
    )
    assert len(allowed_too.violations(edges)) == 2
    assert layers.place("be.fmt.blob") == ("floor", "be.fmt")
    assert layers.place("be") == ("top", "be")
    assert layers.place("bex.low") is None
    # The project's table: the arrows the floors removed, planted back, are flagged; an allowed one is not.
    planted = [
        ("reference_impl.lowering.preprocess", "reference_impl.runtime.iospec"),
        ("reference_impl.runtime.delegate", "reference_impl.lowering.program"),
        ("reference_impl.shims.native.routing", "reference_impl.lowering.fallback_kernels"),
        ("reference_impl.format.blob", "reference_impl.lowering.preprocess"),
        ("reference_impl.artifact_cache", "reference_impl.backend"),
    ]
    assert all(BACKEND_LAYERS.why_not(source, target) for source, target in planted)
    assert (
        BACKEND_LAYERS.why_not("reference_impl.lowering.preprocess", "reference_impl.shims.native.routing")
        is None
    )


def test_imports_of_tests_are_found(tmp_path: Path) -> None:
    """Module-level and lazy imports of ``tests`` are found; an importlib string and a look-alike are not."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import os\nfrom tests.helpers import x\n",
            "pkg/b.py": "def f():\n    import tests\n",
            "pkg/c.py": "import importlib\nimport testsuite\nimportlib.import_module('tests.x')\n",
        },
    )
    assert imports_of(tmp_path, ("pkg",), "tests") == ["pkg/a.py:2", "pkg/b.py:2"]


def test_the_project_scan_sees_what_it_must() -> None:
    """Known edges of this project, one of each kind, so an empty scan cannot pass the tests above."""
    found = {(e.source, e.target, e.lazy) for e in EDGES}
    assert ("conformance.common.checks", "conformance.common.tolerances", False) in found
    assert ("conformance.models.zoo", "conformance.models.hf_llm", True) in found
    assert ("reports.page_run", "harness.results", False) in found
    assert len({e.source for e in EDGES}) > 50


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_scanned(package: str) -> None:
    assert any(name.startswith(package) for name in modules(ROOT))
