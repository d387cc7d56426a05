"""The project's import graph, read statically: no circles, and the layers of the architecture hold —
between the packages, and inside the reference backend (floors under wings under the top, see ``Layers``).

Every ``.py`` file of the six packages is parsed (nothing is imported, so a module that needs a GPU or an
optional package is read like any other). An edge is an ``import``/``from ... import`` statement naming a
project module; it points at the longest dotted prefix that is a module of ours (``from conformance.models
import ZOO`` → ``conformance.models``, its ``__init__``). Imports inside functions count: a lazy import only
moves the circle from import time to call time (the half-initialised module is still there, and the two
modules still cannot be understood or reused apart), so they are cycles too, but reported as such.
Imports under ``if TYPE_CHECKING:`` never run; they are left out (they exist for annotations only).

A name passed to ``importlib.import_module`` as a string is not an edge, on purpose: that is how
``harness.bench`` runs the suites in ``conformance.benchmarks`` and how ``harness.backend_loader`` loads
the backend named by ``--backend`` (default ``reference_impl:BACKEND``), without ``harness`` depending on
either at import time.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("conformance", "harness", "reports", "reference_impl", "upstream_executorch", "torch_aoti")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str
    line: int
    #: None at module level (runs on import); else the function whose call runs it.
    function: str | None

    @property
    def lazy(self) -> bool:
        return self.function is not None

    def __str__(self) -> str:
        where = f"inside {self.function}()" if self.lazy else "module level"
        return f"{self.source} -> {self.target}  ({self.path}:{self.line}, {where})"


# ============================================================================================ the graph


def modules(root: Path, packages: Sequence[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under the packages (a package is its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _project_module(name: str, known: Mapping[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is a module of ours (None: not ours)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, function: str | None = None) -> Iterator[tuple[ast.stmt, str | None]]:
    """Every import statement with the function it sits in (None: module or class level), skipping
    ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, function
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), function)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _imports(node, node.name if function is None else f"{function}.{node.name}")
        else:
            yield from _imports(node, function)


def _targets(node: ast.stmt, module: str, is_package: bool) -> Iterator[str]:
    """Absolute dotted names an import statement asks for (``from a import b`` → ``a.b``, which may be a
    submodule or a name in ``a``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    yield from (f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names)


def import_edges(root: Path, packages: Sequence[str] = PACKAGES) -> list[Edge]:
    """Every import of one project module by another (external imports are not edges)."""
    known = modules(root, packages)
    edges: dict[Edge, None] = {}  # one edge per statement and target (``from a import x, y`` is one)
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, function in _imports(tree):
            for name in _targets(node, module, path.name == "__init__.py"):
                target = _project_module(name, known)
                if target is not None and target != module:
                    rel = path.relative_to(root).as_posix()
                    edges[Edge(module, target, rel, node.lineno, function)] = None
    return list(edges)


def external_imports(root: Path, package: str) -> list[tuple[str, str, int]]:
    """(top-level name, file, line) of every import in ``package`` that is not one of ours."""
    found = []
    for module, path in modules(root, (package,)).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, _ in _imports(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            for name in _targets(node, module, path.name == "__init__.py"):
                found.append((name.split(".")[0], path.relative_to(root).as_posix(), node.lineno))
    return found


# ============================================================================================ cycles


def strongly_connected(edges: Iterable[Edge]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module: each holds at least one cycle."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the module count (~150)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def a_cycle(component: Sequence[str], edges: Sequence[Edge]) -> list[Edge]:
    """One concrete circle through the component, as the edges that make it (breadth-first, shortest)."""
    inside = set(component)
    by_source: dict[str, list[Edge]] = {}
    for edge in edges:
        if edge.source in inside and edge.target in inside:
            by_source.setdefault(edge.source, []).append(edge)
    start = component[0]
    paths: dict[str, list[Edge]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in sorted(by_source.get(node, []), key=lambda e: (e.lazy, e.target, e.line)):
                if edge.target == start:
                    return [*paths[node], edge]
                if edge.target not in paths:
                    paths[edge.target] = [*paths[node], edge]
                    following.append(edge.target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # a component always has one


def describe_cycles(edges: Sequence[Edge]) -> list[str]:
    """One paragraph per circle: its modules, then each import that closes it, with file and line."""
    lines = []
    for component in strongly_connected(edges):
        cycle = a_cycle(component, edges)
        lines.append(" -> ".join([*(e.source for e in cycle), cycle[0].source]))
        lines += [f"    {edge}" for edge in cycle]
    return lines


# ============================================================================================ the project

EDGES = import_edges(ROOT)


def test_no_import_cycles_at_module_level() -> None:
    """Module-level imports only: a circle here is an import-order bug waiting (half-initialised module)."""
    found = describe_cycles([e for e in EDGES if not e.lazy])
    assert not found, "import cycles at module level:\n" + "\n".join(found)


def test_no_import_cycles_closed_by_lazy_imports() -> None:
    """All imports, those inside functions too: a lazy import hides a circle from the interpreter, not
    from the design (the edges marked 'inside f()' are the lazy ones)."""
    found = describe_cycles(EDGES)
    assert not found, "import cycles (counting imports inside functions):\n" + "\n".join(found)


def _package(module: str) -> str:
    return module.split(".")[0]


#: (importing package, imported package) pairs the architecture forbids, with why. Data flows one way:
#: backend ← conformance → result JSON → reports; harness measures and records for everyone.
FORBIDDEN: dict[tuple[str, str], str] = {
    ("harness", "conformance"): "harness is the runner; it names bench suites by string (importlib)",
    ("harness", "reference_impl"): "the backend comes from --backend, loaded by string (importlib)",
    ("harness", "upstream_executorch"): "the backend comes from --backend, loaded by string (importlib)",
    ("harness", "reports"): "reports reads what harness writes, never the other way",
    ("reports", "conformance"): "reports renders result files; it never runs or imports the suite",
    ("reports", "reference_impl"): "reports renders result files of any backend",
    ("reports", "upstream_executorch"): "reports renders result files of any backend",
    ("conformance", "reference_impl"): "the suite talks to a backend only through conformance/protocol.py",
    ("conformance", "upstream_executorch"): "the suite talks to a backend only through the protocol",
    ("conformance", "reports"): "the suite writes result files (harness); rendering them is reports' job",
    # A backend is a plug-in: it must run without the suite, and the two backends stand apart.
    ("reference_impl", "conformance"): "a backend never depends on the suite that judges it",
    ("reference_impl", "harness"): "a backend never depends on the suite's runner",
    ("reference_impl", "reports"): "a backend never depends on the report renderer",
    ("reference_impl", "upstream_executorch"): "the two backends stand apart",
    ("upstream_executorch", "conformance"): "a backend never depends on the suite that judges it",
    ("upstream_executorch", "harness"): "a backend never depends on the suite's runner",
    ("upstream_executorch", "reports"): "a backend never depends on the report renderer",
    ("upstream_executorch", "reference_impl"): "the adapter calls upstream unchanged, never our reference",
    ("harness", "torch_aoti"): "the backend comes from --backend, loaded by string (importlib)",
    ("reports", "torch_aoti"): "reports renders result files of any backend",
    ("conformance", "torch_aoti"): "the suite talks to a backend only through the protocol",
    ("torch_aoti", "conformance"): "a backend never depends on the suite that judges it",
    ("torch_aoti", "harness"): "a backend never depends on the suite's runner",
    ("torch_aoti", "reports"): "a backend never depends on the report renderer",
    ("torch_aoti", "reference_impl"): "the adapter calls PyTorch's AOTI unchanged, never our reference",
    ("torch_aoti", "upstream_executorch"): "the adapters stand apart",
    ("upstream_executorch", "torch_aoti"): "the adapters stand apart",
    ("reference_impl", "torch_aoti"): "the backends stand apart",
}

#: Edges that break a rule above on purpose: (source module, target module) → why. Empty today: the
#: default backend is the string "reference_impl:BACKEND" (harness/backend_loader.py), not an import.
LAYERING_EXCEPTIONS: dict[tuple[str, str], str] = {}


def layering_violations(edges: Iterable[Edge]) -> list[str]:
    return [
        f"{edge}: {FORBIDDEN[(_package(edge.source), _package(edge.target))]}"
        for edge in edges
        if (_package(edge.source), _package(edge.target)) in FORBIDDEN
        and (edge.source, edge.target) not in LAYERING_EXCEPTIONS
    ]


def test_layers_hold() -> None:
    found = layering_violations(EDGES)
    assert not found, "imports across a forbidden layer boundary:\n" + "\n".join(found)


def test_layering_exceptions_are_not_stale() -> None:
    used = {(e.source, e.target) for e in EDGES}
    stale = sorted(set(LAYERING_EXCEPTIONS) - used)
    assert not stale, f"exceptions for imports that no longer exist (drop them): {stale}"


def test_reports_never_import_torch() -> None:
    """``nox -s report`` installs jinja2 and matplotlib only: a torch import there breaks the dashboard."""
    found = [f"{path}:{line}" for name, path, line in external_imports(ROOT, "reports") if name == "torch"]
    assert not found, f"reports imports torch: {found}"


def imports_of(root: Path, packages: Sequence[str], top: str) -> list[str]:
    """``file:line`` of every import of top-level package ``top`` from ``packages`` (lazy ones too)."""
    return [
        f"{path}:{line}"
        for package in packages
        for name, path, line in external_imports(root, package)
        if name == top
    ]


def _imports_by_string(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(leading text of the module name, line) of each ``import_module(...)``; an f-string: its first part."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arg = node.args[0]
        if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            arg = arg.values[0]
        if name == "import_module" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            yield arg.value, node.lineno


def test_product_code_never_imports_the_self_tests() -> None:
    """``tests/`` depends on the product, never the reverse: not by an import, not by a name handed to
    ``importlib`` (the rule coverage table once imported ``tests/broken/*.py`` to learn which broken backend
    proves each rule; ``python -m tests.rule_coverage`` now passes the declarations in)."""
    found = imports_of(ROOT, PACKAGES, "tests")
    for path in modules(ROOT).values():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += [
            f"{path.relative_to(ROOT).as_posix()}:{line} import_module({text!r})"
            for text, line in _imports_by_string(tree)
            if text == "tests" or text.startswith("tests.")
        ]
    assert not found, f"product code importing the self-tests: {found}"
    old = "import importlib\nmodule = importlib.import_module(f'tests.{stem}')\n"
    assert [t for t, _ in _imports_by_string(ast.parse(old))] == ["tests."]


def test_harness_loads_suites_and_backends_by_string_only() -> None:
    """The run-time coupling the layers allow is a string for importlib; keep it one. Every suite module
    ``harness.bench`` names exists in ``conformance.benchmarks`` (a typo would skip a suite silently)."""
    from harness.backend_loader import DEFAULT_BACKEND
    from harness.bench import SUITE_MODULES

    known = modules(ROOT)
    assert all(name.startswith("conformance.benchmarks.") for name in SUITE_MODULES.values())
    assert set(SUITE_MODULES.values()) <= set(known), sorted(set(SUITE_MODULES.values()) - set(known))
    assert DEFAULT_BACKEND.split(":")[0] in known


# ============================================================================================ the backend


@dataclass(frozen=True)
class Layers:
    """One package's layers, bottom up. *Floors* hold what more than one wing needs and import no wing;
    *wings* do one job each and import floors, and another wing only where ``wing_arrows`` allows it, with
    the reason; the *top* assembles the wings and imports anything, and nothing below imports it. Floors and
    wings are dotted names of modules or subpackages (a module lies in the one it is or sits under); the top
    is a list of exact module names."""

    floors: tuple[str, ...]
    wings: tuple[str, ...]
    top: tuple[str, ...]
    #: (importing wing, imported wing) → why that arrow is part of the design.
    wing_arrows: Mapping[tuple[str, str], str]

    def place(self, module: str) -> tuple[str, str] | None:
        """(``"floor"`` | ``"wing"`` | ``"top"``, the part) of ``module``; None when it is in none."""
        if module in self.top:
            return "top", module
        for kind, parts in (("floor", self.floors), ("wing", self.wings)):
            for part in parts:
                if module == part or module.startswith(f"{part}."):
                    return kind, part
        return None

    def why_not(self, source: str, target: str) -> str | None:
        """Why an import of module ``target`` by module ``source`` breaks the layers (None: it does not)."""
        placed, wanted = self.place(source), self.place(target)
        if placed is None or wanted is None or placed[1] == wanted[1]:
            return None  # outside the package (other rules judge it), or inside one part
        (kind, part), (target_kind, target_part) = placed, wanted
        if kind == "floor" and target_kind != "floor":
            return f"back up: floor {part} imports {target_kind} {target_part} (a floor imports floors only)"
        if kind == "wing" and target_kind == "top":
            return f"back up: wing {part} imports the top {target_part}, which assembles the wings"
        if kind == "wing" and target_kind == "wing" and (part, target_part) not in self.wing_arrows:
            return (
                f"between wings: {part} imports {target_part}, an arrow the table does not allow "
                "(move what both need down to a floor)"
            )
        return None

    def violations(self, edges: Iterable[Edge]) -> list[str]:
        return [f"{edge}: {why}" for edge in edges if (why := self.why_not(edge.source, edge.target))]


#: The reference backend. Floors: the version stamp, the artifact cache (the lowering's compiles and the
#: native shim's build both keep their products there) and the program format (what the lowering writes and
#: the runtime reads: program, blob, framing, compile spec, placement record, I/O spec, the package's loader
#: and its C++ read as text, errors). Wings: lowering, runtime, shims. Top: the package and ``backend.py``
#: (the protocol object). Every allowed wing arrow is one the scan finds (a stale one fails a test).
BACKEND_LAYERS = Layers(
    floors=("reference_impl._version", "reference_impl.artifact_cache", "reference_impl.format"),
    wings=("reference_impl.lowering", "reference_impl.runtime", "reference_impl.shims"),
    top=("reference_impl", "reference_impl.backend"),
    wing_arrows={
        ("reference_impl.lowering", "reference_impl.shims"): (
            "preprocess routes a CUDA program's mm_out calls to the native shim (shims/native/routing.py), "
            "building the shim to know whether it can"
        ),
        ("reference_impl.runtime", "reference_impl.shims"): (
            "init loads the native shim library a routed program calls (shims/native/library.py)"
        ),
    },
)


def test_the_backend_layers_hold() -> None:
    """No arrow runs back up inside ``reference_impl`` (a floor importing a wing, a wing importing the
    top), and wings meet only where the table says; lazy imports count (they are arrows at call time)."""
    found = BACKEND_LAYERS.violations(EDGES)
    assert not found, "imports against the reference backend's layers:\n" + "\n".join(found)


def test_every_backend_module_has_a_layer() -> None:
    """A new module of the backend is placed on purpose (a floor, a wing or the top), never skipped."""
    unplaced = sorted(m for m in modules(ROOT, ("reference_impl",)) if BACKEND_LAYERS.place(m) is None)
    assert not unplaced, (
        f"modules of reference_impl in no floor, wing or top (add them to BACKEND_LAYERS): {unplaced}"
    )


def test_lowering_and_runtime_never_meet() -> None:
    """They share the program format, a floor; an arrow between them is never allowed, either way."""
    pairs = {
        ("reference_impl.lowering", "reference_impl.runtime"),
        ("reference_impl.runtime", "reference_impl.lowering"),
    }
    assert not pairs & set(BACKEND_LAYERS.wing_arrows)


def test_allowed_wing_arrows_are_not_stale() -> None:
    def part(module: str) -> str | None:
        placed = BACKEND_LAYERS.place(module)
        return None if placed is None else placed[1]

    used = {(part(e.source), part(e.target)) for e in EDGES}
    stale = sorted(set(BACKEND_LAYERS.wing_arrows) - used)
    assert not stale, f"allowed wing arrows that no import uses any more (drop them): {stale}"


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
    edge = Edge("reports.page", "conformance.checks", "reports/page.py", 3, None)
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
    assert ("conformance.checks", "conformance.tolerances", False) in found
    assert ("conformance.models.zoo", "conformance.models.hf_llm", True) in found
    assert ("reports.page_run", "harness.results", False) in found
    assert len({e.source for e in EDGES}) > 50


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_scanned(package: str) -> None:
    assert any(name.startswith(package) for name in modules(ROOT))
