"""The static import scanner of the import-graph tests (test_import_graph, test_import_graph_guard): every
``.py`` file of the packages parsed, never imported; the edges between project modules, module-level or
lazy; the cycles among them; the imports of other top-level packages and the names handed to
``importlib``. See test_import_graph.py for what counts as an edge and why."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "conformance", "harness", "reports", "reference_impl", "upstream_executorch", "torch_aoti", "settings",
    "runner",
)  # fmt: skip


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str
    line: int
    #: None at module level (runs on import); else the function whose call runs it.
    function: str | None
    #: A process the source starts (``[python, "-m", "conformance.suite.prelower", ...]``), not an import: the
    #: dependency is as real, only the import statement is missing (the front door runs without torch).
    process: bool = False

    @property
    def lazy(self) -> bool:
        return self.function is not None or self.process

    def __str__(self) -> str:
        where = f"inside {self.function}()" if self.function is not None else "module level"
        where = f"a process started {where}" if self.process else where
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


def _started_modules(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(module, line) of every ``"-m", "<module>"`` pair in a list or tuple literal: a command line."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
            for flag, name in itertools.pairwise(items):
                if (
                    isinstance(flag, ast.Constant) and flag.value == "-m"
                    and isinstance(name, ast.Constant) and isinstance(name.value, str)
                ):  # fmt: skip
                    yield name.value, name.lineno


def import_edges(root: Path, packages: Sequence[str] = PACKAGES) -> list[Edge]:
    """Every import of one project module by another (external imports are not edges), and every process
    one starts by ``-m`` of another (``Edge.process``)."""
    known = modules(root, packages)
    edges: dict[Edge, None] = {}  # one edge per statement and target (``from a import x, y`` is one)
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = path.relative_to(root).as_posix()
        for node, function in _imports(tree):
            for name in _targets(node, module, path.name == "__init__.py"):
                target = _project_module(name, known)
                if target is not None and target != module:
                    edges[Edge(module, target, rel, node.lineno, function)] = None
        for name, line in _started_modules(tree):
            target = _project_module(name, known)
            if target is not None and target != module:
                edges[Edge(module, target, rel, line, None, process=True)] = None
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
