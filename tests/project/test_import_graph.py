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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tests.project.import_scan import (
    PACKAGES,
    ROOT,
    Edge,
    _imports_by_string,
    describe_cycles,
    external_imports,
    import_edges,
    imports_of,
    modules,
)

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
    # The runner drives a run: it may start the suite and the renderer; nothing the cases or reports use
    # depends on it (harness keeps only what cases and reports import).
    ("harness", "runner"): "harness is the library cases and reports use; the runner drives a run",
    ("conformance", "runner"): "the suite is driven by the runner, never the other way",
    ("reports", "runner"): "reports renders result files, whoever ran them",
    ("reference_impl", "runner"): "a backend never depends on the suite's runner",
    ("upstream_executorch", "runner"): "a backend never depends on the suite's runner",
    ("torch_aoti", "runner"): "a backend never depends on the suite's runner",
    # The settings table is the floor every package may stand on: it stands on nothing of ours.
    **{("settings", p): "settings is standard library only" for p in PACKAGES if p != "settings"},
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


# ============================================================================================ the suite

#: conformance/'s parts and what each may import, bottom up (README "Adding a chapter"). Floors: the
#: plug-in protocol (``protocol.py``), the catalogue (chapters, rules, the contract's sentences) and the zoo
#: (``models/``). ``common/``: the checks and helpers chapters share. ``suite/``: the plumbing no chapter
#: imports. ``conftest.py``: pytest's root plugin, for every chapter. ``benchmarks/``: the bench suites.
#: A chapter (a folder of ``CHAPTERS``) imports the floors, ``common/`` and ``conftest.py``, and modules of
#: its own folder; never another chapter's, and nothing imports a chapter.
SUITE_ARROWS: dict[str, set[str]] = {
    "floor": {"floor"},
    "common": {"floor", "common"},
    "suite": {"floor", "common", "suite"},
    "conftest": {"floor", "common", "suite"},
    "benchmarks": {"floor", "common", "benchmarks"},
    "chapter": {"floor", "common", "conftest"},
}
_FLOORS = ("conformance", "conformance.protocol", "conformance.catalogue", "conformance.models")


def suite_part(module: str) -> str | None:
    """The part of conformance/ ``module`` lies in (``chapter:<name>`` for a chapter's folder); None: no part
    (a module loose at the top of conformance/) or not the suite's."""
    from conformance.catalogue.chapters import CHAPTERS

    names = module.split(".")
    if names[0] != "conformance":
        return None
    if module in _FLOORS or any(module.startswith(f"{floor}.") for floor in _FLOORS[1:]):
        return "floor"
    if names[1] in CHAPTERS:
        return f"chapter:{names[1]}"
    if names[1] in ("common", "suite", "benchmarks", "conftest"):
        return names[1]
    return None


def test_every_suite_module_has_its_part() -> None:
    """A module of conformance/ sits in a chapter's folder, ``common/``, ``suite/`` or a floor: none loose."""
    loose = sorted(m for m in modules(ROOT, ("conformance",)) if suite_part(m) is None)
    assert not loose, f"modules of conformance/ in no part (a chapter's folder, common/, suite/): {loose}"


def test_the_suites_parts_import_downwards_only() -> None:
    """No arrow back up between the suite's parts (lazy imports count), and no chapter imports another."""
    found = []
    for edge in EDGES:
        source, target = suite_part(edge.source), suite_part(edge.target)
        if source is None or target is None or source == target:
            continue
        kind, want = source.partition(":")[0], target.partition(":")[0]
        if want not in SUITE_ARROWS[kind]:
            found.append(f"{edge}: {source} may import {sorted(SUITE_ARROWS[kind])}, not {target}")
    assert not found, "imports against the suite's parts:\n" + "\n".join(found)
