"""The view-pass section of the differential chapter: the backend's pass on generated graphs (SPEC §1a).

Each graph comes from ``conformance/differential/graph_strategies.py``; nothing says which copies should
become views. The pass is judged only by what can be told from outside, so a pass that refuses more than ours
(or maps fewer ops) passes every rule here, and a missed rewrite is never reported:

* ``differential/view-pass-behaviour`` (*must*): the result behaves as the graph did (values, the inputs'
  final values, which outputs share memory with an input or each other: ``view_pass_checks.differences``).
* ``differential/view-pass-meta`` (*must*): ``meta["val"]`` is truthful (dtype, shape, strides, storage
  offset) for every node that became a view **and every node downstream of one**: a pointwise op on a
  transposed view takes its strides, and later passes and the compiler trust them all.
* ``differential/view-pass-recompiled`` (*must*): the module's code is its graph's code. A pass that edits
  the graph without ``recompile()`` hands the compiler one program and ``module(...)`` another, so every
  other check here would judge a program nobody compiles.
* ``lowering/report`` (*should*, as in the lowering chapter): ``rewritten`` lists exactly the copies that
  are views in the result. ``differential/view-pass-report`` (*should*): the report does not contradict
  itself (no node both rewritten and refused) and names only nodes the result has.
* ``lowering/outcome`` (*must*, as in the lowering chapter): the pass returns the protocol's outcome (and
  does not raise on a valid edge graph).

Every failure message ends with the (shrunk) graph as a repro: its inputs' layouts, its code and the Python
line that rebuilds it. No backend is imported here.
"""

from __future__ import annotations

import copy
from typing import Any, NoReturn

from conformance.common.checks import fail
from conformance.common.rules import rule_id
from conformance.common.view_pass_checks import (
    differences,
    downstream,
    meta_mismatches,
    observe,
    outcome_problem,
    report_contradictions,
    report_mismatches,
    stale_code,
    unknowable_meta,
    views_in_result,
)
from conformance.differential.graph_strategies import GeneratedGraph
from conformance.protocol import ViewPassBackend

CALL = "view_copy_pass(generated graph)"

# The rules this module checks (conformance/catalogue/rule_table.py).
OUTCOME = rule_id("lowering/outcome")
BEHAVIOUR = rule_id("differential/view-pass-behaviour")
META = rule_id("differential/view-pass-meta")
RECOMPILED = rule_id("differential/view-pass-recompiled")
REPORT_CONTRADICTIONS = rule_id("differential/view-pass-report")
REPORT = rule_id("lowering/report")

#: How many findings a message lists before the repro (the shrunk graph usually has one).
_SHOWN = 4


def _fail(rule: str, graph: GeneratedGraph, findings: list[str]) -> NoReturn:
    shown = "; ".join(findings[:_SHOWN]) + (
        f"; and {len(findings) - _SHOWN} more" if len(findings) > _SHOWN else ""
    )
    fail(rule, CALL, f"{shown}\n{graph.repro()}")
    raise AssertionError  # unreachable: fail raises


#: The last pass run: (backend, graph, outcome). Checks of one graph share it (the self-tests run every
#: check on each graph); held by identity, so a new graph or backend always runs the pass again.
_last: tuple[object, GeneratedGraph, Any] | None = None


def run(backend: ViewPassBackend, graph: GeneratedGraph) -> Any:
    """The backend's pass on a deep copy of ``graph``'s module; ``lowering/outcome`` if it raises or
    returns something other than the protocol's outcome."""
    global _last
    if _last is not None and _last[0] is backend and _last[1] is graph:
        return _last[2]
    try:
        outcome = backend.view_copy_pass(copy.deepcopy(graph.module))
    except Exception as exc:  # a valid edge graph must never make the pass fail
        _fail(OUTCOME, graph, [f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}"])
    problem = outcome_problem(outcome)
    if problem is not None:
        _fail(OUTCOME, graph, [problem])
    _last = (backend, graph, outcome)
    return outcome


def check_behaviour(backend: ViewPassBackend, graph: GeneratedGraph) -> None:
    """``differential/view-pass-behaviour``: a caller cannot tell the result from the graph."""
    result = run(backend, graph).graph_module
    found = differences(observe(graph.module, graph.inputs), observe(result, graph.inputs))
    if found:
        views = ", ".join(sorted(views_in_result(graph.module, result))) or "none"
        _fail(BEHAVIOUR, graph, [f"copies now views: {views}", *found])


def check_meta(backend: ViewPassBackend, graph: GeneratedGraph) -> None:
    """``differential/view-pass-meta``: every node that became a view, and every node downstream of one,
    has the dtype, shape, strides and storage offset in ``meta["val"]`` that a real run gives it. Nodes
    torch's own fake propagation gets wrong are not judged (``view_pass_checks.unknowable_meta``)."""
    result = run(backend, graph).graph_module
    views = views_in_result(graph.module, result)
    if not views:
        return
    names = downstream(result, views)
    try:
        mismatched = meta_mismatches(result, graph.inputs, names)
    except Exception:  # the result does not run: differential/view-pass-behaviour says so, with what differs
        return
    if mismatched:
        found = meta_mismatches(result, graph.inputs, names - unknowable_meta(result, graph.inputs, names))
        if found:
            _fail(META, graph, [f"views: {', '.join(sorted(views))}", *found])


def check_recompiled(backend: ViewPassBackend, graph: GeneratedGraph) -> None:
    """``differential/view-pass-recompiled``: ``graph_module.code`` is what its graph generates."""
    stale = stale_code(run(backend, graph).graph_module)
    if stale is not None:
        _fail(
            RECOMPILED,
            graph,
            [f"the module runs code its graph no longer has (recompile() after editing the graph): {stale}"],
        )


def check_report(backend: ViewPassBackend, graph: GeneratedGraph) -> None:
    """``differential/view-pass-report`` then ``lowering/report`` (both *should*): the report contradicts
    nothing, names only nodes the result has, and lists as rewritten exactly the copies now views."""
    outcome = run(backend, graph)
    contradictions = report_contradictions(outcome)
    if contradictions:
        _fail(REPORT_CONTRADICTIONS, graph, contradictions)
    mismatches = report_mismatches(graph.module, outcome.graph_module, outcome.rewritten)
    if mismatches:
        _fail(REPORT, graph, mismatches)
