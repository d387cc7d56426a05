"""Broken view passes that rewrite the right copies into the wrong views: the reference's pass decides
what to rewrite, then a slip in how the view call is built changes what it reads. Both are CPU-only
(the lowering chapter's view-pass cases run anywhere); ``tests/test_broken_chapter_backends.py`` runs them.
"""

from __future__ import annotations

import copy

import torch
from torch.fx import GraphModule, Node

from conformance.rule_coverage import Breaks
from reference_impl import BACKEND as REFERENCE
from tests.broken_backends import LOWERING, NaiveViewPassOutcome, _Wrapped

aten = torch.ops.aten


class _RebuildsViews(_Wrapped):
    """The reference's verdicts; each rewritten view node then goes through :meth:`rebuild`."""

    lowering_devices = REFERENCE.lowering_devices

    def rebuild(self, node: Node) -> None:
        raise NotImplementedError

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        outcome = REFERENCE.view_copy_pass(copy.deepcopy(graph_module))
        module = outcome.graph_module
        nodes = {n.name: n for n in module.graph.nodes}
        for name in outcome.rewritten:
            self.rebuild(nodes[name])
        module.recompile()
        return NaiveViewPassOutcome(module, list(outcome.rewritten), dict(outcome.refused))


class DropsTheSliceStep(_RebuildsViews):
    """Builds each view from the op's leading positional arguments and forgets ``slice``'s optional
    ``step``: ``slice_copy(x, 1, 1, 5, 2)`` becomes ``slice(x, 1, 1, 5)``, every element instead of every
    other (breaks ``view-pass/every-view-twin``: the view twin must read what the copy read)."""

    def rebuild(self, node: Node) -> None:
        if node.target == aten.slice.Tensor and len(node.args) > 4:
            node.args = node.args[:4]


class WritesToTheEndAsMinusOne(_RebuildsViews):
    """Writes a slice's "to the end" bound (``end = 2**63 - 1``, what export records for ``x[..., 2:]``) as
    ``-1``, the way a hand-written serializer spells "the last one": the view stops one element short.
    Invisible in the single-copy case (a bounded slice), wrong in the KV-cache graph, which splits the
    rotary halves with open-ended slices (breaks ``view-pass/slicing-heavy``)."""

    def rebuild(self, node: Node) -> None:
        if node.target == aten.slice.Tensor and len(node.args) > 3 and node.args[3] == 2**63 - 1:
            node.args = (*node.args[:3], -1, *node.args[4:])


DROPS_THE_SLICE_STEP = DropsTheSliceStep(
    "drops-the-slice-step",
    Breaks(
        ("view-pass/every-view-twin",),
        LOWERING,
        ("-k", "view_pass_keeps_observable_behaviour and every-view-twin/slice_copy"),
    ),
)
WRITES_TO_THE_END_AS_MINUS_ONE = WritesToTheEndAsMinusOne(
    "writes-to-the-end-as-minus-one",
    Breaks(("view-pass/slicing-heavy",), LOWERING, ("-k", "view_pass_slicing_heavy_kv_cache")),
)
