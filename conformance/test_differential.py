"""Chapter differential — generated calls, judged by oracles instead of hand-picked examples (SPEC §1-§2).

Every other chapter checks one hand-picked shape of each rule. This one draws its inputs with Hypothesis
(``conformance/generation.py`` keeps a CI run deterministic and bounded) and judges every observable the
spec determines by an oracle: float64 eager PyTorch for values, the reference backend (run in a process of
its own, through the same protocol) for which calls are errors, and the spec itself for what a call may
change. A failing example is shrunk to the shortest sequence of calls that shows it.

Sections, each its own protocol part (a backend lacking one is skipped there, never failed):

* **view pass** (part ``view_pass``): generated edge graphs of ``*_copy`` ops, writes and outputs.
* **runtime** (parts ``lowering`` + ``runtime``): a state machine drives sequences of protocol calls.

Rules read ``differential/<rule>``; the differences the spec allows are listed once, in
``conformance/oracle.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from conformance import differential_view_pass as view_pass_checks
from conformance.conftest import require_part
from conformance.generation import budget
from conformance.graph_strategies import GeneratedGraph, graphs
from conformance.protocol import Backend

# ================================================================================================ view pass
# Generated edge graphs through the backend's view_copy_pass (conformance/differential_view_pass.py says
# what each rule holds and why). Examples per case: a slip in behaviour or meta shows only in graphs with a
# particular op, argument and reader, so those two get the most (tests/test_differential_view_pass.py
# holds the catch list to them); the report and the recompile show on any graph the pass rewrites.

VIEW_PASS_EXAMPLES = {"behaviour": 100, "meta": 80, "recompiled": 20, "report": 30}


@pytest.fixture
def view_pass(backend: Backend) -> Backend:
    require_part(backend, "view_pass")
    return backend


@budget(VIEW_PASS_EXAMPLES["behaviour"])
@given(graph=graphs())
def test_view_pass_generated_keeps_behaviour(view_pass: Backend, graph: GeneratedGraph) -> None:
    """differential/view-pass-behaviour: on fresh inputs laid out as generated, the result gives bit for bit
    the graph's outputs and the inputs' final values, and no output shares memory it did not share."""
    view_pass_checks.check_behaviour(view_pass, graph)


@budget(VIEW_PASS_EXAMPLES["meta"])
@given(graph=graphs())
def test_view_pass_generated_meta_is_truthful(view_pass: Backend, graph: GeneratedGraph) -> None:
    """differential/view-pass-meta: every node that became a view, and every node downstream of one, has
    the dtype, shape, strides and storage offset in ``meta["val"]`` that a real run gives it."""
    view_pass_checks.check_meta(view_pass, graph)


@budget(VIEW_PASS_EXAMPLES["recompiled"])
@given(graph=graphs())
def test_view_pass_generated_code_is_the_graphs(view_pass: Backend, graph: GeneratedGraph) -> None:
    """differential/view-pass-recompiled: the returned module runs the code of its own graph."""
    view_pass_checks.check_recompiled(view_pass, graph)


@budget(VIEW_PASS_EXAMPLES["report"])
@given(graph=graphs())
def test_view_pass_generated_report_describes_the_result(view_pass: Backend, graph: GeneratedGraph) -> None:
    """differential/view-pass-report, view-pass/report (*should*): no node both rewritten and refused, only
    nodes the result has, and ``rewritten`` is exactly the copies that are views in the result."""
    view_pass_checks.check_report(view_pass, graph)
