"""The broken backends' declarations (which rules each must make its chapter fail), found in
``tests/broken/*.py``, and the rule coverage table with them: ``python -m tests.rule_coverage [--json]
[--cases]`` (``nox -s conformance`` writes ``results/rule-coverage.json`` with it, for the dashboard).

The declarations live here, beside the self-tests that prove them
(``tests/conformance/test_broken_chapter_backends.py`` runs each broken backend through its chapter), because
product code never imports ``tests/``: the table (``conformance.suite.rule_coverage``) takes them as
:class:`conformance.suite.rule_coverage.Proof` rows.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conformance.suite import rule_coverage

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Breaks:
    """What a broken backend breaks, declared on it as ``breaks``: running ``chapter`` with ``select``
    (pytest arguments) against it must fail, every failure naming one of ``rules`` and every rule named at
    least once. ``cuda``: the failing cases need a CUDA device (elsewhere they skip). ``strict_should``:
    the rules are *should* (pass ``--strict-should`` so they fail the run). ``proven_by``: an existing
    self-test (``tests/x.py::test``) that proves the claim in its own way instead of the generic runner.
    ``alone``: the failing cases judge device-wide counters (NVML), so they run with the GPU to themselves,
    never beside other chapter runs (``.ci/gpu/followup.sh``). ``gpus``: how many CUDA devices the
    failing cases need (2 for the cross-device rules; with fewer they skip)."""

    rules: tuple[str, ...]
    chapter: str
    select: tuple[str, ...] = ()
    cuda: bool = False
    strict_should: bool = False
    proven_by: str | None = None
    alone: bool = False
    gpus: int = 1


@dataclass(frozen=True)
class BrokenBackend:
    spec: str
    """``module:attr``, as ``--backend`` takes it."""
    breaks: Breaks

    def proof(self) -> rule_coverage.Proof:
        return rule_coverage.Proof(self.spec, self.breaks.rules, self.breaks.cuda)


def broken_backends(root: Path = ROOT) -> list[BrokenBackend]:
    """Every object with a ``breaks`` declaration in ``tests/broken/*.py``, by ``--backend`` spec."""
    found: list[BrokenBackend] = []
    for path in sorted((root / "tests" / "broken").glob("[!_]*.py")):
        module = importlib.import_module(f"tests.broken.{path.stem}")
        for name, value in vars(module).items():
            declared = getattr(value, "breaks", None) if not isinstance(value, type) else None
            if isinstance(declared, Breaks):
                found.append(BrokenBackend(f"{module.__name__}:{name}", declared))
    return found


def proofs() -> list[rule_coverage.Proof]:
    """What the coverage table's "broken backends" column is made of."""
    return [broken.proof() for broken in broken_backends()]


def main(argv: Sequence[str] | None = None) -> int:
    return rule_coverage.main(argv, proofs=proofs(), prog="python -m tests.rule_coverage")


if __name__ == "__main__":
    # Run the imported module's main: the broken backends' ``Breaks`` come from ``tests.rule_coverage``,
    # which under ``python -m`` is a different module object from this ``__main__``.
    from tests.rule_coverage import main as _main

    sys.exit(_main())
